"""The near-duplicate index's order (the snapshot's parts under ``shard_list/`` and the records
after it, ``order/<seq>.json``), its locks and its commit records.

A shard reserves a position under the index lock, holds its position's lock until it commits, and
waits only for the shards reserved before it (docs/near-duplicates.md, :mod:`.near_dup_index`)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterator

from speechdata.io import layout
from speechdata.io.shard_lock import LockHolder, ShardLocked, data_root_lock
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_order_directory import ShardDirectory, read_directory
from speechdata.quality.near_dup_order_fold import (  # noqa: F401 (re-exported: the index's one import point)
    FOLD_EVERY,
    PART_ROWS,
    _append,
    _fold,
    _write_state,
)
from speechdata.quality.near_dup_order_log import (  # noqa: F401 (re-exported: the index's one import point)
    COMMITTED,
    HEAD,
    ORDER_LOG,
    ORDER_SCHEMA,
    PARTS,
    READ_ATTEMPTS,
    RESERVED,
    SHARD_LIST,
    THROUGH_KEY,
    UNREADABLE,
    CorpusIndexBusy,
    IndexDamaged,
    IndexedShard,
    Reservation,
    ReservationLost,
    _applied,
    _commit_record_relative,
    _committed_position,
    _FoldedMeanwhile,
    _listed_parts,
    _listed_records,
    _Log,
    _OrderHead,
    _OrderView,
    _read_head,
    _read_log,
    _read_view,
    _record_relative,
    _row_of,
    _sealed,
    _shard_of,
    _unsealed,
    read_order,
    read_reserved,
    read_state,
)
from speechdata.quality.near_dup_order_members import parts_may_list

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
        _look_up_membership(data_root, shard_id)
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


def _look_up_membership(data_root: DataRoot, shard_id: str) -> None:
    """Read the parts' membership filters for a shard without a commit record before taking the
    index lock (the answer is kept by the filters file's name: under the lock, the head unchanged,
    no filter is read); anything amiss is left for the read under the lock."""
    if _committed_position(data_root, shard_id) not in (None, UNREADABLE):
        return
    with contextlib.suppress(IndexDamaged, _FoldedMeanwhile):
        head = _read_log(data_root).head
        if head is not None:
            parts_may_list(data_root, head, shard_id)


def wait_for_earlier(
    data_root: DataRoot,
    reservation: Reservation,
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> ShardDirectory:
    """Wait until no shard before ``reservation`` is still reserved: each commits, or its run is
    found gone (its position lock can be taken) and its reservation is dropped. Returns the state
    then (the committed shards before ``reservation`` are what it is decided against) as a
    :class:`~.near_dup_order_directory.ShardDirectory`: the head, the records and the part holding
    ``reservation``'s position read, every other part summarized (every row only when iterated)."""
    deadline = time.monotonic() + timeout_s
    next_liveness_check = 0.0
    while True:
        # The reserved rows alone (the head and its records) while waiting; every row once, at the end.
        pending = [s for s in read_reserved(data_root) if s.position < reservation.position]
        if not pending:
            return read_directory(data_root, reservation.position)
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
        if head.last_change is not None and head.last_change[0] == [head.mine]:
            # Its reservation is the last record: withdrawn, the order is as it was before it (a
            # pass that fails gives its positions back without a trace).
            data_root.fs.rm_file(data_root.path(_record_relative(head.last)))
        else:
            _append(data_root, head, removed=[shard.position])


position_lock = _position_lock
"""The lock a reserving run holds on its position until it commits (taking it proves that run gone)."""
drop_reservation = _drop_reservation


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
