"""The near-duplicate index's order (the snapshot ``shards.parquet`` and the records after it,
``order/<seq>.json``), its locks and its commit records.

A shard reserves a position under the index lock, holds its position's lock until it commits, and
waits only for the shards reserved before it (docs/near-duplicates.md, :mod:`.near_dup_index`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from speechdata.io import layout
from speechdata.io.parquet_integrity import UnreadableIntermediate
from speechdata.io.shard_lock import LockHolder, ShardLocked, data_root_lock
from speechdata.io.storage import DataRoot

INDEX_LOCK_KEY = "near-duplicates-index"
"""The lock's folder under ``_locks/``: spelled like a shard id (so :func:`shard_lock` takes it);
no asset writes a product named :data:`INDEX_LOCK_PRODUCT`, so no shard's own lock can clash."""
INDEX_LOCK_PRODUCT = "corpus_index"
DEFAULT_LOCK_TIMEOUT_S = 1_800.0
LOCK_POLL_S = 0.05
"""How often a run waiting for the index lock tries it again. The lock is held for milliseconds (a
reservation, a commit, a merge's switch), so a shard of a batch landing together waited mostly in
this sleep at 0.5 s; at 0.05 s a waiter costs an exclusive create (an S3 request) 20 times a second."""
WAIT_POLL_S = 0.1
LIVENESS_CHECK_S = 2.0
"""How often a waiting shard tries the position locks of the shards it waits for (a lock it can take
is a run that is gone): an S3 request per shard waited for."""
"""How often a shard waiting for the shards reserved before it reads the order (a small file): each
of a queue of shards landing together waits at most this long past the one before it commits."""
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


@contextlib.contextmanager
def corpus_index_lock(
    data_root: DataRoot,
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> Iterator[LockHolder | None]:
    """Hold the corpus index's lock for the block, waiting up to ``timeout_s`` for another holder.

    Held only for a reservation, a commit or a compaction's switch (milliseconds). A holder that
    died is taken over (:func:`speechdata.io.shard_lock.data_root_lock`: a lock file on a local
    root, a conditionally created object on S3). A store without exclusive create (GCS, Azure) runs
    the block unlocked (yields None): the deployment must run one ``near_duplicates`` step at a time
    there (docs/near-duplicates.md).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stack = contextlib.ExitStack()
        try:
            holder = stack.enter_context(
                data_root_lock(
                    data_root, INDEX_LOCK_KEY, INDEX_LOCK_PRODUCT, run_id=run_id, holder_finished=holder_finished
                )
            )
            break
        except ShardLocked as locked:
            stack.close()
            if time.monotonic() >= deadline:
                raise CorpusIndexBusy(
                    f"the near-duplicate index ({layout.NEAR_DUPLICATES_INDEX}) stayed locked for {timeout_s:.0f} s "
                    f"by {locked.holder.describe()} (lock {locked.lock_path})"
                ) from locked
            time.sleep(LOCK_POLL_S)
    with stack:
        yield holder


def _position_lock(data_root: DataRoot, position: int, run_id=None, holder_finished=None):
    return data_root_lock(
        data_root, INDEX_LOCK_KEY, f"position-{position:012d}", run_id=run_id, holder_finished=holder_finished
    )


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


@contextlib.contextmanager
def reserve_position(
    data_root: DataRoot,
    shard_id: str,
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> Iterator[Reservation]:
    """Take ``shard_id``'s place in the index order for the block: its committed position when it
    was indexed before, its own earlier reservation when a run of it died, else the next position.
    The position's lock is held for the block (it tells waiting shards this run is alive)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with corpus_index_lock(
            data_root, timeout_s=max(deadline - time.monotonic(), 0.0), run_id=run_id, holder_finished=holder_finished
        ):
            head = _read_head(data_root, shard_id)
            mine = head.mine
            position = mine.position if mine else head.next_position
            stack = contextlib.ExitStack()
            try:
                stack.enter_context(_position_lock(data_root, position, run_id, holder_finished))
            except ShardLocked as locked:
                stack.close()
                if time.monotonic() >= deadline:
                    raise CorpusIndexBusy(
                        f"index position {position} of {shard_id} stayed held by {locked.holder.describe()}"
                    ) from locked
                busy = True
            else:
                busy = False
                token = secrets.token_hex(8)
                recommit = mine is not None and mine.state == COMMITTED
                if not recommit:
                    reserved = IndexedShard(position, shard_id, None, 0, RESERVED, None, token)
                    _append(data_root, head, [reserved])
        if busy:
            time.sleep(LOCK_POLL_S)
            continue
        with stack:
            yield Reservation(shard_id, position, token, recommit)
        return


