"""Reading the near-duplicate index's shard list: the snapshot and the checksummed records after it
(``order/<seq>.json``), read together (docs/near-duplicates.md, "The shard list: a snapshot and
records"). Its rows: :mod:`.near_dup_order_rows`; the records written and folded into the snapshot
(under the index lock): :mod:`.near_dup_order_fold`; the locks, reservations and commits:
:mod:`.near_dup_index_order`.

The snapshot is parts by position range (``PART_ROWS`` positions each,
``shard_list/parts/<part>-<sha256>.parquet``, named by their content) under a checksummed head
(``shard_list/head.json``: the last record folded in, the next free position, each part's file and
the rows still reserved). A reservation or a commit reads the head and the records after it, and a
re-run also its shard's commit record and the one part holding its position; a fold rewrites only
the parts its records touch (the last one, mostly): both are flat in the number of shards listed.
An index of the earlier layout (one ``shards.parquet`` holding every row) is read as it is and
taken over by the first record written to it."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from speechdata.io import layout
from speechdata.io.parquet_integrity import UnreadableIntermediate
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_order_members import parts_may_list
from speechdata.quality.near_dup_order_rows import (  # noqa: F401 (re-exported: the shard list's names in one place)
    COMMITTED,
    ORDER_SCHEMA,
    RESERVED,
    Change,
    CorpusIndexBusy,
    IndexDamaged,
    IndexedShard,
    PartSummary,
    Reservation,
    ReservationLost,
    _all_applied,
    _applied,
    _FoldedMeanwhile,
    _row_of,
    _shard_of,
    _shards_of_table,
)

ORDER_LOG = f"{layout.NEAR_DUPLICATES_INDEX}/order"
"""The order's records since its snapshot: ``order/<seq>.json``, one per reservation, commit, dropped
reservation or compaction switch, each checksummed."""
SHARD_LIST = f"{layout.NEAR_DUPLICATES_INDEX}/shard_list"
HEAD = f"{SHARD_LIST}/head.json"
"""The snapshot's head (checksummed): the last record folded in (``through``), the next free
position, the rows per part, each part's file and the reserved rows. Its write is a fold's commit
point."""
PARTS = f"{SHARD_LIST}/parts"
THROUGH_KEY = b"speechdata.order_through"  # the earlier layout's metadata: the last record folded in
READ_ATTEMPTS = 5
PARALLEL_PART_READS = 8  # parts a whole read fetches at once (an object store answers in tens of ms)
_PART_NAME = re.compile(r"^[0-9]{8}-[0-9a-f]{16}\.parquet$")


@dataclass(frozen=True)
class _Head:
    through: int
    next_position: int
    part_rows: int
    parts: dict[int, str]
    """Part number -> its file (parts without rows have none)."""
    reserved: list[IndexedShard]
    """The reserved rows (a few: shards deciding, and runs gone not yet dropped)."""
    summary: dict[int, PartSummary] | None = None
    """Part number -> its summary (None: a head from before membership filters; every part read)."""
    members: str | None = None  # the parts' membership filters (:mod:`.near_dup_order_members`)


@dataclass(frozen=True)
class _Log:
    through: int
    """The last record folded into the snapshot (-1: none)."""
    head: _Head | None
    legacy: pa.Table | None  # the earlier layout's whole snapshot (``shards.parquet``) when there is no head
    changes: list[Change]  # each record after the snapshot, in sequence

    @property
    def last(self) -> int:
        return self.through + len(self.changes)


@dataclass(frozen=True)
class _OrderView:
    shards: list[IndexedShard]
    through: int
    """The last record folded into the snapshot."""
    last: int
    """The last record written (the next one is ``last + 1``)."""
    legacy: bool = False
    """The snapshot is of the earlier layout: the next record written takes it over."""


@dataclass(frozen=True)
class _OrderHead:
    """What a reservation or a commit needs of the order, read without every row: the head, the
    records after it and, for a shard committed before, the part holding its position."""

    through: int
    last: int
    next_position: int
    """One past the highest position any row was given (a dropped reservation's position is not
    given again; a withdrawn one's is)."""
    mine: IndexedShard | None
    """The row of the shard asked for, if it has one."""
    last_change: Change | None
    """The last record after the snapshot; None when there is none."""
    legacy: bool = False


def _record_relative(seq: int) -> str:
    return f"{ORDER_LOG}/{seq:012d}.json"


def _part_relative(name: str) -> str:
    return f"{PARTS}/{name}"


def _commit_record_relative(shard_id: str) -> str:
    return f"{layout.NEAR_DUPLICATES_INDEX}/committed/{shard_id}.json"


def _sealed(body: dict) -> bytes:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return (
        json.dumps({**body, "sha256": hashlib.sha256(canonical.encode()).hexdigest()}, sort_keys=True) + "\n"
    ).encode()


def _unsealed(content: bytes) -> dict | None:
    """The record's body, or None when it fails its checksum (torn, damaged)."""
    try:
        body = json.loads(content)
        digest = body.pop("sha256")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return body if hashlib.sha256(canonical.encode()).hexdigest() == digest else None


UNREADABLE = -1  # a commit record there but failing its checksum


def _committed_position(data_root: DataRoot, shard_id: str) -> int | None:
    """The position ``shard_id``'s commit record names (written before the order's record of the
    commit, so every shard committed in the order has one); None without one, else :data:`UNREADABLE`."""
    try:
        body = json.loads(data_root.fs.cat_file(data_root.path(_commit_record_relative(shard_id))))
        digest = body.pop("sha256")
        canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if hashlib.sha256(canonical.encode()).hexdigest() != digest:
            return UNREADABLE
        return int(body["position"])
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError):
        return UNREADABLE


