"""The faster ASR manifest build (key-order join, cheaper cleaning) gives exactly the previous outputs.

The previous build is kept verbatim in ``benchmarks/corpus/asr_manifest_reference.py``; each case builds
both on the same synthetic rows and compares every output table with ``assert_frame_equal``.
"""

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from benchmarks.corpus import asr_manifest_reference as reference
from benchmarks.corpus.bench_asr_manifest import synthetic_inputs
from speechdata.asr.key_order import join_flac_in_key_order
from speechdata.asr.manifest import FLAC_COLUMNS, UTTERANCE_COLUMNS, AsrManifestConfig, build_asr_manifest, conform
from speechdata.asr.text import clean_transcripts

CONFIG = AsrManifestConfig(min_duration_s=0.5, max_duration_s=20.0, min_quality=0.5, validation_share=0.1)

# Transcripts that reach every branch of the cleaning: whitespace of every kind and length, lone
# punctuation, runs, tags (nested, unclosed), apostrophes, NFC-changing and composing sequences.
HARD_TEXTS = [
    " lead and trail ",
    "a\tb\n\nc\u00a0d\u2003e\u3000f",
    "one  two   three",
    "x.y,z",
    "...!!!",
    "-",
    " ",
    "\t",
    # Blank only in Unicode's sense (NFC maps U+2000 to U+2002): ``empty_text``, not ``empty_after_cleaning``.
    "\u2000\u2001 \u3000\u2028",
    "\u00a0",
    "[noise]",
    "[laugh [loud]] hi [x",
    "don't ‘quote’ `tick`",
    "e\u0301 e\u0323\u0302 \u00ea\u0323",
    "\u1100\u1161\u11a8 \uac00\u11a8",
    "\u0b92\u0bd7 \u0bc6\u0bbe \u09c7\u09be \u0928\u093c",
    "है।वह॥ «guillemets» „low“ 。、，",
    "tab\t.\tdot",
    "",
]


def _assert_same_build(utterances: pl.DataFrame, flac: pl.DataFrame, corrections=None, config=CONFIG) -> None:
    expected = reference.build_asr_manifest(
        utterances, flac, audio_root="/data", config=config, corrections=corrections
    )
    actual = build_asr_manifest(utterances, flac, audio_root="/data", config=config, corrections=corrections)
    for name in ("train", "validation", "eval", "removed"):
        assert_frame_equal(getattr(actual, name), getattr(expected, name))
    assert actual.relabeled == expected.relabeled
    assert (actual.recordings, actual.forced_validation) == (expected.recordings, expected.forced_validation)


def _key_order_join(utterances: pl.DataFrame, flac: pl.DataFrame) -> pl.DataFrame | None:
    return join_flac_in_key_order(conform(utterances, UTTERANCE_COLUMNS), conform(flac, FLAC_COLUMNS))


