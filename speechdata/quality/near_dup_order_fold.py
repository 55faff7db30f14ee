"""Writing the near-duplicate index's shard list (under the index lock): a change as one record,
and the fold of the records into the snapshot's parts and head every :data:`FOLD_EVERY` records
(docs/near-duplicates.md, "The shard list: a snapshot and records"); read by :mod:`.near_dup_order_log`."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence
from dataclasses import replace

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from speechdata.io import layout
from speechdata.io.parquet_integrity import WRITE_OPTIONS
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_order_log import (
    HEAD,
    IndexDamaged,
    _FoldedMeanwhile,
    _Head,
    _listed_parts,
    _listed_records,
    _next_position,
    _OrderHead,
    _OrderView,
    _part_relative,
    _read_base,
    _read_log,
    _read_part,
    _record_relative,
    _sealed,
    _view_of,
)
from speechdata.quality.near_dup_order_members import (
    members_filter,
    read_members,
    remove_unnamed_members,
    write_members,
)
from speechdata.quality.near_dup_order_rows import (
    ORDER_SCHEMA,
    RESERVED,
    Change,
    IndexedShard,
    _all_applied,
    _row_of,
    _shard_of,
    _shards_of_table,
    summary_of,
)

PART_ROWS = 2_048
"""Positions per part of the snapshot: part ``k`` holds the rows at positions ``k * PART_ROWS`` to
``(k + 1) * PART_ROWS - 1``. An index keeps the size its head names; a whole rewrite (a repair, a
migration) takes this one."""
FOLD_EVERY = 64
"""Records after the snapshot that make the writer of the last one fold them into the snapshot: a
reservation or commit writes one small record, and one in this many also rewrites the parts those
records touch (the last part, mostly); a reader reads at most this many records."""


def _append(
    data_root: DataRoot,
    read: _OrderView | _OrderHead,
    upserts: Sequence[IndexedShard] = (),
    removed: Sequence[int] = (),
) -> None:
    """Record a change to the order as ``read`` (under the index lock): one record, the commit point;
    the writer of every :data:`FOLD_EVERY`-th record after the snapshot folds them into it (and the
    first record written over the earlier layout takes it over)."""
    seq = read.last + 1
    body = {"seq": seq, "upsert": [_row_of(shard) for shard in upserts], "remove": sorted(removed)}
    data_root.write_bytes(_record_relative(seq), _sealed(body))
    if seq - read.through >= FOLD_EVERY or read.legacy:
        _fold(data_root)


def _table_of(shards: Sequence[IndexedShard]) -> pa.Table:
    return pa.Table.from_pylist([_row_of(shard) for shard in shards], schema=ORDER_SCHEMA)


def _part_bytes(table: pa.Table) -> bytes:
    """The part's file: its rows by position, one chunk (the same bytes however they were gathered)."""
    table = table.cast(ORDER_SCHEMA).sort_by("position").combine_chunks()
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", **WRITE_OPTIONS)
    return sink.getvalue().to_pybytes()


def _write_part(data_root: DataRoot, part: int, table: pa.Table) -> str:
    content = _part_bytes(table)
    name = f"{part:08d}-{hashlib.sha256(content).hexdigest()[:16]}.parquet"
    data_root.write_bytes(_part_relative(name), content)  # again when present: it may be a damaged one
    return name


def _part_folded(part: pa.Table | None, changes: Sequence[Change]) -> pa.Table:
    """``part`` (None: no rows yet) with ``changes`` (their rows of this part) applied: the rows no
    change names are kept as Arrow columns (no row object each); only the shards the changes set are
    replayed row by row."""
    named = sorted({shard.shard_id for upserts, _ in changes for shard in upserts})
    dropped = sorted({position for _, removed in changes for position in removed})
    if part is None:
        return _table_of(_all_applied([], changes))
    ids = part.column("shard_id")
    named_rows = part.filter(pc.is_in(ids, pa.array(named, pa.string())))
    replayed = _all_applied([_shard_of(row) for row in named_rows.to_pylist()], changes)
    untouched = pc.invert(
        pc.or_(
            pc.is_in(ids, pa.array(named, pa.string())),
            pc.is_in(part.column("position"), pa.array(dropped, pa.int64())),
        )
    )
    return pa.concat_tables([part.filter(untouched).cast(ORDER_SCHEMA), _table_of(replayed)])


