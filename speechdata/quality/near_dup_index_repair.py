"""Keeping the near-duplicate index whole and small: repair of what is damaged or missing (the order,
segments, their key filters, entries files), tiered compaction, and writing a whole ordered corpus."""

from __future__ import annotations

import contextlib
import posixpath
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from speechdata.io import layout
from speechdata.io.parquet_integrity import UnreadableIntermediate
from speechdata.io.storage import TEMP_PREFIX, DataRoot
from speechdata.quality.near_dup_filter import (
    DamagedFilter,
    FilterBuilder,
    filter_name,
    verify_filter,
)
from speechdata.quality.near_dup_index_commit import (
    _filter_relative,
    _remove_segment,
    _remove_unreferenced_segments,
    _segment_relative,
    _write_level0,
)
from speechdata.quality.near_dup_index_entries import (
    _entries_bytes,
    entries_table,
    read_shard_entries,
    remove_unlisted_entries,
)
from speechdata.quality.near_dup_index_order import (
    COMMITTED,
    DEFAULT_LOCK_TIMEOUT_S,
    CorpusIndexBusy,
    IndexDamaged,
    IndexedShard,
    _append,
    _commit_record_relative,
    _FoldedMeanwhile,
    _read_log,
    _state_from_commit_records,
    _write_commit_record,
    _write_state,
    corpus_index_lock,
    read_state,
)
from speechdata.quality.near_dup_matching import Decision, UtteranceSignals
from speechdata.quality.near_dup_order_directory import read_directory
from speechdata.quality.near_dup_order_members import read_members
from speechdata.quality.near_dup_postings import (
    BLOCK_RECORDS,
    POSTING_DTYPE,
    DamagedSegment,
    SegmentShard,
    SegmentWriter,
    UncertainCappedSegment,
    merge_segments,
    position_of,
    read_blocks,
    read_segment_header,
    uncertain_capped_keys,
    verify_segment,
)

FANOUT = 8
"""Segments of one level merged into one of the next level."""
MERGE_CHUNK_POSTINGS = 2_000_000
"""A merge reads and sorts its inputs this many postings at a time (about 60 MB): segments grow
without a size cap while a merge's memory stays bounded."""


def repair_index(
    data_root: DataRoot,
    *,
    damaged_entries: Sequence[str] = (),
    refingerprint: Callable[[str], Sequence[UtteranceSignals]] | None = None,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    **lock_options,
) -> list[str]:
    """Rebuild what is damaged or missing, under the index lock; return what was done, one line each.

    ``shards.parquet`` unreadable: rebuilt from the commit records (reservations are dropped: their
    runs reserve again). A committed shard whose segment is missing, damaged or does not hold it:
    mapped to a segment that holds it, or to a level-0 segment rebuilt from its entries file. A
    shard whose entries file cannot be read (or is named in ``damaged_entries``): its signals
    computed again from its audio (``refingerprint(shard_id)``, in ``utt_id`` order) and its
    representatives taken from its ``near_duplicates.parquet``, at its position; without either, it
    is dropped from the index (its next run indexes it again, at the end)."""
    done: list[str] = []
    with corpus_index_lock(data_root, timeout_s=timeout_s, **lock_options):
        try:
            state = read_state(data_root)
        except IndexDamaged as exc:
            state = _state_from_commit_records(data_root)
            done.append(f"rebuilt shards.parquet from {len(state)} commit records ({exc})")
        else:
            done += _damaged_members(data_root)
        held_by_segment = _healthy_segments(data_root, state)
        done += _repair_filters(data_root, list(held_by_segment))
        repaired = []
        for shard in state:
            kept, line = _repair_shard(data_root, shard, held_by_segment, damaged_entries, refingerprint)
            if kept is not None:
                repaired.append(kept)
            if line:
                done.append(f"{shard.shard_id}: {line}")
        if done:
            _write_state(data_root, repaired)
            for shard in repaired:
                if shard.state == COMMITTED:
                    _write_commit_record(data_root, shard)
    return done


