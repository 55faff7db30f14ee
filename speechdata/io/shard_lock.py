"""One writer per (shard, product): a lock file created atomically, naming who holds it, kept alive by its holder.

Two runs of the same shard's asset at once would write the same temp files and remove each
other's; the second one is refused instead, by name. The lock is a small JSON file under
``_locks/<shard>/<product>.lock`` on the data root holding the holder's host, pid, start time,
(when the caller gives one) run id, and its lease. It is removed when the holder finishes, however
it finishes.

**Liveness is proved by the holder, never inferred.** While a lock is held, a background thread of
its holder renews its heartbeat every ``lease_s / RENEWALS_PER_LEASE`` seconds (a local lock file's
modification time, touched through the holder's own descriptor; an S3 lock object rewritten only
if unchanged). A lock is *stale*, and taken over, only when

- its heartbeat is older than its lease (``SPEECHDATA_LOCK_LEASE_S``, default 60 s): the holder
  stopped renewing (killed outright, a lost pod or node, a frozen process);
- its pid no longer exists on this same host (a killed holder is taken over at once there);
- it is unreadable (never a live holder's: a lock appears with its content whole).

A run id is never evidence of death: another Dagster instance's runs (a separate
``DAGSTER_HOME``) are unknown to this one, and an instance's view of a run may end before the
run's last process does. The caller's ``holder_finished`` is asked only about locks without a
lease, left by a version before leases.

A holder that lost its lease (it froze past its lease and was taken over, or its lock was removed)
notices before it changes anything: while a lock is held, every change this process makes to a
data root (:func:`speechdata.io.storage.guarded_changes`) first checks that the lease is still its
own (renewing it on the spot when the last renewal is older than half the lease) and raises
:class:`ShardLockLost` naming the new holder otherwise.

A step that hands a shard to a resident GPU worker on another process or machine also hands it
the lock's :class:`WriteFence` (:func:`held_fence`): the worker checks before each change it makes
that the lock still holds its driver's token, so a worker still computing a shard whose driver was
killed (and whose lock a later run then took over) can no longer change that shard's files.

On S3 (:func:`object_store_lock`) the same file is an object created only if absent (a conditional
``PutObject``, ``If-None-Match: *``), renewed and taken over only if unchanged since it was read
(``If-Match`` on its ETag): the same guarantees without a local folder. Other object stores
(GCS, Azure) have no such create through fsspec here: :func:`data_root_lock` says so by yielding None.

This module holds the local lock file and the entry points; the holder record and staleness are in
:mod:`speechdata.io.lock_holder`, the lease and the fence in :mod:`speechdata.io.write_fence`, the
S3 lock in :mod:`speechdata.io.object_store_lock`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Callable, Iterator

from speechdata.io.confinement import confined_shard_output
from speechdata.io.lock_holder import (
    LOCKS_DIR,
    LockHolder,
    ShardLocked,
    holder_body,
    is_stale,
    lock_lease_s,
    lock_relative_path,
    new_holder,
    read_holder,
)
from speechdata.io.object_store_lock import EXCLUSIVE_CREATE_PROTOCOLS, object_store_lock
from speechdata.io.storage import DataRoot
from speechdata.io.write_fence import Lease, ShardLockLost, WriteFence, attempt_path_of, fenced, held_fence, lost_error

__all__ = [
    "EXCLUSIVE_CREATE_PROTOCOLS",
    "LOCKS_DIR",
    "LockHolder",
    "ShardLockLost",
    "ShardLocked",
    "WriteFence",
    "data_root_lock",
    "held_fence",
    "object_store_lock",
    "shard_lock",
    "shard_lock_path",
    "shard_write_lock",
]


def shard_lock_path(root: str, shard_id: str, product: str) -> str:
    return os.path.join(root, lock_relative_path(shard_id, product))


def _create(path: str, holder: LockHolder) -> int | None:
    """Create the lock naming ``holder``, whole (staged, then hard-linked into place), and return a
    descriptor of it for renewals; None when a lock is there already."""
    staged = f"{path}.{holder.token}.new"
    descriptor = os.open(staged, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(descriptor, holder_body(holder))
        os.link(staged, path)
    except FileExistsError:
        os.close(descriptor)
        return None
    except BaseException:
        os.close(descriptor)
        raise
    finally:
        _unlink_if_present(staged)
    return descriptor


def _renew_local(path: str, descriptor: int) -> bool:
    """Touch the holder's own lock file (through its descriptor, so a lock that replaced it is never
    touched) and say whether it is still the one at ``path``."""
    os.utime(descriptor)
    try:
        current = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(descriptor)
    return (current.st_dev, current.st_ino) == (own.st_dev, own.st_ino)


def _take_over(path: str, stale: LockHolder) -> None:
    """Move the stale lock aside, unless someone else did first (then theirs is left alone)."""
    aside = f"{path}.{uuid.uuid4().hex}.stale"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    moved = read_holder(aside)
    if (
        moved is not None
        and moved.token != "unreadable"
        and (moved.token != stale.token or moved.renewed_at != stale.renewed_at)
    ):
        # A fresh lock created after we read the stale one, or the same one renewed since: its
        # holder is alive, so it goes back where that holder expects it.
        with contextlib.suppress(FileExistsError):
            os.link(aside, path)
    os.unlink(aside)


@contextlib.contextmanager
def shard_lock(
    root: str,
    shard_id: str,
    product: str,
    *,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
    lease_s: float | None = None,
) -> Iterator[LockHolder]:
    """Hold the lock on ``shard_id``'s ``product`` for the block, or raise :class:`ShardLocked`.

    Also refuses (:class:`ConfinementError`) a ``shards/<shard_id>`` folder that is a symlink: every
    output of the shard is written through it. ``root`` is a local folder. ``lease_s``: see
    :func:`lock_lease_s` (the default).
    """
    confined_shard_output(root, shard_id)
    path = shard_lock_path(root, shard_id, product)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    me = new_holder(run_id, lock_lease_s() if lease_s is None else lease_s)
    descriptor = None
    took_over = False
    for _ in range(3):
        descriptor = _create(path, me)
        if descriptor is not None:
            break
        holder = read_holder(path)
        if holder is None:
            continue  # released between our create and our read
        if not is_stale(holder, holder_finished):
            raise ShardLocked(shard_id, product, holder, path)
        _take_over(path, holder)
        took_over = True
    else:
        holder = read_holder(path) or me
        raise ShardLocked(shard_id, product, holder, path)
    try:
        if took_over:
            _unlink_if_present(attempt_path_of(path))  # the stale holder's attempts end here
        lease = Lease(
            me.lease_s,
            functools.partial(_renew_local, path, descriptor),
            lost_error(DataRoot(root), shard_id, product, me.token),
            f"{shard_id}/{product}",
        )
        with lease.held():
            yield me
    finally:
        current = read_holder(path)
        if current is not None and current.token == me.token:
            _unlink_if_present(attempt_path_of(path))
            _unlink_if_present(path)
        os.close(descriptor)


def _unlink_if_present(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def data_root_lock(
    data_root: DataRoot,
    shard_id: str,
    product: str,
    *,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> contextlib.AbstractContextManager[LockHolder | None]:
    """The lock of ``shard_id``'s ``product`` on this data root: a local lock file, an S3 lock
    object, or, where the store cannot create exclusively, none (the context yields None)."""
    data_root.path(lock_relative_path(shard_id, product))  # confined like every path under the root
    if data_root.is_local:
        return shard_lock(data_root.root, shard_id, product, run_id=run_id, holder_finished=holder_finished)
    if data_root.protocol in EXCLUSIVE_CREATE_PROTOCOLS:
        return object_store_lock(data_root, shard_id, product, run_id=run_id, holder_finished=holder_finished)
    return contextlib.nullcontext()


def shard_write_lock(
    data_root: DataRoot | None,
    shard_id: str,
    product: str,
    run_id: str | None = None,
    run_ended: Callable[[str], bool] | None = None,
) -> contextlib.AbstractContextManager:
    """:func:`data_root_lock` for a step writing ``product`` of ``shard_id``; ``run_ended(run_id)``
    says whether a holder's run is known to be over (asked only of a lock without a lease). On a store without exclusive create (GCS, Azure) there is
    no lock: the run queue's one-run-per-partition limit is the guard there, and it does not cover
    backfill runs over a range."""
    if data_root is None:
        return contextlib.nullcontext()
    finished = None if run_ended is None else (lambda holder: bool(holder.run_id) and run_ended(holder.run_id))
    return fenced(
        data_root,
        shard_id,
        product,
        data_root_lock(data_root, shard_id, product, run_id=run_id, holder_finished=finished),
    )
