"""The ASR manifest build: filters, corrections, dedup, split by recording, eval subset, accounting."""

import polars as pl
import pytest

from speechdata.asr.manifest import AsrManifestConfig, apply_language_corrections, build_asr_manifest, nemo_jsonl_bytes


def inputs(n_recordings=40, per_recording=5):
    rows, flac = [], []
    for r in range(n_recordings):
        for k in range(per_recording):
            utt = f"rec{r:03d}_{k}"
            rows.append(
                {
                    "shard_id": f"s{r % 3}",
                    "utt_id": utt,
                    "text": f"Word{r} number {k}!",
                    "language": ["hi", "en", "ta"][r % 3],
                    "recording_id": f"rec{r:03d}",
                    "quality": 0.9,
                }
            )
            flac.append(
                {
                    "shard_id": f"s{r % 3}",
                    "utt_id": utt,
                    "flac_path": f"asr/flac/s{r % 3}/{utt}.flac",
                    "duration_s": 1.0 + k,
                    "audio_sha1": f"sha-{utt}",
                }
            )
    return pl.DataFrame(rows), pl.DataFrame(flac)


def test_every_input_row_is_in_exactly_one_output():
    utterances, flac = inputs()
    utterances = utterances.with_columns(
        pl.when(pl.col("utt_id") == "rec000_0").then(pl.lit("...")).otherwise(pl.col("text")).alias("text"),
        pl.when(pl.col("utt_id") == "rec000_1").then(pl.lit(0.1)).otherwise(pl.col("quality")).alias("quality"),
        pl.when(pl.col("utt_id") == "rec001_0").then(pl.lit(None)).otherwise(pl.col("language")).alias("language"),
    )
    flac = flac.filter(pl.col("utt_id") != "rec002_0").with_columns(
        pl.when(pl.col("utt_id") == "rec003_0").then(pl.lit(30.0)).otherwise(pl.col("duration_s")).alias("duration_s"),
        pl.when(pl.col("utt_id") == "rec004_1")
        .then(pl.lit("sha-rec005_1"))
        .otherwise(pl.col("audio_sha1"))
        .alias("audio_sha1"),
    )
    build = build_asr_manifest(
        utterances, flac, audio_root="/d", config=AsrManifestConfig(min_quality=0.5, validation_share=0.3)
    )
    assert build.train.height + build.validation.height + build.removed.height == utterances.height
    reasons = dict(zip(build.removed["utt_id"], build.removed["reason"]))
    assert reasons == {
        "rec000_0": "empty_after_cleaning",
        "rec000_1": "quality_below_minimum",
        "rec001_0": "missing_language",
        "rec002_0": "no_flac",
        "rec003_0": "duration_out_of_range",
        "rec005_1": "duplicate_audio",
    }
    assert build.removed_by_reason["duplicate_audio"] == 1
    [detail] = build.removed.filter(pl.col("utt_id") == "rec005_1")["detail"]
    assert detail == "same audio as s1/rec004_1"  # the first by (shard, utt) is kept


def test_text_is_cleaned_and_language_tagged_and_paths_are_absolute():
    utterances, flac = inputs(3, 1)
    build = build_asr_manifest(
        utterances, flac, audio_root="/data/root/", config=AsrManifestConfig(validation_share=0.0)
    )
    row = build.train.filter(pl.col("utt_id") == "rec000_0").row(0, named=True)
    assert row["text"] == "<|hi|> Word0 number 0"
    assert row["audio_filepath"] == "/data/root/asr/flac/s0/rec000_0.flac"
    lines = nemo_jsonl_bytes(build.train).decode().splitlines()
    assert len(lines) == 3 and lines[0].startswith('{"audio_filepath":')