def _inputs(rows: int, seed: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The benchmark's rows plus hard transcripts, null fields, repeated audio and text, and utterance
    ids whose byte order differs from their number order."""
    utterances, flac = (pl.from_arrow(t) for t in synthetic_inputs(rows, seed=seed))
    rng = np.random.default_rng(seed)
    hard = rng.random(rows) < 0.2
    texts = pl.Series(np.array(HARD_TEXTS, dtype=object)[rng.integers(0, len(HARD_TEXTS), rows)], dtype=pl.String)
    utterances = utterances.with_columns(
        pl.when(pl.Series(hard)).then(texts).otherwise(pl.col("text")).alias("text"),
        pl.when(pl.Series(rng.random(rows) < 0.01)).then(None).otherwise(pl.col("language")).alias("language"),
        pl.when(pl.Series(rng.random(rows) < 0.01)).then(None).otherwise(pl.col("quality")).alias("quality"),
        pl.when(pl.Series(rng.random(rows) < 0.3)).then(None).otherwise(pl.col("recording_id")).alias("recording_id"),
    ).with_columns(
        # Same text and duration inside a recording: the second is a text duplicate.
        pl.when(pl.Series(rng.random(rows) < 0.05)).then(pl.lit("same words")).otherwise(pl.col("text")).alias("text"),
    )
    flac = flac.with_columns(
        pl.when(pl.Series(rng.random(rows) < 0.05))
        .then(pl.lit(4.0))
        .otherwise(pl.col("duration_s"))
        .alias("duration_s"),
        pl.when(pl.Series(rng.random(rows) < 0.01)).then(None).otherwise(pl.col("audio_sha1")).alias("audio_sha1"),
    )
    return utterances, flac


def test_hard_transcripts_clean_as_before():
    series = pl.Series("text", [*HARD_TEXTS, None], dtype=pl.String)
    assert clean_transcripts(series.to_list()) == reference.clean_transcript_series(series).to_list()


@pytest.mark.parametrize("seed", [0, 1])
def test_same_outputs_when_the_flac_index_is_aligned_with_the_utterances(seed):
    _assert_same_build(*_inputs(20_000, seed))


def test_same_outputs_when_both_inputs_are_shuffled_and_flac_is_missing_or_extra():
    utterances, flac = _inputs(20_000, 2)
    extra = flac.head(50).with_columns(pl.lit("shard-extra").alias("shard_id"))
    flac = pl.concat([flac.sample(fraction=0.9, seed=3), extra]).sample(fraction=1.0, shuffle=True, seed=4)
    utterances = utterances.sample(fraction=1.0, shuffle=True, seed=5)
    assert _key_order_join(utterances, flac) is not None
    _assert_same_build(utterances, flac)


@pytest.mark.parametrize("with_separator", [False, True])
def test_same_outputs_for_shards_and_utterances_of_any_characters(with_separator):
    utterances, flac = _inputs(5_000, 6)
    rng = np.random.default_rng(6)
    names = ["a", "a b", "ab", "a\u00e9", "\u0905", "Z", "a/b", "a\x01"] + (["a\x00b"] if with_separator else [])
    shard = pl.Series(np.array(names, dtype=object)[rng.integers(0, len(names), utterances.height)], dtype=pl.String)
    renamed = {"shard_id": shard, "utt_id": pl.col("utt_id") + "_" + shard}
    utterances, flac = utterances.with_columns(**renamed), flac.with_columns(**renamed)
    # A NUL inside a shard id would break the single key's order: that case takes the general join.
    assert (_key_order_join(utterances, flac) is None) == with_separator
    _assert_same_build(utterances, flac)


def test_same_outputs_with_corrections_and_without_a_quality_minimum():
    utterances, flac = _inputs(10_000, 7)
    corrections = pl.DataFrame({"recording_id": ["rec1", "rec2", "rec3"], "language": ["ta", "en", "hi"]})
    config = AsrManifestConfig(validation_share=0.2)
    _assert_same_build(utterances, flac, corrections=corrections, config=config)


def test_repeated_keys_fall_back_to_the_general_join():
    utterances, flac = _inputs(2_000, 8)
    # A repeated (shard_id, utt_id) in the FLAC index only: the key-order join declines, the general
    # join gives the row twice.
    flac = pl.concat([flac, flac.head(1)])
    assert _key_order_join(utterances, flac) is None
    _assert_same_build(utterances, flac)


def test_empty_inputs_give_empty_outputs():
    utterances, flac = _inputs(10, 9)
    _assert_same_build(utterances.head(0), flac.head(0))


def test_a_collision_of_the_audio_hash_falls_back_to_the_hash_strings(monkeypatch):
    from speechdata.asr import duplicates

    # Every audio hash in one u64 group: the check must notice and group by the strings instead.
    monkeypatch.setattr(duplicates, "_audio_group", lambda: pl.lit(7, pl.UInt64))
    _assert_same_build(*_inputs(5_000, 10))