def _listed_records(data_root: DataRoot) -> dict[int, str]:
    records = {}
    for path in data_root.glob(f"{ORDER_LOG}/*.json"):
        stem = path.rsplit("/", 1)[-1].removesuffix(".json")
        if stem.isdigit():
            records[int(stem)] = path
    return records


def _listed_parts(data_root: DataRoot) -> dict[str, str]:
    """Part files present (name -> path), named or not by the head."""
    found = {}
    for path in data_root.glob(f"{PARTS}/*.parquet"):
        name = path.rsplit("/", 1)[-1]
        if _PART_NAME.match(name):
            found[name] = path
    return found


def _read_head_file(data_root: DataRoot) -> _Head | None:
    try:
        content = data_root.fs.cat_file(data_root.path(HEAD))
    except FileNotFoundError:
        return None
    body = _unsealed(content)
    if body is None:
        raise IndexDamaged(f"the shard list's head {HEAD} fails its checksum (torn or damaged)")
    return _Head(
        int(body["through"]),
        int(body["next_position"]),
        int(body["part_rows"]),
        {int(part): name for part, name in body["parts"].items()},
        [_shard_of(row) for row in body["reserved"]],
        None
        if not {"members", "summary"} <= body.keys()
        else {int(k): PartSummary.of_body(v) for k, v in body["summary"].items()},
        body.get("members"),
    )


def _read_legacy(data_root: DataRoot) -> tuple[int, pa.Table | None]:
    """The earlier layout's snapshot and the last record folded into it; (-1, None) when absent."""
    relative = layout.near_duplicates_index_order()
    if not data_root.exists(relative):
        return -1, None
    try:
        table = data_root.read_parquet(relative)
    except UnreadableIntermediate as exc:
        raise IndexDamaged(str(exc)) from exc
    return int((table.schema.metadata or {}).get(THROUGH_KEY, b"-1")), table


def _read_base(data_root: DataRoot) -> tuple[int, _Head | None, pa.Table | None]:
    """(through, head, legacy snapshot): the head when there is one (a ``shards.parquet`` beside it
    is a migration's leftover, never read), else the earlier layout's snapshot, else nothing."""
    head = _read_head_file(data_root)
    if head is not None:
        return head.through, head, None
    through, legacy = _read_legacy(data_root)
    return through, None, legacy


