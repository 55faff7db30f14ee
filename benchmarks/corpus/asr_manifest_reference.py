"""The ASR manifest build as it was before the key-order join and cheaper cleaning: the
reference the faster build must reproduce row for row (tests/unit/test_asr_manifest_equivalence.py
and ``bench_asr_manifest --check``).

Verbatim from ``speechdata/asr/manifest.py`` and ``speechdata/asr/text.py`` at that point, except
that the unchanged helpers are imported from the package and NFC runs on every row (the package
runs it only on rows its pre-check flags, a check that is itself under test).
"""

from __future__ import annotations

import polars as pl

from speechdata.asr.manifest import (
    FLAC_COLUMNS,
    MANIFEST_COLUMNS,
    MIN_RECORDINGS_FOR_HELD_OUT,
    RECORDING_KEY,
    UTTERANCE_COLUMNS,
    AsrManifestBuild,
    AsrManifestConfig,
    apply_language_corrections,
    conform,
    stable_hash_column,
)
from speechdata.asr.text import (
    _APOSTROPHES,
    _INNERMOST_TAG,
    TAG_NESTING_DEPTH,
    tagged_text_expr,
)

_PUNCTUATION_OR_SPACE = r"[\s।॥॰.,!?;:\"\-—–()…%/+=$*@#&_^>|\\<~。、，！？：；“”«»„\[\]{}۔،؟]+"


def clean_transcript_expr(text: pl.Expr) -> pl.Expr:
    return text.map_batches(clean_transcript_series, return_dtype=pl.String, is_elementwise=True)


def clean_transcript_series(text: pl.Series) -> pl.Series:
    """:func:`clean_transcript_expr` on a Series (whole-column polars operations, no per-row Python).

    NFC and tag removal run only on the rows they could change (:mod:`speechdata.asr.nfc_check`,
    a literal ``[``): NFC was most of the cleaning's cost and changes almost no real transcript.
    """
    # Every row normalized: what the pre-check (speechdata.asr.nfc_check) only shortcuts.
    cleaned = text.str.normalize("NFC")

    def remove_tags(s: pl.Series) -> pl.Series:
        for _ in range(TAG_NESTING_DEPTH):
            s = s.str.replace_all(_INNERMOST_TAG, " ")
        return s

    cleaned = _on_rows(cleaned, cleaned.str.contains("[", literal=True), remove_tags)
    cleaned = cleaned.str.replace_all(_APOSTROPHES, "")
    # One pass turns punctuation into spaces and collapses every run of spaces with it.
    return cleaned.str.replace_all(_PUNCTUATION_OR_SPACE, " ").str.strip_chars()