def test_same_text_and_duration_in_one_recording_is_a_duplicate_but_not_across_recordings():
    utterances = pl.DataFrame(
        {
            "shard_id": ["s"] * 4,
            "utt_id": ["a", "b", "c", "d"],
            "text": ["yes.", "Yes", "yes", "yes"],
            "language": ["en"] * 4,
            "recording_id": ["r1", "r1", "r2", "r1"],
            "quality": [1.0] * 4,
        }
    )
    flac = pl.DataFrame(
        {
            "shard_id": ["s"] * 4,
            "utt_id": ["a", "b", "c", "d"],
            "flac_path": ["p"] * 4,
            "duration_s": [1.0, 1.0, 1.0, 1.004],
            "audio_sha1": ["1", "2", "3", "4"],
        }
    )
    build = build_asr_manifest(utterances, flac, audio_root="/", config=AsrManifestConfig(validation_share=0.0))
    # "Yes" differs by case, so only d (same text, duration within 10 ms) duplicates a.
    assert dict(zip(build.removed["utt_id"], build.removed["reason"])) == {"d": "duplicate_text_in_recording"}


@pytest.mark.parametrize("salt", ["a", "b", "c"])
def test_split_is_by_recording_and_stable(salt):
    utterances, flac = inputs(60, 4)
    config = AsrManifestConfig(validation_share=0.25, split_salt=salt, eval_per_language=3)
    build = build_asr_manifest(utterances, flac, audio_root="/", config=config)
    assert build.recordings_in_both_splits() == 0
    assert 0 < build.validation.height < utterances.height
    # Adding shards never moves an existing recording between splits.
    more_u, more_f = inputs(90, 4)
    bigger = build_asr_manifest(more_u, more_f, audio_root="/", config=config)
    assert set(build.validation["utt_id"]) <= set(bigger.validation["utt_id"])
    counts = dict(build.eval.group_by("lang").len().iter_rows())
    assert all(n <= 3 for n in counts.values()) and set(counts) == set(build.validation["lang"])
    assert set(build.eval["utt_id"]) <= set(build.validation["utt_id"])


def test_corrections_by_utterance_win_over_recording_and_keep_row_count():
    utterances = pl.DataFrame(
        {
            "shard_id": ["s", "s", "s"],
            "utt_id": ["a", "b", "c"],
            "language": ["en", "en", None],
            "recording_id": ["r1", "r1", "r2"],
        }
    )
    corrections = pl.DataFrame({"utt_id": ["a", None], "recording_id": [None, "r1"], "language": ["ta", "hi"]})
    corrected = apply_language_corrections(utterances, corrections)
    assert corrected.height == 3
    assert dict(zip(corrected["utt_id"], corrected["language"])) == {"a": "ta", "b": "hi", "c": None}
    assert corrected["original_language"].to_list() == ["en", "en", None]


def test_conflicting_corrections_raise():
    utterances = pl.DataFrame({"shard_id": ["s"], "utt_id": ["a"], "language": ["en"], "recording_id": ["r"]})
    with pytest.raises(ValueError, match="more than one language"):
        apply_language_corrections(utterances, pl.DataFrame({"utt_id": ["a", "a"], "language": ["hi", "ta"]}))


def test_three_recordings_always_give_validation_and_eval_a_recording():
    utterances, flac = inputs(3, 2)
    config = AsrManifestConfig(validation_share=0.01, eval_per_language=1)
    build = build_asr_manifest(utterances, flac, audio_root="/", config=config)
    assert build.forced_validation is not None  # 1 % of three recordings is none: the rule steps in
    assert build.validation.height == 2 and build.eval.height == 1 and build.train.height == 4
    assert set(build.validation["recording_id"]) == {build.forced_validation}
    assert build.recordings_in_both_splits() == 0 and build.empty_splits == {}
    again = build_asr_manifest(utterances, flac, audio_root="/", config=config)
    assert again.forced_validation == build.forced_validation  # deterministic


def test_a_split_that_stays_empty_says_why():
    utterances, flac = inputs(2, 2)
    build = build_asr_manifest(utterances, flac, audio_root="/", config=AsrManifestConfig(validation_share=0.01))
    assert build.validation.height == 0 and build.eval.height == 0
    assert set(build.empty_splits) == {"validation", "eval"}
    assert "2 recording(s)" in build.empty_splits["validation"]
    none = build_asr_manifest(utterances.head(0), flac.head(0), audio_root="/")
    assert none.empty_splits == {s: "no utterance passed the filters" for s in ("train", "validation", "eval")}
