"""Utterances left-joined with their FLAC index, in ``(shard_id, utt_id)`` order, without a two-key join.

The manifest build needs both: the join and the key order (deduplication keeps the first row by
key, and every output is in key order). A hash join on two string columns followed by a sort on
them was a third of the build. Here each side gets one string key, ``shard_id + NUL + utt_id``,
whose byte order is the order of the pair as long as no ``shard_id`` holds a NUL; then

* when the FLAC index lists the same keys in the same order (one FLAC per utterance), the join is a
  horizontal concatenation;
* otherwise both sides are put in key order and each FLAC row finds its utterance by binary search.

Either way the order comes from one sort on that single key (skipped when already in order).
Keys that are null, contain the separator or repeat return ``None``: the caller keeps the general
join, whose output for repeated keys depends on the sort's tie order anyway.
"""

from __future__ import annotations

import polars as pl

KEYS = ["shard_id", "utt_id"]
KEY_SEPARATOR = "\x00"


def _single_key(frame: pl.DataFrame) -> pl.Series:
    return frame.select(pl.concat_str(KEYS, separator=KEY_SEPARATOR).alias("_key")).to_series()


def _strictly_increasing(keys: pl.Series) -> bool:
    if keys.len() < 2:
        return True
    return bool((keys.slice(1) > keys.slice(0, keys.len() - 1)).all())


def _in_key_order(frame: pl.DataFrame, keys: pl.Series) -> tuple[pl.DataFrame, pl.Series]:
    if _strictly_increasing(keys):
        return frame, keys
    order = keys.arg_sort()
    return frame[order], keys.gather(order)


def join_flac_in_key_order(
    utterances: pl.DataFrame, flac: pl.DataFrame
) -> tuple[pl.DataFrame, pl.Series | None] | None:
    """``utterances.join(flac, on=KEYS, how="left")`` and the permutation that puts it in key order
    (``None``: it already is), or ``None`` where keys do not allow it.

    The permutation is returned rather than applied so that the caller moves only the columns each
    part of its rows needs. Both frames are already conformed (string keys). Columns come out in
    the join's order: every utterance column, then the FLAC columns other than the keys.
    """
    if (
        utterances.height == 0
        or utterances.select(pl.col("shard_id").str.contains(KEY_SEPARATOR, literal=True).any()).item()
    ):
        return None
    utterance_keys = _single_key(utterances)
    if utterance_keys.null_count():
        return None
    flac_values = flac.drop(KEYS)
    if flac.height == utterances.height and all(bool(utterances[key].eq_missing(flac[key]).all()) for key in KEYS):
        if _strictly_increasing(utterance_keys):
            return utterances.hstack(flac_values), None
        order = utterance_keys.arg_sort()
        if not _strictly_increasing(utterance_keys.gather(order)):
            return None
        return utterances.hstack(flac_values), order
    utterances, utterance_keys = _in_key_order(utterances, utterance_keys)
    if not _strictly_increasing(utterance_keys):
        return None
    flac_keys = _single_key(flac)
    present = flac_keys.is_not_null()
    flac_values, flac_keys = _in_key_order(flac_values.filter(present), flac_keys.filter(present))
    if not _strictly_increasing(flac_keys):
        return None
    # Each FLAC key's place among the utterance keys; a FLAC row whose key is not there is dropped,
    # as a left join drops it.
    rows = utterance_keys.search_sorted(flac_keys, side="left").cast(pl.UInt32)
    found = utterance_keys.gather(rows.clip(0, utterances.height - 1)) == flac_keys
    rows = rows.filter(found)
    joined = (
        utterances.with_row_index("_row")
        .join(flac_values.filter(found).with_columns(rows.alias("_row")), on="_row", how="left", maintain_order="left")
        .drop("_row")
    )
    return joined, None