def _damaged_members(data_root: DataRoot) -> list[str]:
    """The shard list's membership filters torn or missing (then written again with the order)."""
    head = _read_log(data_root).head
    try:
        if head is not None and head.members is not None:
            read_members(data_root, head.members, head.parts, head.part_rows)
    except (IndexDamaged, _FoldedMeanwhile) as damaged:  # under the index lock, missing is damage
        return [f"rebuilt the shard list's membership filters ({damaged.args[-1]})"]
    return []


def _repair_shard(
    data_root: DataRoot,
    shard: IndexedShard,
    held_by_segment: dict[str, set[tuple[int, str]]],
    damaged_entries: Sequence[str],
    refingerprint: Callable[[str], Sequence[UtteranceSignals]] | None,
) -> tuple[IndexedShard | None, str | None]:
    """The shard's row after repair (None: dropped) and what was done (None: nothing)."""
    if shard.state != COMMITTED:
        return shard, None
    if shard.shard_id in damaged_entries and not _entries_readable(data_root, shard):
        rebuilt = _rebuild_entries(data_root, shard, refingerprint)
        if rebuilt is None:
            _remove_commit_record(data_root, shard)
            return None, "dropped from the index (entries unreadable, not rebuildable); re-run it"
        return rebuilt, "entries fingerprinted again from its audio"
    key = (shard.position, shard.entries_version)
    if shard.segment in held_by_segment and key in held_by_segment[shard.segment]:
        return shard, None
    holder = next((name for name, held in sorted(held_by_segment.items(), reverse=True) if key in held), None)
    if holder is not None:
        return replace(shard, segment=holder), f"postings found in segment {holder}"
    try:
        entries = read_shard_entries(data_root, shard)
    except (UnreadableIntermediate, FileNotFoundError):
        rebuilt = _rebuild_entries(data_root, shard, refingerprint)
        if rebuilt is None:
            _remove_commit_record(data_root, shard)
            return None, "dropped from the index (entries unreadable); re-run it"
        return rebuilt, "entries and segment fingerprinted again from its audio"
    segment = _write_level0(
        data_root, shard.shard_id, shard.position, shard.entries_version, [signals for signals, _ in entries]
    )
    return replace(shard, segment=segment, utterances=len(entries)), f"segment rebuilt from its entries ({segment})"


def _entries_readable(data_root: DataRoot, shard: IndexedShard) -> bool:
    try:
        read_shard_entries(data_root, shard)
    except (UnreadableIntermediate, FileNotFoundError):
        return False
    return True


def _remove_commit_record(data_root: DataRoot, shard: IndexedShard) -> None:
    with contextlib.suppress(FileNotFoundError):
        data_root.fs.rm_file(data_root.path(_commit_record_relative(shard.shard_id)))


def _rebuild_entries(
    data_root: DataRoot, shard: IndexedShard, refingerprint: Callable[[str], Sequence[UtteranceSignals]] | None
) -> IndexedShard | None:
    """The shard's entries and level-0 segment written again from its audio and its own decisions
    file, at its position; None when either is not there to read."""
    if refingerprint is None or not data_root.exists(layout.near_duplicates(shard.shard_id)):
        return None
    try:
        signals = list(refingerprint(shard.shard_id))
        rows = data_root.read_parquet(layout.near_duplicates(shard.shard_id)).to_pylist()
    except (UnreadableIntermediate, FileNotFoundError):
        return None
    copies = {row["utt_id"]: row for row in rows}
    decisions = [
        Decision(
            s.utt_id,
            copies[s.utt_id]["representative_shard"] if s.utt_id in copies else shard.shard_id,
            copies[s.utt_id]["representative_utt"] if s.utt_id in copies else s.utt_id,
            copies[s.utt_id]["kind"] if s.utt_id in copies else None,
            copies[s.utt_id]["similarity"] if s.utt_id in copies else 1.0,
        )
        for s in signals
    ]
    content, version = _entries_bytes(entries_table(signals, decisions))
    data_root.write_bytes(layout.near_duplicates_index_entries(shard.shard_id, version), content)
    segment = _write_level0(data_root, shard.shard_id, shard.position, version, signals)
    if version != shard.entries_version:
        with contextlib.suppress(FileNotFoundError):
            data_root.fs.rm_file(
                data_root.path(layout.near_duplicates_index_entries(shard.shard_id, shard.entries_version))
            )
    return replace(shard, entries_version=version, segment=segment, utterances=len(signals))


