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
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import functools
import json
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace

from speechdata.io.confinement import ConfinementError, confined_shard_output, validate_partition_key
from speechdata.io.storage import DataRoot, guarded_changes

LOCKS_DIR = "_locks"

LEASE_ENV = "SPEECHDATA_LOCK_LEASE_S"
DEFAULT_LEASE_S = 60.0
"""How long a lock holds without its holder renewing it. Long enough that a holder busy with a
shard (a GIL-bound loop, a slow object store) renews many times over; short enough that a shard
whose holder was killed on another host is free again within a minute."""
RENEWALS_PER_LEASE = 6
"""The holder renews this many times per lease: a few renewals may fail or come late before the
lock could be taken over."""


def lock_lease_s() -> float:
    """``SPEECHDATA_LOCK_LEASE_S``: seconds a lock holds without renewal (default 60)."""
    raw = os.environ.get(LEASE_ENV, "").strip()
    if not raw:
        return DEFAULT_LEASE_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{LEASE_ENV}={raw!r}: must be a positive number of seconds")
    return value


_HELD_FENCES: contextvars.ContextVar[dict[str, WriteFence] | None] = contextvars.ContextVar("held_fences", default=None)


@dataclass(frozen=True)
class LockHolder:
    host: str
    pid: int
    started_at: str
    run_id: str | None = None
    token: str = ""
    lease_s: float = 0.0
    """How long the lock holds without its holder renewing it; 0 for a lock from before leases."""
    renewed_at: float = 0.0
    """When its holder last renewed it, in seconds since the epoch (a local lock file's modification time)."""

    def heartbeat_age_s(self) -> float:
        return time.time() - self.renewed_at

    def lease_expired(self) -> bool:
        return self.lease_s > 0 and self.heartbeat_age_s() > self.lease_s

    def describe(self) -> str:
        run = f", run {self.run_id}" if self.run_id else ""
        lease = ""
        if self.lease_s > 0 and self.renewed_at > 0:
            lease = f", renewed {max(0.0, self.heartbeat_age_s()):.0f} s ago (lease {self.lease_s:g} s)"
        return f"pid {self.pid} on {self.host}{run}, since {self.started_at}{lease}"


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
        if self._data_root.is_local:
            return _read_holder(self._data_root.path(self.lock_path))
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


def _new_holder(run_id: str | None, lease_s: float) -> LockHolder:
    now = time.time()
    return LockHolder(
        host=socket.gethostname(),
        pid=os.getpid(),
        started_at=datetime.datetime.fromtimestamp(now, datetime.UTC).isoformat(timespec="seconds"),
        run_id=run_id,
        token=uuid.uuid4().hex,
        lease_s=lease_s,
        renewed_at=now,
    )


_HOLDER_FIELDS = frozenset(LockHolder.__dataclass_fields__)


def _parse_holder(body: str | bytes) -> LockHolder:
    try:
        fields = json.loads(body)
        # Fields a later version may add are ignored: its lock still names a holder here.
        return LockHolder(**{name: value for name, value in fields.items() if name in _HOLDER_FIELDS})
    except (ValueError, TypeError, AttributeError):
        # Written by something else than a holder (a lock appears with its content whole):
        # nobody can be named, so it is treated as a holder that is gone.
        return LockHolder(host="?", pid=-1, started_at="?", token="unreadable")


def _body(holder: LockHolder) -> bytes:
    return json.dumps(asdict(holder)).encode()


def _read_holder(path: str) -> LockHolder | None:
    """The holder a local lock file names, its heartbeat being the file's modification time."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        renewed_at = os.fstat(descriptor).st_mtime
        holder = _parse_holder(handle.read(1 << 16))
    return holder if holder.token == "unreadable" else replace(holder, renewed_at=renewed_at)


def _is_stale(holder: LockHolder, holder_finished: Callable[[LockHolder], bool] | None) -> bool:
    """Whether the holder is known to be gone. A leased lock is alive exactly while it is renewed;
    what an instance knows (or does not know) of its run never ends it."""
    if holder.token == "unreadable":
        return True
    if holder.host == socket.gethostname() and not _pid_alive(holder.pid):
        return True
    if holder.lease_s > 0:
        return holder.lease_expired()
    # A lock from before leases: only its run, known to have ended, frees it.
    return holder_finished is not None and holder_finished(holder)


class _Lease:
    """The holder's side of a held lock: renewed in the background, checked before every change.

    ``renew()`` renews the heartbeat only if the lock is still the holder's, and says whether it
    was; it raises OSError when the store could not be asked (tried again at the next renewal).
    """

    def __init__(self, lease_s: float, renew: Callable[[], bool], lost: Callable[[str], ShardLockLost], name: str):
        self.lease_s = lease_s
        self._renew = renew
        self._lost_error = lost
        self._confirmed_at = time.monotonic()
        self._lost = False
        self._renewing = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._renew_until_stopped, name=f"lease {name}", daemon=True)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Renewed while the block runs; every change this process makes in it is checked first."""
        self._thread.start()
        try:
            with guarded_changes(self.check):
                yield
        finally:
            self._stopped.set()
            self._thread.join()

    def _renew_until_stopped(self) -> None:
        while not self._stopped.wait(self.lease_s / RENEWALS_PER_LEASE):
            try:
                if not self.renew_now():
                    return
            except Exception:
                # The store did not answer: asked again next time; past half a lease the checks renew
                # on the spot, and a write then fails with what the store says.
                continue

    def renew_now(self) -> bool:
        with self._renewing:
            if self._lost:
                return False
            started = time.monotonic()
            if self._renew():
                self._confirmed_at = started
                return True
            self._lost = True
            return False

    def check(self, path: str) -> None:
        """Raise :class:`ShardLockLost` unless the lock is still this holder's.

        Free while the last renewal is recent: nobody may take a lock over before its lease has
        run out since then. Past half the lease (the renewals stalled: a frozen process, a store
        that stopped answering) it renews on the spot, which succeeds only if nobody took it."""
        if not self._lost and time.monotonic() - self._confirmed_at < self.lease_s / 2:
            return
        if not self.renew_now():
            raise self._lost_error(path)


