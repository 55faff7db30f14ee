"""The ASR training manifests: the original pipeline's build steps, its hand-made ``v2`` step included.

From every shard's utterance index joined with its extracted FLAC index, in polars (columnar, no
per-row Python):

1. language-tag corrections from a corrections table (by utterance, else by recording);
2. filters: FLAC present, language known, duration in range, quality at least the minimum, text
   non-empty before and after cleaning;
3. cleaning (:mod:`speechdata.asr.text`) and the ``<|lang|>`` prefix;
4. deduplication: the same audio content (hash of the 16 kHz PCM), or the same cleaned text and
   duration within one recording; the first by ``(shard_id, utt_id)`` is kept;
5. a train/validation split by recording: a recording goes to validation when the MD5 of its key
   (with a salt) falls under ``validation_share``, so no recording is in both splits and a
   recording's split never changes when shards are added; with three or more recordings, a
   non-zero share and none under it, the one with the smallest hash goes to validation (so validation and eval are
   never empty: it returns to train once a recording falls under the share by itself);
6. a per-language evaluation subset of the validation split (the ``eval_per_language`` utterances
   of each language with the smallest MD5 of their key).

Every row left out is in the ``removed`` table with the filter that removed it. A recording key is
``recording_id`` where the shard has one, else ``shard:<shard_id>`` (a whole shard is then one
recording: conservative, nothing can leak).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import duckdb
import polars as pl

from speechdata.asr.duplicates import mark_duplicates
from speechdata.asr.filters import (
    REMOVAL_REASONS,
    REPORT,
    filtered_in_key_order,
    rejected_report,
)
from speechdata.asr.split import MIN_RECORDINGS_FOR_HELD_OUT, SaltedMd5, recording_buckets, split_by_recording
from speechdata.asr.text import clean_transcript_series_in_threads, tagged_text_expr

UTTERANCE_COLUMNS = {
    "shard_id": pl.String,
    "utt_id": pl.String,
    "text": pl.String,
    "language": pl.String,
    "source": pl.String,
    "recording_id": pl.String,
    "quality": pl.Float64,
    "text_source": pl.String,
    "asr_confidence": pl.Float32,
}
FLAC_COLUMNS = {
    "shard_id": pl.String,
    "utt_id": pl.String,
    "flac_path": pl.String,
    "duration_s": pl.Float64,
    "audio_sha1": pl.String,
}
MANIFEST_COLUMNS = [
    "utt_id",
    "shard_id",
    "text",
    "duration",
    "lang",
    "audio_filepath",
    "flac_path",
    "source",
    "recording_id",
    "original_language",
    "quality",
    "text_source",
    "asr_confidence",
]
NEMO_COLUMNS = ["audio_filepath", "duration", "text", "lang"]

RECORDING_KEY = pl.coalesce(pl.col("recording_id"), pl.lit("shard:") + pl.col("shard_id"))
"""What a recording is: its ``recording_id``, else (unknown) the whole shard."""


@dataclass(frozen=True)
class AsrManifestConfig:
    min_duration_s: float = 0.5
    max_duration_s: float = 20.0
    min_quality: float | None = None
    """Rows whose quality is below this (or null) are removed; None keeps every row."""
    validation_share: float = 0.05
    split_salt: str = "asr-split-v1"
    eval_per_language: int = 10
    dedup_duration_resolution_ms: int = 10


def empty_split_reason(recordings: int, validation_share: float) -> str:
    """Why a split the split rule promises came out empty (the manifest says so, never silently)."""
    if recordings == 0:
        return "no utterance passed the filters"
    if validation_share == 0:
        return "validation_share is 0"
    if recordings < MIN_RECORDINGS_FOR_HELD_OUT:
        return f"{recordings} recording(s): validation and eval need at least {MIN_RECORDINGS_FOR_HELD_OUT}"
    return "every recording fell in another split"


@dataclass(frozen=True)
class AsrManifestBuild:
    train: pl.DataFrame
    validation: pl.DataFrame
    eval: pl.DataFrame
    removed: pl.DataFrame
    """``shard_id``, ``utt_id``, ``reason``, ``detail``: every input row not in train or validation."""
    relabeled: dict[str, int]
    """``"from->to"``: utterances whose language the corrections changed."""
    recordings: int = 0
    """Recordings among the kept utterances."""
    validation_share: float = 0.0
    forced_validation: str | None = None
    """The recording moved into validation because the hash rule gave it none (see the module docstring)."""

    @property
    def empty_splits(self) -> dict[str, str]:
        """Each empty split and why: never silently empty."""
        why = empty_split_reason(self.recordings, self.validation_share)
        splits = (("train", self.train), ("validation", self.validation), ("eval", self.eval))
        return {split: why for split, frame in splits if frame.height == 0}

    @property
    def removed_by_reason(self) -> dict[str, int]:
        counts = dict(self.removed.group_by("reason").len().iter_rows())
        return {reason: int(counts.get(reason, 0)) for reason in REMOVAL_REASONS}

    def recordings_in_both_splits(self) -> int:
        """Recordings with utterances in train and in validation (0 by construction; checked)."""
        keys = [frame.select(RECORDING_KEY.alias("k")).unique() for frame in (self.train, self.validation)]
        return keys[0].join(keys[1], on="k", how="inner").height

    def hours_by_language_and_split(self) -> pl.DataFrame:
        frames = [
            frame.group_by("lang")
            .agg(pl.len().alias("utterances"), (pl.col("duration").sum() / 3600).alias("hours"))
            .with_columns(pl.lit(split).alias("split"))
            for split, frame in (("train", self.train), ("validation", self.validation), ("eval", self.eval))
        ]
        return pl.concat(frames).select("split", "lang", "utterances", "hours").sort("split", "lang")


def conform(frame: pl.DataFrame, columns: dict[str, pl.DataType]) -> pl.DataFrame:
    """Exactly ``columns``: absent ones as nulls, every one cast to its type."""
    return frame.select(
        [
            (pl.col(name) if name in frame.columns else pl.lit(None)).cast(dtype).alias(name)
            for name, dtype in columns.items()
        ]
    )


def apply_language_corrections(rows: pl.DataFrame, corrections: pl.DataFrame | None) -> pl.DataFrame:
    """Replace ``language`` from the corrections table; keep the old one as ``original_language``.

    ``corrections`` has ``language`` and ``utt_id`` (optionally with ``shard_id``) and/or
    ``recording_id``; an utterance correction wins over a recording one. Conflicting duplicate keys
    raise, so a correction can never add or drop rows. An utterance is ``(shard_id, utt_id)``: a
    table without ``shard_id`` that names an id held by several shards raises (shards name their
    utterances independently, so it cannot say which one it means).
    """
    rows = rows.with_columns(pl.col("language").alias("original_language"))
    if corrections is None or corrections.height == 0:
        return rows
    if "language" not in corrections.columns:
        raise ValueError(f"the corrections table needs a 'language' column (has {corrections.columns})")
    corrected = pl.lit(None, pl.String)
    # A long recording's segments (``<utt_id>+<index>``) take the recording's utterance correction.
    segment_ids = pl.col("utt_id")
    rows = rows.with_columns(pl.col("utt_id").str.split("+").list.first().alias("utt_id"), segment_ids.alias("_key"))
    for keys in (["shard_id", "utt_id"], ["utt_id"], ["recording_id"]):
        if not set(keys) <= set(corrections.columns) or (keys == ["utt_id"] and "shard_id" in corrections.columns):
            continue
        table = corrections.select([*keys, "language"]).drop_nulls().cast(pl.String).unique()
        conflicts = table.filter(pl.len().over(keys) > 1)
        if conflicts.height:
            raise ValueError(f"corrections give more than one language for {keys}: {conflicts.head(3).to_dicts()}")
        if keys == ["utt_id"]:
            _refuse_ids_in_several_shards(rows, table)
        name = f"_corrected_by_{'_'.join(keys)}"
        rows = rows.join(table.rename({"language": name}), on=keys, how="left")
        corrected = pl.coalesce(corrected, pl.col(name))
    names = [c for c in rows.columns if c.startswith("_corrected_by_")]
    # Utterance-level columns were joined first, so coalesce's order is the precedence.
    rows = rows.with_columns(
        pl.coalesce(corrected, pl.col("language")).alias("language"), pl.col("_key").alias("utt_id")
    )
    return rows.drop([*names, "_key"])


def _refuse_ids_in_several_shards(rows: pl.DataFrame, corrections: pl.DataFrame) -> None:
    shards_per_id = (
        rows.filter(pl.col("utt_id").is_in(corrections["utt_id"].implode()))
        .group_by("utt_id")
        .agg(pl.col("shard_id").n_unique().alias("shards"), pl.col("shard_id").unique().sort().alias("shard_ids"))
        .filter(pl.col("shards") > 1)
        .sort("utt_id")
    )
    if shards_per_id.height:
        shown = ", ".join(
            f"{u} (shards {', '.join(s)})" for u, s in shards_per_id.head(5).select("utt_id", "shard_ids").iter_rows()
        )
        raise ValueError(
            f"the corrections table names utterances by utt_id alone, but {shards_per_id.height} of its ids are held by "
            f"more than one shard: {shown}; add a shard_id column"
        )


def stable_hash_column(frame: pl.DataFrame, key: str, salt: str) -> pl.Series:
    """An MD5-based uint64 of ``salt + key`` per row: the same on every machine and library version
    (polars' own hash is not stable across releases), computed in DuckDB."""
    keys = frame.select(pl.col(key)).to_arrow()
    connection = duckdb.connect()
    try:
        connection.register("keys_table", keys)
        values = connection.execute(f'SELECT md5_number_lower(? || "{key}") AS h FROM keys_table', [salt]).fetchnumpy()[
            "h"
        ]
    finally:
        connection.close()
    return pl.Series(f"{key}_hash", values, dtype=pl.UInt64)


def empty_text_reasons(text: pl.Series, clean_text: pl.Series) -> pl.Series:
    """``empty_text`` where ``text`` is null or blank, else ``empty_after_cleaning`` where the cleaned
    text is empty; null elsewhere.

    Blank text cleans to nothing (whitespace becomes spaces, then stripped), so only the few rows
    that cleaned to nothing need the blank check, not every row.
    """
    empty_rows = (clean_text.fill_null("") == "").arg_true()
    blank = text.gather(empty_rows).str.strip_chars().fill_null("") == ""
    reasons = blank.to_frame("blank").select(
        pl.when(pl.col("blank")).then(pl.lit("empty_text")).otherwise(pl.lit("empty_after_cleaning"))
    )
    return (
        pl.repeat(None, clean_text.len(), dtype=pl.String, eager=True)
        .scatter(empty_rows, reasons.to_series())
        .alias("reason")
    )


def _with_clean_text(passing: pl.DataFrame) -> pl.DataFrame:
    """``passing`` with ``clean_text``, ``recording_key``, the empty-text ``reason`` and an empty ``detail``."""
    passing = passing.with_columns(
        clean_transcript_series_in_threads(passing["text"]).alias("clean_text"),
        RECORDING_KEY.alias("recording_key"),
    )
    return passing.with_columns(
        empty_text_reasons(passing["text"], passing["clean_text"]), pl.lit(None, pl.String).alias("detail")
    )


def _removed(removed_early: pl.DataFrame, passing: pl.DataFrame) -> pl.LazyFrame:
    # Every part is in key order; a sort on the row number interleaves them.
    removed_late = passing.lazy().filter(pl.col("reason").is_not_null())
    return (
        pl.concat([removed_early.lazy(), removed_late.select(*REPORT, pl.col("detail").fill_null(""))])
        .sort("_row")
        .drop("_row")
    )


def _kept(passing: pl.DataFrame, audio_root: str) -> pl.LazyFrame:
    """The manifest's rows (:data:`MANIFEST_COLUMNS`) and ``recording_key``, from the rows still passing."""
    return (
        passing.lazy()
        .filter(pl.col("reason").is_null())
        .select("utt_id", "shard_id", *manifest_row_columns(audio_root), "recording_key")
    )


def manifest_row_columns(audio_root: str) -> list:
    """The manifest's columns after ``utt_id`` and ``shard_id``, from a row still passing: the tagged
    text, duration, language, the FLAC's path under ``audio_root`` and what is carried through."""
    return [
        tagged_text_expr(pl.col("clean_text"), pl.col("language")).alias("text"),
        pl.col("duration_s").alias("duration"),
        pl.col("language").alias("lang"),
        (pl.lit(audio_root.rstrip("/") + "/") + pl.col("flac_path")).alias("audio_filepath"),
        "flac_path",
        "source",
        "recording_id",
        "original_language",
        "quality",
        "text_source",
        "asr_confidence",
    ]


def build_asr_manifest(
    utterances: pl.DataFrame,
    flac: pl.DataFrame,
    *,
    audio_root: str,
    config: AsrManifestConfig = AsrManifestConfig(),
    corrections: pl.DataFrame | None = None,
) -> AsrManifestBuild:
    """Train, validation, eval and removed tables from the joined inputs (see the module docstring).

    ``audio_root`` prefixes ``flac_path`` to make ``audio_filepath`` (a local directory or a URL).
    """
    utterances = apply_language_corrections(conform(utterances, UTTERANCE_COLUMNS), corrections)
    flac = conform(flac, FLAC_COLUMNS)
    with SaltedMd5(config.split_salt) as salted_md5, ThreadPoolExecutor(1) as background:
        passing, rejected, joined = filtered_in_key_order(
            utterances,
            flac,
            min_duration_s=config.min_duration_s,
            max_duration_s=config.max_duration_s,
            min_quality=config.min_quality,
        )
        removed_early = rejected_report(rejected)
        # Clean and deduplicate only what the cheap filters kept: cleaning is most of the build's cost.
        passing = _with_clean_text(passing)
        # The split's recording hashes (DuckDB, one thread) while duplicates are marked.
        hashing = background.submit(recording_buckets, passing["recording_key"], salted_md5)
        passing = mark_duplicates(passing, config.dedup_duration_resolution_ms)
        # Collected together: polars runs the two queries at once.
        removed, kept = pl.collect_all([_removed(removed_early, passing), _kept(passing, audio_root)])
        split = split_by_recording(
            kept,
            hashing.result(),
            salted_md5,
            validation_share=config.validation_share,
            eval_per_language=config.eval_per_language,
        )
    # Without corrections ``original_language`` is ``language`` on every row: nothing to scan.
    relabeled = (
        (joined.head(0) if corrections is None or corrections.height == 0 else joined)
        .filter(pl.col("original_language").ne_missing(pl.col("language")))
        .select(
            (pl.col("original_language").fill_null("null") + "->" + pl.col("language").fill_null("null")).alias(
                "change"
            )
        )
        .group_by("change")
        .len()
        .sort("change")
    )
    return AsrManifestBuild(
        train=split.train,
        validation=split.validation,
        eval=split.eval,
        removed=removed,
        relabeled={change: int(n) for change, n in relabeled.iter_rows()},
        recordings=split.recordings,
        validation_share=config.validation_share,
        forced_validation=split.forced_validation,
    )


def nemo_jsonl_bytes(manifest: pl.DataFrame) -> bytes:
    """NeMo's manifest format: one JSON object per line with ``audio_filepath``, ``duration``, ``text``, ``lang``."""
    import io

    buffer = io.BytesIO()
    manifest.select(NEMO_COLUMNS).write_ndjson(buffer)
    return buffer.getvalue()
