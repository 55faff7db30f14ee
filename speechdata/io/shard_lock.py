"""One writer per (shard, product): a lock file created with O_EXCL, naming who holds it.

Two runs of the same shard's asset at once would write the same temp files and remove each
other's; the second one is refused instead, by name. The lock is a small JSON file under
``_locks/<shard>/<product>.lock`` on the data root holding the holder's host, pid, start time and
(when the caller gives one) run id. It is removed when the holder finishes, however it finishes.

A holder killed outright (SIGKILL, a lost pod) leaves its lock behind. It is taken over when it is
*stale*: its pid no longer exists on this same host, or the caller's ``holder_finished`` says the
holder's run has ended (the orchestrator knows that for holders on other hosts).

On S3 (:func:`object_store_lock`) the same file is an object created only if absent (a conditional
``PutObject``, ``If-None-Match: *``) and taken over only if unchanged since it was read as stale
(``If-Match`` on its ETag): the same guarantees without a local folder. Other object stores
(GCS, Azure) have no such create through fsspec here: :func:`data_root_lock` says so by yielding None.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

from speechdata.io.confinement import ConfinementError, confined_shard_output, validate_partition_key
from speechdata.io.storage import DataRoot

LOCKS_DIR = "_locks"


@dataclass(frozen=True)
class LockHolder:
    host: str
    pid: int
    started_at: str
    run_id: str | None = None
    token: str = ""

    def describe(self) -> str:
        run = f", run {self.run_id}" if self.run_id else ""
        return f"pid {self.pid} on {self.host}{run}, since {self.started_at}"


class ShardLocked(RuntimeError):
    """Another process is writing this shard's product right now; this run must not."""

    def __init__(self, shard_id: str, product: str, holder: LockHolder, lock_path: str):
        self.shard_id, self.product, self.holder, self.lock_path = shard_id, product, holder, lock_path
        super().__init__(
            f"shard {shard_id!r}: {product} is being written by another run ({holder.describe()}); "
            f"refusing to run it twice at once (lock {lock_path})"
        )


def shard_lock_path(root: str, shard_id: str, product: str) -> str:
    return os.path.join(root, _lock_relative_path(shard_id, product))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def _new_holder(run_id: str | None) -> LockHolder:
    return LockHolder(
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        run_id=run_id,
        token=uuid.uuid4().hex,
    )


def _parse_holder(body: str | bytes) -> LockHolder:
    try:
        return LockHolder(**json.loads(body))
    except (ValueError, TypeError):
        # Half-written by a holder killed between create and write: nobody can be named, so it is
        # treated as a holder that is gone.
        return LockHolder(host="?", pid=-1, started_at="?", token="unreadable")


def _read_holder(path: str) -> LockHolder | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return _parse_holder(handle.read())
    except FileNotFoundError:
        return None


def _is_stale(holder: LockHolder, holder_finished: Callable[[LockHolder], bool] | None) -> bool:
    if holder.token == "unreadable":
        return True
    if holder.host == socket.gethostname() and not _pid_alive(holder.pid):
        return True
    return holder_finished is not None and holder_finished(holder)


def _create(path: str, holder: LockHolder) -> bool:
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        json.dump(asdict(holder), handle)
    return True


def _take_over(path: str, stale: LockHolder) -> None:
    """Move the stale lock aside, unless someone else did first (then theirs is left alone)."""
    aside = f"{path}.{uuid.uuid4().hex}.stale"
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    moved = _read_holder(aside)
    if moved is not None and moved.token != stale.token and moved.token != "unreadable":
        # A fresh lock, created after we read the stale one: put it back where its holder expects it.
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
) -> Iterator[LockHolder]:
    """Hold the lock on ``shard_id``'s ``product`` for the block, or raise :class:`ShardLocked`.

    Also refuses (:class:`ConfinementError`) a ``shards/<shard_id>`` folder that is a symlink: every
    output of the shard is written through it. ``root`` is a local folder.
    """
    confined_shard_output(root, shard_id)
    path = shard_lock_path(root, shard_id, product)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    me = _new_holder(run_id)
    for _ in range(3):
        if _create(path, me):
            break
        holder = _read_holder(path)
        if holder is None:
            continue  # released between our create and our read
        if not _is_stale(holder, holder_finished):
            raise ShardLocked(shard_id, product, holder, path)
        _take_over(path, holder)
    else:
        holder = _read_holder(path) or me
        raise ShardLocked(shard_id, product, holder, path)
    try:
        yield me
    finally:
        current = _read_holder(path)
        if current is not None and current.token == me.token:
            os.unlink(path)


EXCLUSIVE_CREATE_PROTOCOLS = ("s3", "s3a")
"""Object stores whose fsspec filesystem creates an object only if absent (s3fs ``mode="create"``)."""


def _lock_relative_path(shard_id: str, product: str) -> str:
    validate_partition_key(shard_id)
    safe_product = product.replace("/", "__")
    if not safe_product or safe_product.startswith(".") or "\x00" in safe_product:
        raise ConfinementError("product name", product, LOCKS_DIR, "must be a plain name")
    return f"{LOCKS_DIR}/{shard_id}/{safe_product}.lock"


def _read_object_holder(data_root: DataRoot, path: str) -> tuple[LockHolder | None, str | None]:
    """The holder named by the lock object and the object's ETag; (None, None) when there is none."""
    fs = data_root.fs
    try:
        etag = fs.info(path, refresh=True).get("ETag")
        body = fs.cat_file(path)
    except FileNotFoundError:
        return None, None
    return _parse_holder(body), etag


@contextlib.contextmanager
def object_store_lock(
    data_root: DataRoot,
    shard_id: str,
    product: str,
    *,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> Iterator[LockHolder]:
    """:func:`shard_lock` on an S3 data root: the lock object is created only if absent and taken
    over only if it is still the stale holder's; raises :class:`ShardLocked` like the local lock."""
    relative = _lock_relative_path(shard_id, product)
    path, fs = data_root.path(relative), data_root.fs
    me = _new_holder(run_id)
    body = json.dumps(asdict(me)).encode()
    for _ in range(3):
        try:
            fs.pipe_file(path, body, mode="create")
            break
        except OSError:
            pass  # it exists (FileExistsError), or a condition failed: read who holds it
        holder, etag = _read_object_holder(data_root, path)
        if holder is None:
            continue  # released between our create and our read
        if not _is_stale(holder, holder_finished):
            raise ShardLocked(shard_id, product, holder, data_root.uri(relative))
        try:
            fs.pipe_file(path, body, IfMatch=etag)  # only over the stale holder's object
        except OSError:
            continue  # someone else took it over or released it first
        if (_read_object_holder(data_root, path)[0] or holder).token == me.token:
            break
    else:
        holder = _read_object_holder(data_root, path)[0] or me
        raise ShardLocked(shard_id, product, holder, data_root.uri(relative))
    try:
        yield me
    finally:
        current, _ = _read_object_holder(data_root, path)
        if current is not None and current.token == me.token:
            fs.rm_file(path)


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
    says whether a holder's run is over. On a store without exclusive create (GCS, Azure) there is
    no lock: the run queue's one-run-per-partition limit is the guard there, and it does not cover
    backfill runs over a range."""
    if data_root is None:
        return contextlib.nullcontext()
    finished = None if run_ended is None else (lambda holder: bool(holder.run_id) and run_ended(holder.run_id))
    return data_root_lock(data_root, shard_id, product, run_id=run_id, holder_finished=finished)
