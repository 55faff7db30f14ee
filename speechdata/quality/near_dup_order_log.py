"""The near-duplicate index's shard list: its rows (:class:`IndexedShard`), the snapshot
``shards.parquet`` and the checksummed records after it (``order/<seq>.json``), read together and
folded into the snapshot every :data:`FOLD_EVERY` records (docs/near-duplicates.md, "The shard list:
a snapshot and records"). The locks, reservations and commits that write it: :mod:`.near_dup_index_order`."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from speechdata.io import layout
from speechdata.io.parquet_integrity import UnreadableIntermediate
from speechdata.io.storage import DataRoot

RESERVED, COMMITTED = "reserved", "committed"
ORDER_SCHEMA = pa.schema(
    [
        pa.field("position", pa.int64(), nullable=False),
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("entries_version", pa.string()),
        pa.field("utterances", pa.int64(), nullable=False),
        pa.field("segment", pa.string()),
        pa.field("reservation", pa.string()),
    ]
)
"""``state``: ``reserved`` (position taken, not committed: ``reservation`` is the run's token) or
``committed`` (``entries_version`` names its entries file, ``segment`` the segment holding its postings)."""


@dataclass(frozen=True)
class IndexedShard:
    """A row of ``shards.parquet``."""

    position: int
    shard_id: str
    entries_version: str | None
    utterances: int
    state: str = COMMITTED
    segment: str | None = None
    reservation: str | None = None


@dataclass(frozen=True)
class Reservation:
    """A shard's place in the index order, held (with its position lock) until it commits."""

    shard_id: str
    position: int
    token: str
    recommit: bool
    """The shard was committed before (a re-run): it keeps its position."""


class CorpusIndexBusy(RuntimeError):
    """The index stayed locked by another run for longer than the caller would wait."""


class ReservationLost(RuntimeError):
    """The shard's reservation was dropped (taken for dead, or lost with a rebuilt order): reserve again."""


class IndexDamaged(RuntimeError):
    """A part of the index failed its checksum or is missing: :func:`repair_index` rebuilds it.
    ``entries_of``: the shard whose entries file could not be read, when that was the part."""

    def __init__(self, message: str, entries_of: str | None = None):
        super().__init__(message)
        self.entries_of = entries_of


ORDER_LOG = f"{layout.NEAR_DUPLICATES_INDEX}/order"
"""The order's records since its snapshot: ``order/<seq>.json``, one per reservation, commit, dropped
reservation or compaction switch, each checksummed."""
FOLD_EVERY = 64
"""Records after the snapshot that make the writer of the last one rewrite ``shards.parquet`` (the
snapshot) through it: a reservation or commit writes one small record, and one in this many also
rewrites the snapshot; a reader reads the snapshot and at most this many records."""
THROUGH_KEY = b"speechdata.order_through"
"""The snapshot's parquet metadata: the sequence number of the last record folded into it (-1: none)."""
READ_ATTEMPTS = 5


@dataclass(frozen=True)
class _OrderView:
    shards: list[IndexedShard]
    through: int
    """The last record folded into the snapshot."""
    last: int
    """The last record written (the next one is ``last + 1``)."""


class _FoldedMeanwhile(Exception):
    """A record listed after the snapshot read was gone when read: a writer folded it meanwhile."""


def _record_relative(seq: int) -> str:
    return f"{ORDER_LOG}/{seq:012d}.json"


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


def _listed_records(data_root: DataRoot) -> dict[int, str]:
    records = {}
    for path in data_root.glob(f"{ORDER_LOG}/*.json"):
        stem = path.rsplit("/", 1)[-1].removesuffix(".json")
        if stem.isdigit():
            records[int(stem)] = path
    return records


def _read_snapshot_table(data_root: DataRoot) -> tuple[int, pa.Table | None]:
    relative = layout.near_duplicates_index_order()
    if not data_root.exists(relative):
        return -1, None
    try:
        table = data_root.read_parquet(relative)
    except UnreadableIntermediate as exc:
        raise IndexDamaged(str(exc)) from exc
    return int((table.schema.metadata or {}).get(THROUGH_KEY, b"-1")), table


def _read_snapshot(data_root: DataRoot) -> tuple[int, list[IndexedShard]]:
    through, table = _read_snapshot_table(data_root)
    return through, [] if table is None else [_shard_of(row) for row in table.to_pylist()]


def _shard_of(row: dict) -> IndexedShard:
    return IndexedShard(
        position=row["position"],
        shard_id=row["shard_id"],
        entries_version=row["entries_version"],
        utterances=row["utterances"],
        state=row.get("state") or COMMITTED,
        segment=row.get("segment"),
        reservation=row.get("reservation"),
    )


def _row_of(shard: IndexedShard) -> dict:
    return {field.name: getattr(shard, field.name) for field in ORDER_SCHEMA}


def _applied(
    shards: Sequence[IndexedShard], upserts: Sequence[IndexedShard], removed: Sequence[int]
) -> list[IndexedShard]:
    """``shards`` with each of ``upserts`` replacing its shard's row and the rows at ``removed`` gone."""
    replaced = {shard.shard_id for shard in upserts}
    gone = set(removed)
    kept = [s for s in shards if s.shard_id not in replaced and s.position not in gone]
    return sorted([*kept, *upserts], key=lambda shard: shard.position)


@dataclass(frozen=True)
class _Log:
    through: int
    snapshot: pa.Table | None
    changes: list[tuple[list[IndexedShard], list[int]]]
    """Each record after the snapshot, in sequence: (rows upserted, positions removed)."""

    @property
    def last(self) -> int:
        return self.through + len(self.changes)


def _read_log(data_root: DataRoot) -> _Log:
    """The snapshot and the records after it. A record missing from the run after the snapshot, or
    failing its checksum, raises :class:`IndexDamaged` (unless the snapshot moved past it meanwhile:
    a fold by a concurrent writer, or a withdrawn reservation: read again; the same gap read twice
    is damage)."""
    previous = None
    for _ in range(READ_ATTEMPTS):
        through, table = _read_snapshot_table(data_root)
        records = _listed_records(data_root)
        later = sorted(seq for seq in records if seq > through)
        changes = []
        try:
            if later != list(range(through + 1, through + 1 + len(later))):
                raise _FoldedMeanwhile
            for seq in later:
                try:
                    content = data_root.fs.cat_file(records[seq])
                except FileNotFoundError as exc:
                    raise _FoldedMeanwhile from exc
                body = _unsealed(content)
                if body is None or body.get("seq") != seq:
                    raise IndexDamaged(f"order record {_record_relative(seq)} fails its checksum (torn or damaged)")
                changes.append(([_shard_of(row) for row in body["upsert"]], list(body["remove"])))
        except _FoldedMeanwhile:
            if (through, later) != previous:
                previous = (through, later)
                continue
            raise IndexDamaged(
                f"an order record after {layout.near_duplicates_index_order()} (through record {through}) is "
                f"missing: {ORDER_LOG} holds {', '.join(map(str, later))}"
            ) from None
        return _Log(through, table, changes)
    raise IndexDamaged(f"{layout.near_duplicates_index_order()} moved on every one of {READ_ATTEMPTS} reads")


def _read_view(data_root: DataRoot) -> _OrderView:
    """Every row of the order: the snapshot with the records after it applied in sequence."""
    log = _read_log(data_root)
    shards = [] if log.snapshot is None else [_shard_of(row) for row in log.snapshot.to_pylist()]
    for upserts, removed in log.changes:
        shards = _applied(shards, upserts, removed)
    return _OrderView(shards, log.through, log.last)


@dataclass(frozen=True)
class _OrderHead:
    """What a reservation or a commit needs of the order, read without building every row."""

    through: int
    last: int
    next_position: int
    """One past the highest position taken."""
    mine: IndexedShard | None
    """The row of the shard asked for, if it has one."""
    last_change: tuple[list[IndexedShard], list[int]] | None
    """The last record after the snapshot (rows set, positions dropped); None when there is none."""


def _read_head(data_root: DataRoot, shard_id: str) -> _OrderHead:
    """The next free position and ``shard_id``'s row: the snapshot's columns taken whole (Arrow, no
    row built but the shard's own), then the records after it."""
    log = _read_log(data_root)
    removed: set[int] = set()
    replaced: set[str] = set()
    upserted: dict[str, IndexedShard] = {}
    for upserts, gone in log.changes:
        removed.update(gone)
        upserted = {key: shard for key, shard in upserted.items() if shard.position not in gone}
        for shard in upserts:
            replaced.add(shard.shard_id)
            upserted[shard.shard_id] = shard
    highest, mine = -1, upserted.get(shard_id)
    if log.snapshot is not None and log.snapshot.num_rows:
        ids = log.snapshot.column("shard_id")
        positions = log.snapshot.column("position")
        live = pc.invert(
            pc.or_(
                pc.is_in(positions, pa.array(sorted(removed), pa.int64())),
                pc.is_in(ids, pa.array(sorted(replaced), pa.string())),
            )
        )
        live_positions = pc.filter(positions, live)
        if len(live_positions):
            highest = pc.max(live_positions).as_py()
        if mine is None and shard_id not in replaced:
            rows = log.snapshot.filter(pc.and_(live, pc.equal(ids, shard_id))).to_pylist()
            mine = _shard_of(rows[0]) if rows else None
    highest = max([highest, *(shard.position for shard in upserted.values())])
    return _OrderHead(log.through, log.last, highest + 1, mine, log.changes[-1] if log.changes else None)


def read_state(data_root: DataRoot) -> list[IndexedShard]:
    """Every shard of the order (reserved and committed), by position: ``shards.parquet`` and the
    records after it; empty before the first shard. Raises :class:`IndexDamaged` when the snapshot
    or a record after it cannot be read, or a record is missing."""
    return _read_view(data_root).shards


def read_order(data_root: DataRoot) -> list[IndexedShard]:
    """The committed shards, by position; empty before the first shard is indexed."""
    return [shard for shard in read_state(data_root) if shard.state == COMMITTED]


def _append(
    data_root: DataRoot,
    read: _OrderView | _OrderHead,
    upserts: Sequence[IndexedShard] = (),
    removed: Sequence[int] = (),
) -> None:
    """Record a change to the order as ``read`` (under the index lock): one record, the commit point;
    the writer of every :data:`FOLD_EVERY`-th record after the snapshot rewrites the snapshot through it."""
    seq = read.last + 1
    body = {"seq": seq, "upsert": [_row_of(shard) for shard in upserts], "remove": sorted(removed)}
    data_root.write_bytes(_record_relative(seq), _sealed(body))
    if seq - read.through >= FOLD_EVERY:
        _fold(data_root, _read_view(data_root).shards, seq)


def _fold(data_root: DataRoot, shards: Sequence[IndexedShard], through: int) -> None:
    """Rewrite the snapshot as ``shards`` through record ``through``, then remove the records it
    holds (a run killed in between leaves records at or before ``through``: never read, removed by
    the next fold)."""
    rows = [_row_of(shard) for shard in sorted(shards, key=lambda s: s.position)]
    table = pa.Table.from_pylist(rows, schema=ORDER_SCHEMA.with_metadata({THROUGH_KEY: str(through).encode()}))
    data_root.write_parquet(layout.near_duplicates_index_order(), table)
    for seq, path in sorted(_listed_records(data_root).items()):
        if seq <= through:
            with contextlib.suppress(FileNotFoundError):
                data_root.fs.rm_file(path)


def _write_state(data_root: DataRoot, shards: Sequence[IndexedShard]) -> None:
    """Replace the whole order with ``shards`` (a repair, a whole-corpus write): a snapshot through
    every record there is, which are then removed."""
    records = _listed_records(data_root)
    try:
        through = _read_snapshot(data_root)[0]
    except IndexDamaged:
        through = -1
    _fold(data_root, shards, max([through, *records]))
