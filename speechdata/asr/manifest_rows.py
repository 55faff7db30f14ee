"""A shard's rows on their way to the ASR manifests: prepared once per input version, then decided.

:func:`prepare_shard` applies the per-shard steps (language corrections, the cheap filters, cleaning
and the ``<|lang|>`` tag) and computes the keys the cross-shard steps look up; :class:`ShardOutputs`
is what deduplication and the split decide for it (:mod:`speechdata.asr.incremental`).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import numpy as np
import polars as pl

from speechdata.asr.filters import filtered_in_key_order, rejected_report
from speechdata.asr.manifest import (
    FLAC_COLUMNS,
    MANIFEST_COLUMNS,
    UTTERANCE_COLUMNS,
    AsrManifestConfig,
    _with_clean_text,
    apply_language_corrections,
    conform,
    manifest_row_columns,
)
from speechdata.asr.split import HASH_BUCKETS, UTTERANCE_KEY, SaltedMd5

TEXT_KEY_SALT = "asr-text-group-v1:"
AUDIO_KEY_SALT = "asr-audio-v1:"
NULL_AUDIO_KEY = -(2**63)
"""The audio key of a row without a PCM hash: such rows group together, as the corpus-wide build's
null-equal join groups them."""

MANIFEST_SCHEMA = {
    "utt_id": pl.String,
    "shard_id": pl.String,
    "text": pl.String,
    "duration": pl.Float64,
    "lang": pl.String,
    "audio_filepath": pl.String,
    "flac_path": pl.String,
    "source": pl.String,
    "recording_id": pl.String,
    "original_language": pl.String,
    "quality": pl.Float64,
    "text_source": pl.String,
}
REMOVED_SCHEMA = {"shard_id": pl.String, "utt_id": pl.String, "reason": pl.String, "detail": pl.String}
PREPARED_SCHEMA = {
    "_row": pl.UInt32,
    "shard_id": pl.String,
    "utt_id": pl.String,
    "reason": pl.String,
    "detail": pl.String,
    **{name: dtype for name, dtype in MANIFEST_SCHEMA.items() if name not in ("utt_id", "shard_id")},
    "recording_key": pl.String,
    "audio_key": pl.Int64,
    "text_key": pl.Int64,
    "bucket": pl.Int64,
    "eval_key": pl.Int64,
}
assert list(MANIFEST_SCHEMA) == MANIFEST_COLUMNS


def _u64_as_ordered_i64(values: pl.Series) -> pl.Series:
    """A ``UInt64`` as an ``Int64`` of the same order (SQLite integers are signed)."""
    flipped = values.fill_null(0).to_numpy().astype(np.uint64) ^ np.uint64(1 << 63)
    return pl.Series(values.name, flipped.view(np.int64), dtype=pl.Int64).scatter(values.is_null().arg_true(), None)


def _u64_as_i64(values: pl.Series) -> pl.Series:
    """The same 64 bits as ``Int64``; nulls stay null."""
    bits = pl.Series(values.name, values.fill_null(0).to_numpy().view(np.int64), dtype=pl.Int64)
    return bits.scatter(values.is_null().arg_true(), None)


@dataclass(frozen=True)
class PreparedShard:
    rows: pl.DataFrame
    """:data:`PREPARED_SCHEMA`, in key order: every input row; ``reason`` set on those removed by a
    per-shard step, null on the candidates deduplication and the split decide."""
    relabeled: dict[str, int]
    input_rows: int


def prepare_shard(
    utterances: pl.DataFrame,
    flac: pl.DataFrame,
    *,
    config: AsrManifestConfig,
    audio_root: str,
    corrections: pl.DataFrame | None,
    salted_md5: SaltedMd5,
) -> PreparedShard:
    """Steps 1-3 of :mod:`speechdata.asr.manifest` for one shard, and the keys of steps 4-6."""
    utterances = apply_language_corrections(conform(utterances, UTTERANCE_COLUMNS), corrections)
    passing, rejected, joined = filtered_in_key_order(
        utterances,
        conform(flac, FLAC_COLUMNS),
        min_duration_s=config.min_duration_s,
        max_duration_s=config.max_duration_s,
        min_quality=config.min_quality,
    )
    early = rejected_report(rejected)
    passing = _with_clean_text(passing)
    duration_step = (
        (pl.col("duration_s") * 1000 / config.dedup_duration_resolution_ms).round().cast(pl.Int64).cast(pl.String)
    )
    candidates = passing.select(
        "_row",
        "shard_id",
        "utt_id",
        "reason",
        "detail",
        *manifest_row_columns(audio_root),
        "recording_key",
        "audio_sha1",
        pl.concat_str(
            [pl.col("recording_key"), pl.col("clean_text"), duration_step], separator="\x1f", ignore_nulls=False
        ).alias("text_group"),
        UTTERANCE_KEY.alias("utterance_key"),
    )
    # Any string hashes (a malformed hash stays a group of its own, as in the corpus-wide build).
    audio_key = _u64_as_i64(salted_md5(AUDIO_KEY_SALT + candidates["audio_sha1"]))
    # On the build's connection (opening one costs more than hashing a shard): salted again, so a text
    # key never equals a recording's hash.
    text_key = _u64_as_i64(salted_md5(TEXT_KEY_SALT + candidates["text_group"].fill_null("")))
    candidates = candidates.with_columns(
        audio_key.fill_null(NULL_AUDIO_KEY).alias("audio_key"),
        text_key.alias("text_key"),
        (salted_md5(candidates["recording_key"]) % HASH_BUCKETS).cast(pl.Int64).alias("bucket"),
        _u64_as_ordered_i64(salted_md5(candidates["utterance_key"])).alias("eval_key"),
    ).drop("audio_sha1", "text_group", "utterance_key")
    rows = pl.concat([conform(early, PREPARED_SCHEMA), conform(candidates, PREPARED_SCHEMA)], how="vertical").sort(
        "_row"
    )
    changed = joined.filter(pl.col("original_language").ne_missing(pl.col("language")))
    relabeled = Counter(
        f"{old if old is not None else 'null'}->{new if new is not None else 'null'}"
        for old, new in changed.select("original_language", "language").iter_rows()
    )
    return PreparedShard(rows=rows, relabeled=dict(sorted(relabeled.items())), input_rows=utterances.height)


@dataclass(frozen=True)
class ShardOutputs:
    train: pl.DataFrame
    validation: pl.DataFrame
    removed: pl.DataFrame
    kept: pl.DataFrame
    """The kept rows with ``recording_key``, ``bucket``, ``eval_key`` and ``held_out`` (in validation)."""


def prepared_info(prepared: PreparedShard) -> str:
    return json.dumps({"input_rows": prepared.input_rows, "relabeled": prepared.relabeled}, sort_keys=True)


def shard_stats(outputs: ShardOutputs, info: str) -> dict:
    def by_language(frame: pl.DataFrame) -> dict[str, list]:
        grouped = frame.group_by("lang").agg(pl.len(), pl.col("duration").sum()).sort("lang")
        return {lang: [int(n), float(seconds)] for lang, n, seconds in grouped.iter_rows()}

    prepared = json.loads(info)
    return {
        "input_rows": prepared["input_rows"],
        "train": by_language(outputs.train),
        "validation": by_language(outputs.validation),
        "removed": dict(sorted(Counter(outputs.removed["reason"].to_list()).items())),
        "relabeled": prepared["relabeled"],
    }
