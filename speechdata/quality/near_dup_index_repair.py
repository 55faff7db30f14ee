"""Keeping the near-duplicate index whole: repair of what is damaged or missing (the order, segments,
their key filters, entries files). Merges and whole-corpus writes: :mod:`.near_dup_index_merge`."""

from __future__ import annotations

import contextlib
import posixpath
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
    verify_filter,
)
from speechdata.quality.near_dup_index_commit import (
    _filter_relative,
    _remove_segment,
    _segment_relative,
    _write_level0,
)
from speechdata.quality.near_dup_index_entries import (
    _entries_bytes,
    entries_table,
    read_shard_entries,
)
from speechdata.quality.near_dup_index_order import (
    COMMITTED,
    DEFAULT_LOCK_TIMEOUT_S,
    IndexDamaged,
    IndexedShard,
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
from speechdata.quality.near_dup_order_members import read_members
from speechdata.quality.near_dup_postings import (
    BLOCK_RECORDS,
    POSTING_DTYPE,
    DamagedSegment,
    UncertainCappedSegment,
    position_of,
    read_blocks,
    read_segment_header,
    uncertain_capped_keys,
    verify_segment,
)

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