def _read_log_once(data_root: DataRoot) -> _Log:
    through, head, legacy = _read_base(data_root)
    records = _listed_records(data_root)
    later = sorted(seq for seq in records if seq > through)
    missing = (
        f"an order record after the shard list's snapshot (through record {through}) is missing: "
        f"{ORDER_LOG} holds {', '.join(map(str, later))}"
    )
    if later != list(range(through + 1, through + 1 + len(later))):
        raise _FoldedMeanwhile((through, tuple(later)), missing)
    if head is None and legacy is None and not later and _listed_parts(data_root):
        raise IndexDamaged(f"the shard list's head {HEAD} is missing while {PARTS} holds parts")
    changes: list[Change] = []
    for seq in later:
        try:
            content = data_root.fs.cat_file(records[seq])
        except FileNotFoundError:
            raise _FoldedMeanwhile((through, tuple(later)), missing) from None
        body = _unsealed(content)
        if body is None or body.get("seq") != seq:
            raise IndexDamaged(f"order record {_record_relative(seq)} fails its checksum (torn or damaged)")
        changes.append(([_shard_of(row) for row in body["upsert"]], list(body["remove"])))
    return _Log(through, head, legacy, changes)


Read = TypeVar("Read")


def _retried(data_root: DataRoot, read: Callable[[_Log], Read]) -> Read:
    """``read`` of the log, again when a writer folded away what it was reading (a concurrent fold,
    a withdrawn reservation); the same thing missed twice is damage (:class:`IndexDamaged`)."""
    previous = None
    for _ in range(READ_ATTEMPTS):
        try:
            return read(_read_log_once(data_root))
        except _FoldedMeanwhile as moved:
            missed, damage = moved.args
            if missed != previous:
                previous = missed
                continue
            raise IndexDamaged(damage) from None
    raise IndexDamaged(f"the shard list ({SHARD_LIST}) moved on every one of {READ_ATTEMPTS} reads")


def _read_log(data_root: DataRoot) -> _Log:
    """The snapshot's head (or the earlier layout's snapshot) and the records after it. A record
    missing from the run after the snapshot, or failing its checksum, raises :class:`IndexDamaged`."""
    return _retried(data_root, lambda log: log)


def _read_part(data_root: DataRoot, name: str, head: _Head) -> pa.Table:
    """A part the head names, checked against the checksum in its name. Gone: a fold replaced it
    since the head was read (:class:`_FoldedMeanwhile`; read twice, damage)."""
    relative = _part_relative(name)
    try:
        content = data_root.fs.cat_file(data_root.path(relative))
    except FileNotFoundError:
        raise _FoldedMeanwhile((head.through, name), f"part {relative} of the shard list is missing") from None
    if hashlib.sha256(content).hexdigest()[:16] != name.removesuffix(".parquet").rsplit("-", 1)[-1]:
        raise IndexDamaged(f"part {relative} of the shard list fails its checksum (torn or damaged)")
    return pq.read_table(pa.BufferReader(content))


def _snapshot_rows(data_root: DataRoot, log: _Log) -> list[IndexedShard]:
    """Every row of the snapshot (every part, or the earlier layout's file), by position."""
    if log.head is None:
        return [] if log.legacy is None else _shards_of_table(log.legacy)
    names = [name for _, name in sorted(log.head.parts.items())]
    if len(names) > 1:
        with ThreadPoolExecutor(min(PARALLEL_PART_READS, len(names))) as pool:
            tables = list(pool.map(lambda name: _read_part(data_root, name, log.head), names))
    else:
        tables = [_read_part(data_root, name, log.head) for name in names]
    return [shard for table in tables for shard in _shards_of_table(table)]


