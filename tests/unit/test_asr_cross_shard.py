"""ASR manifests over shards that name their utterances alike (every Granary shard starts at ``utt_000000``):
an utterance is ``(shard_id, utt_id)``, and nothing vanishes or is corrected by another shard's id."""

import polars as pl
import pytest

from speechdata.asr.manifest import AsrManifestConfig, apply_language_corrections, build_asr_manifest


def reused_ids(shards=("granary-a", "granary-b", "granary-c"), per_shard=6):
    rows, flac = [], []
    for s, shard in enumerate(shards):
        for i in range(per_shard):
            utt = f"utt_{i:06d}"
            rows.append({"shard_id": shard, "utt_id": utt, "text": f"shard {s} sentence {i}", "language": "de"})
            flac.append(
                {
                    "shard_id": shard,
                    "utt_id": utt,
                    "flac_path": f"asr/flac/{shard}/{utt}.flac",
                    "duration_s": 2.0 + i,
                    "audio_sha1": f"sha-{shard}-{utt}",
                }
            )
    return pl.DataFrame(rows), pl.DataFrame(flac)


def test_every_shard_s_utterance_is_in_exactly_one_output_when_shards_reuse_ids():
    utterances, flac = reused_ids()
    build = build_asr_manifest(utterances, flac, audio_root="/data", config=AsrManifestConfig(min_quality=None))
    out = [
        (shard, utt)
        for table in (build.train, build.validation, build.removed)
        for shard, utt in table.select("shard_id", "utt_id").iter_rows()
    ]
    assert sorted(out) == sorted(utterances.select("shard_id", "utt_id").iter_rows())
    kept = pl.concat([build.train, build.validation])
    assert kept["audio_filepath"].n_unique() == kept.height
    shards = ["granary-a", "granary-b", "granary-c"]
    for row in kept.iter_rows(named=True):  # each row carries its own shard's transcript
        assert row["text"].endswith(f"shard {shards.index(row['shard_id'])} sentence {int(row['utt_id'][-6:])}")


def test_a_correction_by_utt_id_alone_that_several_shards_hold_is_refused():
    utterances, _ = reused_ids()
    corrections = pl.DataFrame({"utt_id": ["utt_000003"], "language": ["nl"]})
    with pytest.raises(ValueError, match=r"utt_000003 \(shards granary-a, granary-b, granary-c\).*add a shard_id"):
        apply_language_corrections(utterances, corrections)


def test_a_correction_by_shard_and_utt_id_changes_only_that_shard_s_utterance():
    utterances, _ = reused_ids()
    corrections = pl.DataFrame({"shard_id": ["granary-b"], "utt_id": ["utt_000003"], "language": ["nl"]})
    corrected = apply_language_corrections(utterances, corrections)
    changed = corrected.filter(pl.col("language") != pl.col("original_language"))
    assert changed.select("shard_id", "utt_id").rows() == [("granary-b", "utt_000003")]
