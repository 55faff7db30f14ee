"""Keeping the near-duplicate index small: tiered compaction (one merge per call, its switch under the
index lock), the sweep of segments no row names, and writing a whole ordered corpus at once.
Repair of what is damaged: :mod:`.near_dup_index_repair`."""

from __future__ import annotations

import contextlib
import posixpath
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_filter import FilterBuilder, filter_name
from speechdata.quality.near_dup_index_commit import (
    _filter_relative,
    _remove_unreferenced_segments,
    _segment_relative,
    _write_level0,
)
from speechdata.quality.near_dup_index_entries import _entries_bytes, entries_table, remove_unlisted_entries
from speechdata.quality.near_dup_index_order import (
    COMMITTED,
    DEFAULT_LOCK_TIMEOUT_S,
    CorpusIndexBusy,
    IndexDamaged,
    IndexedShard,
    _append,
    _FoldedMeanwhile,
    _write_commit_record,
    _write_state,
    corpus_index_lock,
)
from speechdata.quality.near_dup_index_repair import MERGE_CHUNK_POSTINGS, repair_index
from speechdata.quality.near_dup_matching import Decision, UtteranceSignals
from speechdata.quality.near_dup_order_directory import read_directory
from speechdata.quality.near_dup_postings import (
    DamagedSegment,
    SegmentShard,
    SegmentWriter,
    UncertainCappedSegment,
    merge_segments,
    read_segment_header,
)

FANOUT = 8
"""Segments of one level merged into one of the next level."""


def _level(name: str) -> int:
    return int(name.split("-", 1)[0].removeprefix("L"))


def compact_index(
    data_root: DataRoot,
    *,
    max_level: int | None = None,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    **lock_options,
) -> str | None:
    """Merge the :data:`FANOUT` earliest segments of the lowest level that has that many into one
    segment of the next level (one merge per call; only one creating at most ``max_level``, None:
    any); return its name, or None when nothing was due. The merge runs outside the index lock; the
    switch (shards remapped, only where they still point at the merged segments with the same
    entries version) under it. None also when another compaction switched the same inputs first."""
    try:
        directory = read_directory(data_root)
        lowest = directory.lowest_positions()
    except IndexDamaged:
        return None  # repaired by the next run that needs it
    _sweep_orphans(data_root, **lock_options)
    due = _due_merge(lowest, max_level)
    if due is None:
        return None
    level, inputs = due
    try:  # the rows mapped to the merged segments: the parts whose summaries name them
        directory.load_parts_of(set(inputs))
    except _FoldedMeanwhile:
        return None  # the next shard's run merges them
    members = {(s.position, s.entries_version): s for s in directory.committed() if s.segment in inputs}
    try:
        merged = _write_merged(data_root, inputs, members, level + 1)
    except UncertainCappedSegment:
        # An input's capped postings hold a shard re-indexed since: rebuilt by the repair (its
        # members as level-0 segments again), merged by a later call.
        repair_index(data_root, timeout_s=timeout_s, **lock_options)
        return None
    if merged is None:
        return None
    with corpus_index_lock(data_root, timeout_s=timeout_s, **lock_options):
        try:
            current = read_directory(data_root)
            current.load_parts_of(set(inputs))  # under the lock nothing folds them away
        except IndexDamaged:
            return None
        switched = [
            replace(s, segment=merged)
            for s in current.committed()
            if s.segment in inputs and (s.position, s.entries_version) in members
        ]
        # Under the lock, where orphans are swept: what is here now stays here once named. A sweep
        # may have taken it meanwhile (a merge written over an hour); then the next call merges again.
        written = all(data_root.exists(relative) for relative in (_segment_relative(merged), _filter_relative(merged)))
        if switched and written:  # none: another compaction switched these inputs first
            _append(data_root, current, switched)
    _remove_unreferenced_segments(data_root, set(inputs) | {merged})
    return merged if switched and written else None


def _due_merge(lowest: dict[str, int], max_level: int | None = None) -> tuple[int, list[str]] | None:
    """``(level, the FANOUT earliest segments of it)`` for the lowest level that has that many (if
    the merge creates at most ``max_level``); ``lowest``: each live segment's lowest position."""
    by_level: dict[int, list[str]] = defaultdict(list)
    for name in lowest:
        by_level[_level(name)].append(name)
    for level in sorted(by_level):
        if max_level is not None and level + 1 > max_level:
            return None
        names = sorted(by_level[level], key=lambda name: lowest[name])
        if len(names) >= FANOUT:
            return level, names[:FANOUT]
    return None


