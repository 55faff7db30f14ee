"""One writer per (shard, product): a lock file created with O_EXCL, naming who holds it.

Two runs of the same shard's asset at once would write the same temp files and remove each
other's; the second one is refused instead, by name. The lock is a small JSON file under
``_locks/<shard>/<product>.lock`` on the data root holding the holder's host, pid, start time and
(when the caller gives one) run id. It is removed when the holder finishes, however it finishes.

A holder killed outright (SIGKILL, a lost pod) leaves its lock behind. It is taken over when it is
*stale*: its pid no longer exists on this same host, or the caller's ``holder_finished`` says the
holder's run has ended (the orchestrator knows that for holders on other hosts).

A step that hands a shard to a resident GPU worker on another process or machine also hands it
the lock's :class:`WriteFence` (:func:`held_fence`): the worker checks before each change it makes
that the lock still holds its driver's token, so a worker still computing a shard whose driver was
killed (and whose lock a later run then took over) can no longer change that shard's files.

On S3 (:func:`object_store_lock`) the same file is an object created only if absent (a conditional
``PutObject``, ``If-None-Match: *``) and taken over only if unchanged since it was read as stale
(``If-Match`` on its ETag): the same guarantees without a local folder. Other object stores
(GCS, Azure) have no such create through fsspec here: :func:`data_root_lock` says so by yielding None.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import json
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

from speechdata.io.confinement import ConfinementError, confined_shard_output, validate_partition_key
from speechdata.io.storage import DataRoot

LOCKS_DIR = "_locks"

_HELD_FENCES: contextvars.ContextVar[dict[str, WriteFence] | None] = contextvars.ContextVar("held_fences", default=None)


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


class ShardLockLost(RuntimeError):
    """The lock a writer was given is no longer its driver's: the shard's files are not its to change."""

    def __init__(self, fence: WriteFence, holder: LockHolder | None, path: str):
        self.fence, self.holder, self.path = fence, holder, path
        if holder is not None and holder.token == fence.token:
            now = "still its step's, which gave the shard to a later attempt"
        elif holder is not None:
            now = f"now held by {holder.describe()}"
        else:
            now = "released"
        super().__init__(
            f"shard {fence.shard_id!r}: the {fence.product} lock this write was given is {now}; "
            f"refusing to change {path or 'the shard'} (lock {fence.lock_uri})"
        )

    def __reduce__(self):
        # Raised on a Ray worker and re-raised in the step: it must unpickle from its own fields.
        return (ShardLockLost, (self.fence, self.holder, self.path))


@dataclass(frozen=True)
class WriteFence:
    """A held lock as a writer elsewhere sees it: where the lock lives and the token it must still hold.

    Picklable (a Ray actor receives it with its shard). :meth:`check` reads the lock and raises
    :class:`ShardLockLost` when its token is no longer there: the driver released it, or a later run
    took it over after the driver's run ended. A fence of one attempt (:meth:`next_attempt`) also
    fails once its step has handed the shard to a later attempt: the step resubmits a shard whose
    worker it lost contact with, and the lost worker may still be running it.
    """

    data_root_url: str
    lock_path: str
    """Relative to the data root."""
    token: str
    shard_id: str
    product: str
    attempt: str = ""
    """The step's current attempt at the shard, kept in ``<lock>.attempt``; empty: any attempt."""

    @functools.cached_property
    def _data_root(self) -> DataRoot:
        return DataRoot(self.data_root_url)

    def _read(self, relative: str) -> bytes | None:
        """The file's bytes, None when absent: a plain read on a local root (the check runs before
        every file a worker moves into place, so it must cost far less than the write it guards)."""
        try:
            if self._data_root.is_local:
                with open(self._data_root.path(relative), "rb") as handle:
                    return handle.read()
            return self._data_root.fs.cat_file(self._data_root.path(relative))
        except FileNotFoundError:
            return None

    @property
    def lock_uri(self) -> str:
        return self._data_root.uri(self.lock_path)

    @property
    def attempt_path(self) -> str:
        return _attempt_path(self.lock_path)

    def holder(self) -> LockHolder | None:
        body = self._read(self.lock_path)
        return None if body is None else _parse_holder(body)

    def current_attempt(self) -> str | None:
        """``<token> <attempt>`` of the step's latest attempt, None before its first (or after a takeover)."""
        body = self._read(self.attempt_path)
        return None if body is None else body.decode()

    def check(self, path: str = "") -> None:
        # An attempt's fence reads one file: the attempt file names the lock's token too, and a new
        # holder removes it as it takes the lock, before it writes anything (one GET per check on S3).
        if self.attempt and self.current_attempt() == f"{self.token} {self.attempt}":
            return
        holder = self.holder()
        if holder is None or holder.token != self.token or self.attempt:
            raise ShardLockLost(self, holder, path)

    def next_attempt(self) -> WriteFence:
        """A fence for a new attempt at the shard, which every earlier attempt's fence now fails.

        Only the lock's holder calls it (its step): nobody else writes the attempt file meanwhile."""
        replace(self, attempt="").check()
        fence = replace(self, attempt=uuid.uuid4().hex)
        self._data_root.write_bytes(fence.attempt_path, f"{fence.token} {fence.attempt}".encode())
        return fence