def _fold(data_root: DataRoot) -> None:
    """Fold every record into the snapshot (under the index lock): rewrite the parts holding the
    positions the records set or drop, then the head (the commit point), then remove the records it
    holds, the parts it no longer names and an earlier layout's ``shards.parquet``. A run killed
    before the head leaves parts no head names (never read, removed by the next fold); after it,
    records at or before ``through`` (never read, removed by the next fold)."""
    log = _read_log(data_root)
    head = log.head
    if head is None or head.summary is None:
        # The first fold, the earlier layout taken over, or a head written before part summaries and
        # membership filters (its parts may list a shard twice: rewritten once, every row, as read).
        part_rows = PART_ROWS if head is None else head.part_rows
        _write_snapshot(data_root, _view_of(data_root, log).shards, log.last, _next_position(log), part_rows)
        return
    parts, summary = dict(head.parts), dict(head.summary)
    members = _read_members_locked(data_root, head)
    touched = {shard.position // head.part_rows for upserts, _ in log.changes for shard in upserts}
    touched |= {position // head.part_rows for _, removed in log.changes for position in removed}
    for part in sorted(touched):
        table = _part_folded(
            None if part not in parts else _read_part_locked(data_root, parts[part], head),
            [([s for s in upserts if s.position // head.part_rows == part], gone) for upserts, gone in log.changes],
        )
        if table.num_rows:
            parts[part] = _write_part(data_root, part, table)
            summary[part] = summary_of(_shards_of_table(table))
            members[part] = members_filter(table.column("shard_id").to_pylist(), head.part_rows)
        else:
            parts.pop(part, None)
            summary.pop(part, None)
            members.pop(part, None)
    reserved = [shard for shard in _all_applied(head.reserved, log.changes) if shard.state == RESERVED]
    head = _Head(log.last, _next_position(log), head.part_rows, parts, reserved, summary)
    _commit_snapshot(data_root, replace(head, members=write_members(data_root, members)))


def _read_members_locked(data_root: DataRoot, head: _Head) -> dict[int, bytes]:
    try:
        return read_members(data_root, head.members, head.parts, head.part_rows) if head.members else {}
    except _FoldedMeanwhile as moved:
        raise IndexDamaged(moved.args[1]) from None


def _read_part_locked(data_root: DataRoot, name: str, head: _Head) -> pa.Table:
    """A part read by the folding writer (under the index lock nothing replaces it: gone is damage)."""
    try:
        return _read_part(data_root, name, head)
    except _FoldedMeanwhile as moved:
        raise IndexDamaged(moved.args[1]) from None


def _write_snapshot(
    data_root: DataRoot, shards: Sequence[IndexedShard], through: int, next_position: int, part_rows: int
) -> None:
    """Write every part of ``shards`` and a head through record ``through``."""
    by_part: dict[int, list[IndexedShard]] = {}
    for shard in shards:
        by_part.setdefault(shard.position // part_rows, []).append(shard)
    parts = {part: _write_part(data_root, part, _table_of(rows)) for part, rows in sorted(by_part.items())}
    summary = {part: summary_of(rows) for part, rows in by_part.items()}
    members = {part: members_filter([shard.shard_id for shard in rows], part_rows) for part, rows in by_part.items()}
    reserved = [shard for shard in shards if shard.state == RESERVED]
    head = _Head(through, next_position, part_rows, parts, reserved, summary)
    _commit_snapshot(data_root, replace(head, members=write_members(data_root, members)))


def _commit_snapshot(data_root: DataRoot, head: _Head) -> None:
    body = {
        "through": head.through,
        "next_position": head.next_position,
        "part_rows": head.part_rows,
        "parts": {f"{part:08d}": name for part, name in sorted(head.parts.items())},
        "reserved": [_row_of(shard) for shard in sorted(head.reserved, key=lambda s: s.position)],
        "summary": {f"{part:08d}": body.body() for part, body in sorted((head.summary or {}).items())},
        "members": head.members,
    }
    data_root.write_bytes(HEAD, _sealed(body))
    for seq, path in sorted(_listed_records(data_root).items()):
        if seq <= head.through:
            with contextlib.suppress(FileNotFoundError):
                data_root.fs.rm_file(path)
    named = set(head.parts.values())
    for name, path in _listed_parts(data_root).items():
        if name not in named:
            with contextlib.suppress(FileNotFoundError):
                data_root.fs.rm_file(path)
    remove_unnamed_members(data_root, head.members)
    with contextlib.suppress(FileNotFoundError):
        data_root.fs.rm_file(data_root.path(layout.near_duplicates_index_order()))


def _write_state(data_root: DataRoot, shards: Sequence[IndexedShard]) -> None:
    """Replace the whole order with ``shards`` (a repair, a whole-corpus write): a snapshot through
    every record there is, which are then removed."""
    records = _listed_records(data_root)
    try:
        through = _read_base(data_root)[0]
    except IndexDamaged:
        through = -1
    _write_snapshot(
        data_root,
        shards,
        max([through, *records]),
        max([-1, *(shard.position for shard in shards)]) + 1,
        PART_ROWS,
    )