def _healthy_segments(data_root: DataRoot, state: Sequence[IndexedShard]) -> dict[str, set[tuple[int, str]]]:
    """Each segment file whose header and blocks check out, with the (position, version) it holds;
    damaged ones are removed, and so are those whose capped audio postings hold a shard ``state``
    no longer maps to them (:class:`~.near_dup_postings.UncertainCappedSegment`: their members'
    postings are rebuilt from their entries files)."""
    members: dict[str, set[tuple[int, str]]] = defaultdict(set)
    for shard in state:
        if shard.state == COMMITTED and shard.segment is not None:
            members[shard.segment].add((shard.position, shard.entries_version))
    healthy = {}
    for path in data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*.seg"):
        name = posixpath.basename(path)
        if name.startswith(TEMP_PREFIX):
            continue  # a merge still writing it, outside the lock (a killed one's: an orphan, swept once old)
        try:
            with data_root.fs.open(path, "rb") as handle:
                header = verify_segment(handle, name)
                held = {(s.position, s.entries_version) for s in header.shards}
                if held - members[name] and members[name]:
                    live = np.array(sorted(position for position, _ in held & members[name]), np.int64)
                    _check_capped_keys(handle, name, header, live)
        except DamagedSegment:
            _remove_segment(data_root, name)
            continue
        healthy[name] = held
    return healthy


def _check_capped_keys(handle, name: str, header, live: np.ndarray) -> None:
    """Raise :class:`UncertainCappedSegment` where a sampled audio key's capped postings in the
    segment hold a position not in ``live``; read :data:`MERGE_CHUNK_POSTINGS` at a time, a key's
    postings never split between two reads."""
    step, blocks = max(MERGE_CHUNK_POSTINGS // BLOCK_RECORDS, 1), len(header.fences)
    tail = np.empty(0, POSTING_DTYPE)
    for first in range(0, blocks, step):
        postings = np.concatenate([tail, read_blocks(handle, name, header, first, min(first + step, blocks))])
        cut = len(postings)
        if first + step < blocks:  # the last key may go on in the next blocks
            cut = int(np.searchsorted(postings["key"], postings["key"][-1], "left"))
        body, tail = postings[:cut], postings[cut:]
        if len(uncertain_capped_keys(body, ~np.isin(position_of(body["owner"]), live))):
            raise UncertainCappedSegment(name, "a capped audio key holds postings of a shard re-indexed since")


def _repair_filters(data_root: DataRoot, segments: Sequence[str]) -> list[str]:
    """Rebuild the key filter of each of ``segments`` whose filter is missing or damaged, from the
    segment's postings; return what was done, one line each."""
    done = []
    for name in sorted(segments):
        try:
            with data_root.fs.open(data_root.path(_filter_relative(name)), "rb") as handle:
                verify_filter(handle, _filter_relative(name), name)
            continue
        except (FileNotFoundError, DamagedFilter) as exc:
            reason = "missing" if isinstance(exc, FileNotFoundError) else "damaged"
        relative = _segment_relative(name)
        try:
            with data_root.fs.open(data_root.path(relative), "rb") as handle:
                header = read_segment_header(handle, relative)
                builder = FilterBuilder(header.records)
                step = max(MERGE_CHUNK_POSTINGS // BLOCK_RECORDS, 1)
                for first in range(0, len(header.fences), step):
                    end = min(first + step, len(header.fences))
                    builder.add(read_blocks(handle, relative, header, first, end)["key"])
        except (FileNotFoundError, DamagedSegment):
            continue  # the segment itself is repaired by the shards that need it
        with data_root.open_atomic(_filter_relative(name)) as output:
            for piece in builder.finish(name):
                output.write(piece)
        done.append(f"filter of segment {name} rebuilt ({reason})")
    return done


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