def held_fence(shard_id: str) -> WriteFence | None:
    """The fence of the step's write lock on ``shard_id`` (:func:`shard_write_lock`), while it is held."""
    return (_HELD_FENCES.get() or {}).get(shard_id)


def _attempt_path(lock_path: str) -> str:
    """Where the holder's current attempt at the shard is kept (:meth:`WriteFence.next_attempt`).

    The lock removes it when released and when taken over, so an attempt's fence, which reads only
    this file, fails from the moment its step lets the shard go."""
    return f"{lock_path}.attempt"


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
    took_over = False
    for _ in range(3):
        if _create(path, me):
            break
        holder = _read_holder(path)
        if holder is None:
            continue  # released between our create and our read
        if not _is_stale(holder, holder_finished):
            raise ShardLocked(shard_id, product, holder, path)
        _take_over(path, holder)
        took_over = True
    else:
        holder = _read_holder(path) or me
        raise ShardLocked(shard_id, product, holder, path)
    if took_over:
        _unlink_if_present(_attempt_path(path))  # the stale holder's attempts end here
    try:
        yield me
    finally:
        current = _read_holder(path)
        if current is not None and current.token == me.token:
            _unlink_if_present(_attempt_path(path))
            os.unlink(path)


def _unlink_if_present(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
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
            _rm_object_if_present(data_root, _attempt_path(path))  # the stale holder's attempts end here
            break
    else:
        holder = _read_object_holder(data_root, path)[0] or me
        raise ShardLocked(shard_id, product, holder, data_root.uri(relative))
    try:
        yield me
    finally:
        current, _ = _read_object_holder(data_root, path)
        if current is not None and current.token == me.token:
            _rm_object_if_present(data_root, _attempt_path(path))
            fs.rm_file(path)


def _rm_object_if_present(data_root: DataRoot, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        data_root.fs.rm_file(path)


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
    data_root.path(_lock_relative_path(shard_id, product))  # confined like every path under the root
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
    return _fenced(
        data_root,
        shard_id,
        product,
        data_root_lock(data_root, shard_id, product, run_id=run_id, holder_finished=finished),
    )


@contextlib.contextmanager
def _fenced(
    data_root: DataRoot, shard_id: str, product: str, lock: contextlib.AbstractContextManager[LockHolder | None]
) -> Iterator[LockHolder | None]:
    """``lock``, with its :class:`WriteFence` given by :func:`held_fence` while it is held."""
    with lock as holder:
        if holder is None:
            yield None
            return
        fence = WriteFence(data_root.url, _lock_relative_path(shard_id, product), holder.token, shard_id, product)
        _HELD_FENCES.set({**(_HELD_FENCES.get() or {}), shard_id: fence})
        try:
            yield holder
        finally:
            # Not a token reset: the block may end in another context than it began (a generator).
            _HELD_FENCES.set({key: held for key, held in (_HELD_FENCES.get() or {}).items() if held is not fence})
