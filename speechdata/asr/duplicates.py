"""Deduplication of the ASR manifest's passing rows (step 4 of :mod:`speechdata.asr.manifest`).

The same audio content (hash of the 16 kHz PCM), or the same cleaned text and duration within one
recording: the first row by ``(shard_id, utt_id)`` is kept, the others are removed with a
``detail`` naming it.
"""

from __future__ import annotations

import polars as pl


def _audio_group() -> pl.Expr:
    return pl.col("audio_sha1").hash(0)


def mark_duplicates(passing: pl.DataFrame, duration_resolution_ms: int) -> pl.DataFrame:
    """``duplicate_audio`` then ``duplicate_text_in_recording`` among rows still passing, in key order.

    The first row of a group (by ``(shard_id, utt_id)``, the frame's order) is kept and named in the
    others' ``detail``. Only rows whose ``reason`` is null are grouped, with ``is_first_distinct``
    and a join of the duplicates to their group's first row: no window over the whole frame.
    """
    duration_step = (pl.col("duration_s") * 1000 / duration_resolution_ms).round().cast(pl.Int64)
    # Narrow first: filtering the whole frame would copy every column.
    candidates = (
        passing.select(
            pl.int_range(pl.len(), dtype=pl.UInt32).alias("_passing_row"),
            "reason",
            "shard_id",
            "utt_id",
            "audio_sha1",
            # Audio hashes grouped by a u64 of the string (checked below: a collision falls back to
            # the strings).
            _audio_group().alias("_audio_group"),
            # Group keys hashed to one u64 (only compared within this build, so polars' hash need not
            # be stable across versions; a 64-bit collision is negligible).
            pl.struct("recording_key", "clean_text", duration_step).hash(0).alias("_text_group"),
        )
        .filter(pl.col("reason").is_null())
        .drop("reason")
    )
    updates = []
    for groups, reason, detail in (
        (("_audio_group", "audio_sha1"), "duplicate_audio", "same audio as "),
        (("_text_group",), "duplicate_text_in_recording", "same text and duration as "),
    ):
        for group in groups:
            # A Series, not an expression: it is used three times and would be recomputed each time.
            first = candidates[group].is_first_distinct()
            firsts = candidates.filter(first).select(
                group, pl.col("shard_id", "utt_id").name.prefix("_first_"), pl.col(groups[-1]).alias("_first_value")
            )
            # Inner, not left: every duplicate has its first, and the inner join hashes the smaller side.
            duplicates = candidates.filter(~first).join(firsts, on=group, how="inner", nulls_equal=True)
            if bool(duplicates[groups[-1]].eq_missing(duplicates["_first_value"]).all()):
                break
        updates.append(
            duplicates.select(
                "_passing_row",
                pl.lit(reason).alias("reason"),
                # The key string only for the few duplicates, not for every passing row.
                (pl.lit(detail) + pl.col("_first_shard_id") + pl.lit("/") + pl.col("_first_utt_id")).alias("detail"),
            )
        )
        candidates = candidates.filter(first)
    changed = pl.concat(updates)
    rows = changed["_passing_row"].cast(pl.Int64)
    return passing.with_columns(
        passing["reason"].scatter(rows, changed["reason"]),
        passing["detail"].scatter(rows, changed["detail"]),
    )