def _lost_error(data_root: DataRoot, shard_id: str, product: str, token: str) -> Callable[[str], ShardLockLost]:
    def lost(path: str) -> ShardLockLost:
        fence = WriteFence(data_root.url, _lock_relative_path(shard_id, product), token, shard_id, product)
        return ShardLockLost(fence, fence.holder(), path)

    return lost


def _create(path: str, holder: LockHolder) -> int | None:
    """Create the lock naming ``holder``, whole (staged, then hard-linked into place), and return a
    descriptor of it for renewals; None when a lock is there already."""
    staged = f"{path}.{holder.token}.new"
    descriptor = os.open(staged, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(descriptor, _body(holder))
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
    moved = _read_holder(aside)
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
    me = _new_holder(run_id, lock_lease_s() if lease_s is None else lease_s)
    descriptor = None
    took_over = False
    for _ in range(3):
        descriptor = _create(path, me)
        if descriptor is not None:
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
    try:
        if took_over:
            _unlink_if_present(_attempt_path(path))  # the stale holder's attempts end here
        lease = _Lease(
            me.lease_s,
            functools.partial(_renew_local, path, descriptor),
            _lost_error(DataRoot(root), shard_id, product, me.token),
            f"{shard_id}/{product}",
        )
        with lease.held():
            yield me
    finally:
        current = _read_holder(path)
        if current is not None and current.token == me.token:
            _unlink_if_present(_attempt_path(path))
            _unlink_if_present(path)
        os.close(descriptor)


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


class _ObjectLease:
    """The ETag of the holder's lock object: each renewal rewrites it only if it is still that one."""

    def __init__(self, data_root: DataRoot, path: str, me: LockHolder, etag: str | None):
        self.data_root, self.path, self.me, self.etag = data_root, path, me, etag

    def renew(self) -> bool:
        body = _body(replace(self.me, renewed_at=time.time()))
        try:
            response = self.data_root.fs.pipe_file(self.path, body, IfMatch=self.etag)
        except OSError:
            holder, etag = _read_object_holder(self.data_root, self.path)
            if holder is None or holder.token != self.me.token:
                return False  # taken over or removed
            self.etag = etag  # still ours (a retried request went through first): renewed next time
            raise
        self.etag = _etag_of(response)
        return True


def _etag_of(put_response) -> str:
    """The ETag a ``PutObject`` answered (s3fs returns the response): the object as this holder wrote it."""
    return put_response["ETag"]


@contextlib.contextmanager
def object_store_lock(
    data_root: DataRoot,
    shard_id: str,
    product: str,
    *,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
    lease_s: float | None = None,
) -> Iterator[LockHolder]:
    """:func:`shard_lock` on an S3 data root: the lock object is created only if absent, renewed
    and taken over only if it is unchanged since read; raises :class:`ShardLocked` like the local lock."""
    relative = _lock_relative_path(shard_id, product)
    path, fs = data_root.path(relative), data_root.fs
    me = _new_holder(run_id, lock_lease_s() if lease_s is None else lease_s)
    body = _body(me)
    etag = None
    for _ in range(3):
        try:
            etag = _etag_of(fs.pipe_file(path, body, mode="create"))
            break
        except OSError:
            pass  # it exists (FileExistsError), or a condition failed: read who holds it
        holder, stale_etag = _read_object_holder(data_root, path)
        if holder is None:
            continue  # released between our create and our read
        if not _is_stale(holder, holder_finished):
            raise ShardLocked(shard_id, product, holder, data_root.uri(relative))
        try:
            # Only over the stale holder's object: a renewal since our read changed its ETag.
            response = fs.pipe_file(path, body, IfMatch=stale_etag)
        except OSError:
            continue  # someone else took it over or released it first, or its holder renewed it
        if (_read_object_holder(data_root, path)[0] or holder).token == me.token:
            etag = _etag_of(response)
            _rm_object_if_present(data_root, _attempt_path(path))  # the stale holder's attempts end here
            break
    else:
        holder = _read_object_holder(data_root, path)[0] or me
        raise ShardLocked(shard_id, product, holder, data_root.uri(relative))
    object_lease = _ObjectLease(data_root, path, me, etag)
    lease = _Lease(
        me.lease_s, object_lease.renew, _lost_error(data_root, shard_id, product, me.token), f"{shard_id}/{product}"
    )
    try:
        with lease.held():
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
