"""The manifest's cheap filters (step 2 of :mod:`speechdata.asr.manifest`, before cleaning) and the
rows they reject, in ``(shard_id, utt_id)`` order.

Every output of the build is in key order, and deduplication keeps the first row by key; the
FLAC index is joined in that order by :mod:`speechdata.asr.key_order` (or, where keys do not allow
it, a two-key join and sort).
"""

from __future__ import annotations

import polars as pl

from speechdata.asr.key_order import join_flac_in_key_order

KEY = ["shard_id", "utt_id"]

REMOVAL_REASONS = (
    "no_flac",
    "missing_language",
    "duration_out_of_range",
    "quality_below_minimum",
    "empty_text",
    "empty_after_cleaning",
    "duplicate_audio",
    "duplicate_text_in_recording",
)

REASON = pl.Enum(REMOVAL_REASONS)

REPORT = (pl.col("_row", "shard_id", "utt_id"), pl.col("reason").cast(pl.String))
"""``removed``'s columns but ``detail`` (and ``_row``, a row's place in key order) from rows with ``reason``."""


def rejected_report(rejected: pl.DataFrame) -> pl.DataFrame:
    """``removed``'s rows (with ``_row``, not in order) for the rows the cheap filters rejected.

    Each reason's detail is formatted on its own rows only: a when/then chain formats every row both ways.
    """
    lazy = rejected.lazy()
    formatted = ["duration_out_of_range", "quality_below_minimum"]
    parts = [
        lazy.filter(pl.col("reason") == "duration_out_of_range").select(
            *REPORT, pl.format("duration {} s", pl.col("duration_s").round(3)).alias("detail")
        ),
        lazy.filter(pl.col("reason") == "quality_below_minimum").select(
            *REPORT, pl.format("quality {}", pl.col("quality")).alias("detail")
        ),
        lazy.filter(~pl.col("reason").is_in(formatted)).select(*REPORT, pl.lit("").alias("detail")),
    ]
    return pl.concat(pl.collect_all(parts))


def quality_ok(min_quality: float | None) -> pl.Expr:
    """Quality at least ``min_quality`` (a null quality is not); every row where it is None."""
    return pl.lit(True) if min_quality is None else (pl.col("quality") >= min_quality).fill_null(False)


def filtered_in_key_order(
    utterances: pl.DataFrame,
    flac: pl.DataFrame,
    *,
    min_duration_s: float,
    max_duration_s: float,
    min_quality: float | None,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """The filters up to the cleaning, first failure first: ``(passing, rejected, joined)``.

    ``passing``: the rows the cheap filters keep, in ``(shard_id, utt_id)`` order, with every column
    and ``_row``, a row's place in that order; ``rejected``: the
    others, in that order, with only what ``removed`` reports and ``reason``; ``joined``:
    utterances left-joined with the FLAC index (in any order).
    """
    joined_in_order = join_flac_in_key_order(utterances, flac)
    if joined_in_order is None:
        joined_in_order = utterances.join(flac, on=KEY, how="left").sort(KEY), None
    joined, order = joined_in_order
    # As an enum until the rows are reported: a chain of string literals builds a string column per step.
    reason = (
        pl.when(pl.col("flac_path").is_null())
        .then(pl.lit("no_flac", REASON))
        .when(pl.col("language").is_null())
        .then(pl.lit("missing_language", REASON))
        .when(~pl.col("duration_s").is_between(min_duration_s, max_duration_s))
        .then(pl.lit("duration_out_of_range", REASON))
        .when(~quality_ok(min_quality))
        .then(pl.lit("quality_below_minimum", REASON))
    )
    frame = joined.with_columns(reason.alias("reason"))
    # Rows that passed take every column along, the others only what ``removed`` reports.
    is_passing = frame["reason"].is_null()
    positions = pl.int_range(frame.height, dtype=pl.UInt32, eager=True).alias("_row")
    report_columns = ["shard_id", "utt_id", "reason", "duration_s", "quality"]
    if order is None:
        passing, rejected = frame.filter(is_passing), frame.select(report_columns).filter(~is_passing)
    else:
        passing_in_order = is_passing.gather(order)
        passing = frame[order.filter(passing_in_order)]
        rejected = frame.select(report_columns)[order.filter(~passing_in_order)]
        is_passing = passing_in_order
    return (
        passing.with_columns(positions.filter(is_passing)),
        rejected.with_columns(positions.filter(~is_passing)),
        joined,
    )