def wait_for_earlier(
    data_root: DataRoot,
    reservation: Reservation,
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> list[IndexedShard]:
    """Wait until no shard before ``reservation`` is still reserved: each commits, or its run is
    found gone (its position lock can be taken) and its reservation is dropped. Returns the state
    then (the committed shards before ``reservation`` are what it is decided against)."""
    deadline = time.monotonic() + timeout_s
    next_liveness_check = 0.0
    while True:
        state = read_state(data_root)
        pending = [s for s in state if s.state == RESERVED and s.position < reservation.position]
        if not pending:
            return state
        if time.monotonic() >= next_liveness_check:
            next_liveness_check = time.monotonic() + LIVENESS_CHECK_S
            for shard in pending:
                try:
                    with _position_lock(data_root, shard.position, run_id, holder_finished):
                        _drop_reservation(data_root, shard, run_id=run_id, holder_finished=holder_finished)
                except ShardLocked:
                    continue
            continue  # read the order again: a dropped reservation is no longer waited for
        # Until the next liveness check, watch the pending shards' commit records (a small file
        # each) rather than the order, which grows with the corpus.
        while time.monotonic() < next_liveness_check:
            if time.monotonic() >= deadline:
                raise CorpusIndexBusy(
                    f"shards reserved before {reservation.shard_id} (position {reservation.position}) did not "
                    f"commit in {timeout_s:.0f} s: {', '.join(f'{s.shard_id} at {s.position}' for s in pending)}"
                )
            if all(_committed_at(data_root, shard) for shard in pending):
                break
            time.sleep(WAIT_POLL_S)


def _committed_at(data_root: DataRoot, shard: IndexedShard) -> bool:
    """Whether ``shard``'s commit record names its reserved position (it has committed there)."""
    try:
        return (
            json.loads(data_root.fs.cat_file(data_root.path(_commit_record_relative(shard.shard_id))))["position"]
            == shard.position
        )
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return False


def _drop_reservation(data_root: DataRoot, shard: IndexedShard, **lock_options) -> None:
    """Remove ``shard``'s reservation if it is still the one read (its run was found gone)."""
    with corpus_index_lock(data_root, **lock_options):
        head = _read_head(data_root, shard.shard_id)
        if head.mine is None or (head.mine.position, head.mine.reservation) != (shard.position, shard.reservation):
            return
        if head.last_change == ([head.mine], []):
            # Its reservation is the last record: withdrawn, the order is as it was before it (a
            # pass that fails gives its positions back without a trace).
            data_root.fs.rm_file(data_root.path(_record_relative(head.last)))
        else:
            _append(data_root, head, removed=[shard.position])


position_lock = _position_lock
"""The lock a reserving run holds on its position until it commits (taking it proves that run gone)."""
drop_reservation = _drop_reservation


def _commit_record_relative(shard_id: str) -> str:
    return f"{layout.NEAR_DUPLICATES_INDEX}/committed/{shard_id}.json"


def _commit_record(shard: IndexedShard) -> bytes:
    body = {
        "shard_id": shard.shard_id,
        "position": shard.position,
        "entries_version": shard.entries_version,
        "utterances": shard.utterances,
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    body["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()


def _write_commit_record(data_root: DataRoot, shard: IndexedShard) -> None:
    relative = _commit_record_relative(shard.shard_id)
    content = _commit_record(shard)
    with contextlib.suppress(FileNotFoundError):
        if data_root.fs.cat_file(data_root.path(relative)) == content:
            return
    data_root.write_bytes(relative, content)


def _state_from_commit_records(data_root: DataRoot) -> list[IndexedShard]:
    """The committed shards as their checksummed commit records name them, each mapped to no
    segment yet (:func:`repair_index` finds or rebuilds their postings)."""
    shards = []
    for path in sorted(data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/committed/*.json")):
        try:
            body = json.loads(data_root.fs.cat_file(path))
            digest = body.pop("sha256")
            canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
            if hashlib.sha256(canonical.encode()).hexdigest() != digest:
                continue
            shards.append(IndexedShard(body["position"], body["shard_id"], body["entries_version"], body["utterances"]))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(shards, key=lambda s: s.position)