def _view_of(data_root: DataRoot, log: _Log) -> _OrderView:
    shards = _all_applied(_snapshot_rows(data_root, log), log.changes)
    return _OrderView(shards, log.through, log.last, log.head is None and log.legacy is not None)


def _read_view(data_root: DataRoot) -> _OrderView:
    """Every row of the order: the snapshot with the records after it applied in sequence."""
    return _retried(data_root, lambda log: _view_of(data_root, log))


def _next_position(log: _Log) -> int:
    """One past the highest position given: the head's (or the earlier layout's highest row) and the
    rows of the records after it."""
    if log.head is not None:
        taken = log.head.next_position
    elif log.legacy is not None and log.legacy.num_rows:
        taken = pc.max(log.legacy.column("position")).as_py() + 1
    else:
        taken = 0
    return max([taken, *(shard.position + 1 for upserts, _ in log.changes for shard in upserts)])


def _row_in_snapshot(data_root: DataRoot, log: _Log, shard_id: str) -> IndexedShard | None:
    """``shard_id``'s row in the snapshot: a reserved row of the head, else in the part its commit record
    names, else (none, lost or torn) in the parts whose filters may list it (so never listed twice)."""
    if log.head is None:
        tables = [] if log.legacy is None else [log.legacy]
    else:
        reserved = next((shard for shard in log.head.reserved if shard.shard_id == shard_id), None)
        if reserved is not None:
            return reserved
        position = _committed_position(data_root, shard_id)
        if position is None or position == UNREADABLE:
            names = parts_may_list(data_root, log.head, shard_id)
        else:
            names = [log.head.parts.get(position // log.head.part_rows)]
        tables = [_read_part(data_root, name, log.head) for name in names if name is not None]
    rows = [
        _shard_of(row)
        for table in tables
        for row in table.filter(pc.equal(table.column("shard_id"), shard_id)).to_pylist()
    ]
    return max(rows, key=lambda shard: shard.position) if rows else None


def _head_of(data_root: DataRoot, log: _Log, shard_id: str) -> _OrderHead:
    mine: list[IndexedShard] = []
    if not any(shard.shard_id == shard_id for upserts, _ in log.changes for shard in upserts):
        found = _row_in_snapshot(data_root, log, shard_id)  # not needed when the records set its row
        mine = [] if found is None else [found]
    mine = _all_applied(
        mine, [([s for s in upserts if s.shard_id == shard_id], removed) for upserts, removed in log.changes]
    )
    return _OrderHead(
        log.through,
        log.last,
        _next_position(log),
        mine[0] if mine else None,
        log.changes[-1] if log.changes else None,
        log.head is None and log.legacy is not None,
    )


def _read_head(data_root: DataRoot, shard_id: str) -> _OrderHead:
    """The next free position and ``shard_id``'s row: the head and the records after it (a shard
    committed before: also the part holding its position); no other row read."""
    return _retried(data_root, lambda log: _head_of(data_root, log, shard_id))


def read_state(data_root: DataRoot) -> list[IndexedShard]:
    """Every shard of the order (reserved and committed), by position: the snapshot's parts and the
    records after it; empty before the first shard. Raises :class:`IndexDamaged` when the head, a
    part or a record after it cannot be read, or a record is missing."""
    return _read_view(data_root).shards


def read_reserved(data_root: DataRoot) -> list[IndexedShard]:
    """The reserved rows, by position: the head's and the records after it (no part read; over the
    earlier layout, which lists no reserved rows apart, every row)."""

    def reserved(log: _Log) -> list[IndexedShard]:
        rows = log.head.reserved if log.head is not None else _snapshot_rows(data_root, log)
        return [shard for shard in _all_applied(rows, log.changes) if shard.state == RESERVED]

    return _retried(data_root, reserved)


def read_order(data_root: DataRoot) -> list[IndexedShard]:
    """The committed shards, by position; empty before the first shard is indexed."""
    return [shard for shard in read_state(data_root) if shard.state == COMMITTED]
