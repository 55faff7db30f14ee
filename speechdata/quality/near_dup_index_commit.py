"""Committing a shard to the near-duplicate index: its entries file, its level-0 segment with the
segment's key filter (both before the index lock: content-addressed, written atomically), then its
row in the order (one record) under the index lock."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import numpy as np

from speechdata.io import layout
from speechdata.io.shard_lock import LockHolder
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_filter import (
    filter_bytes,
    filter_name,
)
from speechdata.quality.near_dup_index_entries import (
    _entries_bytes,
    entries_table,
    note_entries_written,
    remove_written_entries,
)
from speechdata.quality.near_dup_index_order import (
    COMMITTED,
    DEFAULT_LOCK_TIMEOUT_S,
    RESERVED,
    IndexedShard,
    Reservation,
    ReservationLost,
    _append,
    _commit_record,
    _commit_record_relative,
    _read_head,
    _write_commit_record,
    corpus_index_lock,
)
from speechdata.quality.near_dup_matching import Decision, UtteranceSignals
from speechdata.quality.near_dup_order_directory import read_directory
from speechdata.quality.near_dup_postings import (
    SegmentShard,
    index_keys,
    segment_bytes,
    segment_name,
)


def _segment_relative(name: str) -> str:
    return f"{layout.NEAR_DUPLICATES_INDEX}/segments/{name}"


def _filter_relative(segment: str) -> str:
    return _segment_relative(filter_name(segment))


def _write_level0(
    data_root: DataRoot,
    shard_id: str,
    position: int,
    version: str,
    signals,
    postings: np.ndarray | None = None,
    *,
    rewrite: bool = False,
) -> str:
    """The shard's level-0 segment, its key filter written first (a segment never lacks one for long:
    a run killed between the two leaves a filter no segment names, removed once old). ``postings``:
    :func:`~.near_dup_postings.index_keys` of ``signals`` at ``position``, when built already.
    ``rewrite``: written even where a file of that name is there (the same bytes, a new file), so
    that a killed run's copy, perhaps nearly an hour old, is not taken for an orphan and removed
    before the commit that names it."""
    postings = index_keys(signals, position) if postings is None else postings
    content = segment_bytes(postings, 0, [SegmentShard(position, shard_id, version)])
    name = segment_name(content, 0)
    if rewrite or not data_root.exists(_filter_relative(name)):
        data_root.write_bytes(_filter_relative(name), filter_bytes(postings["key"], name))
    if rewrite or not data_root.exists(_segment_relative(name)):
        data_root.write_bytes(_segment_relative(name), content)
    return name


def _remove_segment(data_root: DataRoot, name: str) -> None:
    """Delete a segment and its filter (the segment first: a filter alone is never read)."""
    for relative in (_segment_relative(name), _filter_relative(name)):
        with contextlib.suppress(FileNotFoundError):
            data_root.fs.rm_file(data_root.path(relative))


def commit_shard_entries(
    data_root: DataRoot,
    reservation: Reservation,
    signals: Sequence[UtteranceSignals],
    decisions: Sequence[Decision],
    *,
    postings: np.ndarray | None = None,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> IndexedShard:
    """Write the shard's entries and level-0 segment, then its commit record and its row under the
    index lock; remove what it replaced. ``postings``: the shard's
    :func:`~.near_dup_postings.index_keys` at its position, when the caller built them. Raises
    :class:`ReservationLost` when the reservation was dropped meanwhile (nothing is committed:
    reserve and decide again; a level-0 segment written for it is removed once old, unless the
    re-run at the same position names it)."""
    content, version = _entries_bytes(entries_table(signals, decisions))
    entries_relative = layout.near_duplicates_index_entries(reservation.shard_id, version)
    note_entries_written(data_root, reservation.shard_id, version)  # before the file: never left unnamed
    if not data_root.exists(entries_relative):
        data_root.write_bytes(entries_relative, content)
    # The level-0 segment and its filter before the lock, so that the lock is held for the records
    # only (writing them took most of a commit, and simultaneous shards queued behind it). Its name
    # is its content's digest and each file is moved into place whole: a run killed before its
    # commit leaves a segment no row names (removed once old, or named by the re-run, which writes
    # the same bytes at the same position). Not for a re-run whose commit record already names
    # this version: its segment is there, merged or not, and a new level-0 one would be an orphan.
    planned = IndexedShard(reservation.position, reservation.shard_id, version, len(signals), COMMITTED)
    written = None
    if not _committed_as(data_root, planned):
        written = _write_level0(
            data_root, reservation.shard_id, reservation.position, version, signals, postings, rewrite=True
        )
    with corpus_index_lock(data_root, timeout_s=timeout_s, run_id=run_id, holder_finished=holder_finished):
        head = _read_head(data_root, reservation.shard_id)
        mine = head.mine
        if mine is None or mine.position != reservation.position:
            raise ReservationLost(f"{reservation.shard_id} lost index position {reservation.position}")
        if mine.state == RESERVED and mine.reservation != reservation.token:
            raise ReservationLost(f"{reservation.shard_id}'s reservation of position {reservation.position} was taken")
        unchanged = mine.state == COMMITTED and mine.entries_version == version and _segment_present(data_root, mine)
        if unchanged:
            committed = mine
            _write_commit_record(data_root, committed)  # nothing written when it is there already
        else:
            if mine.state == COMMITTED and mine.entries_version:  # the version this commit replaces
                note_entries_written(data_root, reservation.shard_id, mine.entries_version)
            segment = written or _write_level0(
                data_root, reservation.shard_id, reservation.position, version, signals, postings
            )
            committed = IndexedShard(
                reservation.position, reservation.shard_id, version, len(signals), COMMITTED, segment
            )
            # The commit record first: a reservation finds a committed shard's row by the position
            # it names (a run killed between the two leaves a record naming a reserved row, which
            # the order, read first, overrules).
            _write_commit_record(data_root, committed)
            _append(data_root, head, [committed])
    if not unchanged and mine.state == COMMITTED:
        _remove_unreferenced_segments(data_root, {mine.segment} - {None})
    if unchanged and written not in (None, mine.segment):  # its commit record was lost: written for nothing
        _remove_unreferenced_segments(data_root, {written})
    remove_written_entries(data_root, reservation.shard_id, version)
    return committed


def _committed_as(data_root: DataRoot, shard: IndexedShard) -> bool:
    """Whether ``shard``'s commit record is there and names this very commit (read without the lock:
    it only decides whether the level-0 segment is written before it)."""
    try:
        return data_root.fs.cat_file(data_root.path(_commit_record_relative(shard.shard_id))) == _commit_record(shard)
    except FileNotFoundError:
        return False


def _segment_present(data_root: DataRoot, shard: IndexedShard) -> bool:
    return shard.segment is not None and data_root.exists(_segment_relative(shard.segment))


def _remove_unreferenced_segments(data_root: DataRoot, candidates: set[str]) -> None:
    if not candidates:
        return
    referenced = set(read_directory(data_root).lowest_positions())  # every part's segments, from its summary
    for name in candidates - referenced:
        _remove_segment(data_root, name)