def _on_rows(series: pl.Series, mask: pl.Series, transform) -> pl.Series:
    """``transform`` applied to the rows where ``mask`` is true, the others untouched."""
    rows = mask.arg_true()
    if rows.len() == 0:
        return series
    return series.clone().scatter(rows, transform(series.gather(rows)))  # clone: scatter writes in place


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
    joined = utterances.join(conform(flac, FLAC_COLUMNS), on=["shard_id", "utt_id"], how="left")
    quality_ok = pl.lit(True) if config.min_quality is None else pl.col("quality") >= config.min_quality
    reason = (
        pl.when(pl.col("flac_path").is_null())
        .then(pl.lit("no_flac"))
        .when(pl.col("language").is_null())
        .then(pl.lit("missing_language"))
        .when(~pl.col("duration_s").is_between(config.min_duration_s, config.max_duration_s))
        .then(pl.lit("duration_out_of_range"))
        .when(~quality_ok.fill_null(False))
        .then(pl.lit("quality_below_minimum"))
        .when(pl.col("text").str.strip_chars().fill_null("") == "")
        .then(pl.lit("empty_text"))
    )
    frame = joined.with_columns(reason.alias("reason"))
    # Clean only what the cheap filters kept: cleaning is most of the build's cost.
    frame = pl.concat(
        [
            frame.filter(pl.col("reason").is_null()).with_columns(
                clean_transcript_expr(pl.col("text")).alias("clean_text")
            ),
            frame.filter(pl.col("reason").is_not_null()).with_columns(pl.lit(None, pl.String).alias("clean_text")),
        ]
    )
    frame = frame.with_columns(
        pl.when(pl.col("reason").is_null() & (pl.col("clean_text") == ""))
        .then(pl.lit("empty_after_cleaning"))
        .otherwise(pl.col("reason"))
        .alias("reason"),
        RECORDING_KEY.alias("recording_key"),
        (pl.col("shard_id") + pl.lit("/") + pl.col("utt_id")).alias("key"),
    ).sort("shard_id", "utt_id")
    frame = _mark_duplicates(frame, config)
    removed = frame.filter(pl.col("reason").is_not_null()).select(
        "shard_id",
        "utt_id",
        "reason",
        pl.when(pl.col("reason").is_in(["duplicate_audio", "duplicate_text_in_recording"]))
        .then(pl.col("_duplicate_detail"))
        .when(pl.col("reason") == "duration_out_of_range")
        .then(pl.format("duration {} s", pl.col("duration_s").round(3)))
        .when(pl.col("reason") == "quality_below_minimum")
        .then(pl.format("quality {}", pl.col("quality")))
        .otherwise(pl.lit(""))
        .alias("detail"),
    )

    kept = frame.filter(pl.col("reason").is_null())
    # Hash each recording once (there are far fewer recordings than utterances), then join back.
    recordings = kept.select("recording_key").unique()
    recordings = recordings.with_columns(stable_hash_column(recordings, "recording_key", config.split_salt))
    threshold = int(config.validation_share * 1_000_000)
    recordings = recordings.with_columns(((pl.col("recording_key_hash") % 1_000_000) < threshold).alias("_validation"))
    forced = None
    # A share of 0 asks for no validation; any other share gets at least one recording.
    wants_held_out = config.validation_share > 0
    if wants_held_out and recordings.height >= MIN_RECORDINGS_FOR_HELD_OUT and not recordings["_validation"].any():
        # The recording the threshold would take next: the smallest hash bucket.
        forced = recordings.sort(pl.col("recording_key_hash") % 1_000_000, "recording_key")["recording_key"][0]
        recordings = recordings.with_columns(pl.col("_validation") | (pl.col("recording_key") == forced))
    manifest = kept.join(recordings, on="recording_key", how="left", maintain_order="left").with_columns(
        tagged_text_expr(pl.col("clean_text"), pl.col("language")).alias("text"),
        pl.col("duration_s").alias("duration"),
        pl.col("language").alias("lang"),
        (pl.lit(audio_root.rstrip("/") + "/") + pl.col("flac_path")).alias("audio_filepath"),
    )
    validation = manifest.filter(pl.col("_validation"))
    validation = validation.with_columns(stable_hash_column(validation, "key", config.split_salt))
    eval_subset = (
        validation.sort("lang", "key_hash", "key").group_by("lang", maintain_order=True).head(config.eval_per_language)
    )
    relabeled = (
        frame.filter(pl.col("original_language").ne_missing(pl.col("language")))
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
        train=manifest.filter(~pl.col("_validation")).select(MANIFEST_COLUMNS),
        validation=validation.select(MANIFEST_COLUMNS),
        eval=eval_subset.select(MANIFEST_COLUMNS),
        removed=removed,
        relabeled={change: int(n) for change, n in relabeled.iter_rows()},
        recordings=recordings.height,
        validation_share=config.validation_share,
        forced_validation=forced,
    )


def _mark_duplicates(frame: pl.DataFrame, config: AsrManifestConfig) -> pl.DataFrame:
    """``duplicate_audio`` then ``duplicate_text_in_recording`` among rows still passing, in frame order.

    The first row of a group (by ``(shard_id, utt_id)``, the frame's order) is kept and named in the
    others' ``_duplicate_detail``. Only passing rows are grouped, with ``is_first_distinct`` and a
    join of the duplicates to their group's first row: no window over the whole frame.
    """
    duration_step = (pl.col("duration_s") * 1000 / config.dedup_duration_resolution_ms).round().cast(pl.Int64)
    passing = frame.with_row_index("_row").filter(pl.col("reason").is_null())
    passing = passing.select(
        "_row",
        "key",
        "audio_sha1",
        # Group keys hashed to one u64 (only compared within this build, so polars' hash need not be
        # stable across versions; a 64-bit collision is negligible).
        pl.struct("recording_key", "clean_text", duration_step).hash(0).alias("_text_group"),
    )
    updates = []
    for group, reason, detail in (
        ("audio_sha1", "duplicate_audio", "same audio as "),
        ("_text_group", "duplicate_text_in_recording", "same text and duration as "),
    ):
        first = pl.col(group).is_first_distinct()
        firsts = passing.filter(first).select(group, pl.col("key").alias("_first_key"))
        duplicates = passing.filter(~first).join(firsts, on=group, how="left", nulls_equal=True)
        updates.append(
            duplicates.select(
                "_row", pl.lit(reason).alias("reason"), (pl.lit(detail) + pl.col("_first_key")).alias("_detail")
            )
        )
        passing = passing.filter(first)
    changed = pl.concat(updates)
    rows = changed["_row"].cast(pl.Int64)
    return frame.with_columns(
        frame["reason"].scatter(rows, changed["reason"]),
        pl.repeat(None, frame.height, dtype=pl.String, eager=True)
        .alias("_duplicate_detail")
        .scatter(rows, changed["_detail"]),
    )
