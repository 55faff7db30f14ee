"""The ASR manifests built shard by shard equal the corpus-wide build after every added shard, a new
shard reads and rewrites only itself (and the shards it shares a duplicate with), existing
utterances never change split, and a build killed part-way re-runs to the same bytes."""

import hashlib
import random

import polars as pl
import pyarrow as pa
import pytest
from polars.testing import assert_frame_equal

import speechdata.asr.incremental as incremental
from speechdata.asr.manifest import AsrManifestConfig, build_asr_manifest
from speechdata.asr.stage import MANIFEST_TO_ROOT, build_and_write_asr_manifests, read_asr_inputs, read_published_build
from speechdata.io import layout
from speechdata.io.storage import DataRoot

CONFIG = AsrManifestConfig(validation_share=0.3, eval_per_language=2)
LANGUAGES = ("hi", "ta", "en")


def shard_rows(
    shard_id: str, seed: int, n: int = 24, shared: list[dict] | None = None, shared_recording: bool = True
) -> list[dict]:
    """Utterances of one shard: three languages, recordings of a few utterances (some named across
    shards), a few empty or too short, repeated text in a recording, and ``shared`` rows appended."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        recording = f"rec-{seed}-{i // 4}" if i % 7 or not shared_recording else "rec-shared"
        text = rng.choice(["", "  ", "ठीक है", "[noise]", f"sentence {i} of {shard_id}", "the same words"])
        duration = rng.choice([0.2, 1.0, 2.5, 3.0, 7.5, 25.0])
        rows.append(
            {
                "utt_id": f"u{i:03d}",
                "text": text,
                "language": rng.choice(LANGUAGES),
                "recording_id": recording,
                "duration_s": duration,
                "audio_sha1": hashlib.sha1(f"{shard_id}/{i}".encode()).hexdigest(),
            }
        )
    return rows + (shared or [])


def write_shard(data_root: DataRoot, shard_id: str, rows: list[dict]) -> None:
    utterances = pa.Table.from_pylist(
        [
            {
                "utt_id": r["utt_id"],
                "text": r["text"],
                "language": r["language"],
                "source": "test",
                "recording_id": r["recording_id"],
                "tx_quality_score": 0.9,
            }
            for r in rows
        ]
    )
    flac = pa.Table.from_pylist(
        [
            {
                "utt_id": r["utt_id"],
                "flac_path": f"{layout.asr_flac_dir(shard_id)}/{r['utt_id']}-{(r['audio_sha1'] or 'none')[:16]}.flac",
                "duration_s": r["duration_s"],
                "audio_sha1": r["audio_sha1"],
            }
            for r in rows
        ]
    )
    data_root.write_parquet(layout.utterance_index(shard_id), utterances)
    data_root.write_parquet(layout.asr_flac_index(shard_id), flac)


def corpus_wide(data_root: DataRoot):
    shards = sorted(p.split("/")[-2] for p in data_root.glob(layout.asr_flac_index("*")))
    utterances, flac = read_asr_inputs(data_root, shards)
    return build_asr_manifest(utterances, flac, audio_root=MANIFEST_TO_ROOT, config=CONFIG)


def assert_equals_corpus_wide(data_root: DataRoot) -> None:
    expected, published = corpus_wide(data_root), read_published_build(data_root)
    for split in ("train", "validation", "eval", "removed"):
        assert_frame_equal(getattr(published, split), getattr(expected, split), check_dtypes=False)


def tree(data_root: DataRoot, under: str = layout.ASR) -> dict[str, tuple]:
    out = {}
    for path in data_root.fs.find(data_root.path(under)):
        info = data_root.fs.info(path)
        out[path[len(data_root.root) + 1 :]] = (info["mtime"], info.get("ino"), data_root.fs.cat_file(path))
    return out


# A row of s2 that s0 (landing later, but first in key order) repeats: the same audio.
DUPLICATED = next(r for r in shard_rows("s2", 2) if r["text"].startswith("sentence") and 0.5 <= r["duration_s"] <= 20)


def test_every_added_shard_gives_the_corpus_wide_build(tmp_path):
    data_root = DataRoot(str(tmp_path / "root"))
    order = ["s2", "s4", "s1", "s3", "s0"]  # s1 and s0 land after shards that follow them in key order
    for number, shard_id in enumerate(order):
        shared = [{**DUPLICATED, "utt_id": "dup", "recording_id": "elsewhere"}] if shard_id == "s0" else None
        write_shard(data_root, shard_id, shard_rows(shard_id, int(shard_id[1]), shared=shared))
        summary = build_and_write_asr_manifests(data_root, CONFIG)
        assert summary.shards_changed == [shard_id] and summary.shards == number + 1
        assert_equals_corpus_wide(data_root)
    assert "s2" in summary.shards_rewritten  # its row became a duplicate of s0's
    removed = read_published_build(data_root).removed.filter(pl.col("shard_id") == "s2")
    assert removed.filter(pl.col("utt_id") == DUPLICATED["utt_id"])["detail"].to_list() == ["same audio as s0/dup"]

    # The same shards built at once, on a fresh root: the same bytes.
    fresh = DataRoot(str(tmp_path / "fresh"))
    for shard_id in order:
        fresh.write_bytes(
            layout.utterance_index(shard_id), data_root.fs.cat_file(data_root.path(layout.utterance_index(shard_id)))
        )
        fresh.write_bytes(
            layout.asr_flac_index(shard_id), data_root.fs.cat_file(data_root.path(layout.asr_flac_index(shard_id)))
        )
    build_and_write_asr_manifests(fresh, CONFIG)
    assert {k: v[2] for k, v in tree(fresh).items()} == {k: v[2] for k, v in tree(data_root).items()}


def test_a_new_shard_reads_gates_and_writes_only_itself(tmp_path, monkeypatch):
    data_root = DataRoot(str(tmp_path / "root"))
    for seed, shard_id in enumerate(("s1", "s2", "s3")):
        write_shard(data_root, shard_id, shard_rows(shard_id, seed))
    build_and_write_asr_manifests(data_root, CONFIG)
    parts_before = tree(data_root, f"{layout.ASR}/manifests/parts")
    prepared_before = tree(data_root, f"{layout.ASR}/prepared")

    # Nothing changed: nothing read but the state, nothing written.
    reads: list[str] = []
    real_read = DataRoot.read_parquet
    monkeypatch.setattr(
        DataRoot, "read_parquet", lambda self, rel, *a, **k: reads.append(rel) or real_read(self, rel, *a, **k)
    )
    gated: list[str] = []
    everything = tree(data_root)
    again = build_and_write_asr_manifests(data_root, CONFIG, gate=gated.append)
    assert again.shards_changed == [] and again.shards_rewritten == [] and gated == [] and reads == []
    assert tree(data_root) == everything

    write_shard(data_root, "s4", shard_rows("s4", 4, shared_recording=False))
    summary = build_and_write_asr_manifests(data_root, CONFIG, gate=gated.append)
    assert gated == ["s4"] and summary.shards_changed == ["s4"] and summary.shards_rewritten == ["s4"]
    per_shard_reads = [r for r in reads if "/s1" in r or "/s2" in r or "/s3" in r]
    # Other shards are read only by the concatenation of the corpus-wide files (their parts).
    assert all(r.startswith(f"{layout.ASR}/manifests/parts/") for r in per_shard_reads), per_shard_reads
    assert {
        k: v for k, v in tree(data_root, f"{layout.ASR}/manifests/parts").items() if k in parts_before
    } == parts_before
    assert {
        k: v for k, v in tree(data_root, f"{layout.ASR}/prepared").items() if k in prepared_before
    } == prepared_before

    reads.clear()
    build_and_write_asr_manifests(data_root, CONFIG, gate=gated.append, combined=False)
    assert not data_root.exists(layout.asr_manifest("train")) and data_root.exists(layout.asr_manifest("eval"))
    write_shard(data_root, "s5", shard_rows("s5", 5, shared_recording=False))
    reads.clear()
    build_and_write_asr_manifests(data_root, CONFIG, combined=False)
    assert not [r for r in reads if "/s1" in r or "/s2" in r or "/s3" in r or "/s4" in r], reads


def test_existing_utterances_never_change_split(tmp_path):
    data_root = DataRoot(str(tmp_path / "root"))
    seen: dict[tuple[str, str], str] = {}
    for seed in range(6):
        shard_id = f"s{seed}"
        write_shard(data_root, shard_id, shard_rows(shard_id, seed))
        build_and_write_asr_manifests(data_root, CONFIG)
        published = read_published_build(data_root)
        now = {
            (shard, utt): split
            for split in ("train", "validation")
            for shard, utt in getattr(published, split).select("shard_id", "utt_id").iter_rows()
        }
        moved = {key: (seen[key], split) for key, split in now.items() if key in seen and seen[key] != split}
        assert not moved
        assert set(seen) <= set(now)  # no kept utterance left the manifests either
        seen = now
    assert "validation" in set(seen.values()) and "train" in set(seen.values())


def test_a_build_killed_at_any_shard_reruns_to_the_clean_bytes(tmp_path, monkeypatch):
    def land_all(data_root: DataRoot) -> None:
        for seed, shard_id in enumerate(("s1", "s2", "s3")):
            write_shard(data_root, shard_id, shard_rows(shard_id, seed))

    clean = DataRoot(str(tmp_path / "clean"))
    land_all(clean)
    build_and_write_asr_manifests(clean, CONFIG)
    for failing in range(3):
        data_root = DataRoot(str(tmp_path / f"killed-{failing}"))
        land_all(data_root)
        calls: list[str] = []

        def dies(name, calls=calls, failing=failing):
            calls.append(name)
            if len(calls) == failing + 1:
                raise KeyboardInterrupt(f"killed after {name}")

        monkeypatch.setattr(incremental, "fault_point", dies)
        with pytest.raises(KeyboardInterrupt):
            build_and_write_asr_manifests(data_root, CONFIG)
        monkeypatch.undo()
        build_and_write_asr_manifests(data_root, CONFIG)
        assert {k: v[2] for k, v in tree(data_root).items()} == {k: v[2] for k, v in tree(clean).items()}


def test_a_changed_config_rebuilds_every_shard(tmp_path):
    data_root = DataRoot(str(tmp_path / "root"))
    for seed, shard_id in enumerate(("s1", "s2")):
        write_shard(data_root, shard_id, shard_rows(shard_id, seed))
    build_and_write_asr_manifests(data_root, CONFIG)
    other = AsrManifestConfig(validation_share=0.6, eval_per_language=1, min_duration_s=1.5)
    summary = build_and_write_asr_manifests(data_root, other)
    assert summary.shards_changed == ["s1", "s2"]
    shards = ["s1", "s2"]
    utterances, flac = read_asr_inputs(data_root, shards)
    expected = build_asr_manifest(utterances, flac, audio_root=MANIFEST_TO_ROOT, config=other)
    assert_frame_equal(read_published_build(data_root).train, expected.train, check_dtypes=False)
    assert_frame_equal(read_published_build(data_root).removed, expected.removed, check_dtypes=False)


def test_missing_and_malformed_audio_hashes_group_as_in_the_corpus_wide_build(tmp_path):
    data_root = DataRoot(str(tmp_path / "root"))
    for seed, shard_id in enumerate(("s1", "s2")):
        rows = shard_rows(shard_id, seed)
        for row in rows[:6]:
            row["audio_sha1"] = None
        for row in rows[6:9]:
            row["audio_sha1"] = "not-a-hash"
        write_shard(data_root, shard_id, rows)
        build_and_write_asr_manifests(data_root, CONFIG)
        assert_equals_corpus_wide(data_root)


def test_a_shard_sharing_keys_with_earlier_shards_in_key_order_rewrites_only_itself(tmp_path):
    data_root = DataRoot(str(tmp_path / "root"))
    for seed, shard_id in enumerate(("s1", "s2", "s3")):
        shared = [{**DUPLICATED, "utt_id": "dup", "recording_id": f"elsewhere-{shard_id}"}]
        write_shard(data_root, shard_id, shard_rows(shard_id, seed, shared=shared))
    build_and_write_asr_manifests(data_root, CONFIG)
    # s9 repeats the audio every earlier shard holds: their decisions name s1's row, whatever s9 holds.
    write_shard(data_root, "s9", shard_rows("s9", 9, shared=[{**DUPLICATED, "utt_id": "dup", "recording_id": "x"}]))
    summary = build_and_write_asr_manifests(data_root, CONFIG)
    assert summary.shards_changed == ["s9"] and summary.shards_rewritten == ["s9"]
    assert_equals_corpus_wide(data_root)
    # s0 sorts before them all: every holder of the audio now names s0's row, so each is rewritten.
    write_shard(data_root, "s0", shard_rows("s0", 10, shared=[{**DUPLICATED, "utt_id": "dup", "recording_id": "y"}]))
    summary = build_and_write_asr_manifests(data_root, CONFIG)
    assert summary.shards_changed == ["s0"] and set(summary.shards_rewritten) == {"s0", "s1", "s2", "s3", "s9"}
    assert_equals_corpus_wide(data_root)