def _write_merged(
    data_root: DataRoot, inputs: list[str], members: dict[tuple[int, str], IndexedShard], level: int
) -> str | None:
    """Merge ``inputs`` (keeping only ``members``' postings) into one segment of ``level``, streamed;
    its name, or None when an input is gone or damaged (the next run that reads it repairs it)."""
    shards = [SegmentShard(p, members[(p, v)].shard_id, v) for p, v in sorted(members)]
    with contextlib.ExitStack() as stack:
        opened = []
        for name in inputs:
            relative = _segment_relative(name)
            try:
                handle = stack.enter_context(data_root.fs.open(data_root.path(relative), "rb"))
                header = read_segment_header(handle, relative)
            except (FileNotFoundError, DamagedSegment):
                return None  # repaired by the next run that reads it
            held = {(s.position, s.entries_version) for s in header.shards}
            mine = [key for key, shard in members.items() if shard.segment == name]
            if not all(key in held for key in mine):
                return None
            # Only the positions the order maps to this segment: it may also hold an older version
            # of a shard since re-indexed elsewhere.
            opened.append((handle, relative, header, np.array([position for position, _ in mine], np.int64)))
        writer = SegmentWriter(key_filter=FilterBuilder(sum(header.records for _, _, header, _ in opened)))
        try:
            merge_segments(opened, writer, MERGE_CHUNK_POSTINGS)
        except UncertainCappedSegment:
            raise
        except DamagedSegment:
            return None
    merged, pieces = writer.finish(level, shards)
    # The segment first, then its filter: both are then young when the switch names them, however
    # long the segment took to write (an orphan sweep judges each file by its own age).
    with data_root.open_atomic(_segment_relative(merged)) as output:
        for piece in pieces:
            output.write(piece)
    with data_root.open_atomic(_filter_relative(merged)) as output:
        for piece in writer.key_filter.finish(merged):
            output.write(piece)
    return merged


ORPHAN_GRACE_S = 3_600.0
"""A segment no row names is removed once it is this old: younger ones may be a commit or a merge
still on its way to naming it."""


def _sweep_orphans(data_root: DataRoot, **lock_options) -> int:
    """:func:`_remove_orphan_segments` against the order read under the index lock, if it is free now
    (else nothing: the next call sweeps). Segments are written under the lock (a commit, a repair, a
    whole-corpus rebuild, for as long as it takes) or by a merge, which names them only under it: a
    sweep under the lock never takes one of those for an orphan, however old."""
    try:
        with corpus_index_lock(data_root, timeout_s=0.0, **lock_options):
            return _remove_orphan_segments(data_root, set(read_directory(data_root).lowest_positions()))
    except (CorpusIndexBusy, IndexDamaged):
        return 0


def _remove_orphan_segments(data_root: DataRoot, referenced: set[str]) -> int:
    """Delete segments no committed shard maps to (a run killed between writing its level-0 segment
    and its commit, a merge that lost its switch) once :data:`ORPHAN_GRACE_S` old; return how many."""
    removed = 0
    now = time.time()
    referenced = referenced | {filter_name(name) for name in referenced}
    folder = f"{layout.NEAR_DUPLICATES_INDEX}/segments"
    for path in data_root.glob(f"{folder}/*.seg") + data_root.glob(f"{folder}/*.seg.filter"):
        if posixpath.basename(path) in referenced:
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - data_root.fs.modified(path).timestamp() >= ORPHAN_GRACE_S:
                data_root.fs.rm_file(path)
                removed += 1
    return removed


def write_index(
    data_root: DataRoot, shards: Sequence[tuple[str, Sequence[UtteranceSignals], Sequence[Decision]]]
) -> list[IndexedShard]:
    """Index a whole corpus at once, in the given order (positions 0, 1, ...), as the incremental
    path would have: for a batch pass that decided every shard with :func:`decide_shard` against
    the shards before it. Replaces any index there was; then compacts it."""
    committed = []
    with corpus_index_lock(data_root):
        for position, (shard_id, signals, decisions) in enumerate(shards):
            content, version = _entries_bytes(entries_table(signals, decisions))
            data_root.write_bytes(layout.near_duplicates_index_entries(shard_id, version), content)
            segment = _write_level0(data_root, shard_id, position, version, signals)
            shard = IndexedShard(position, shard_id, version, len(signals), COMMITTED, segment)
            _write_commit_record(data_root, shard)
            remove_unlisted_entries(data_root, shard_id, version)
            committed.append(shard)
        _write_state(data_root, committed)
    while compact_index(data_root):
        pass
    return committed
