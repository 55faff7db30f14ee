"""The holder's side of a held lock: its lease, renewed and checked before every change, and the
:class:`WriteFence` a writer in another process (a GPU worker) checks before each file it moves.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from speechdata.io.lock_holder import (
    RENEWALS_PER_LEASE,
    LockHolder,
    lock_relative_path,
    parse_holder,
    read_holder,
)
from speechdata.io.storage import DataRoot, guarded_changes

_HELD_FENCES: contextvars.ContextVar[dict[str, WriteFence] | None] = contextvars.ContextVar("held_fences", default=None)


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
        return attempt_path_of(self.lock_path)

    def holder(self) -> LockHolder | None:
        if self._data_root.is_local:
            return read_holder(self._data_root.path(self.lock_path))
        body = self._read(self.lock_path)
        return None if body is None else parse_holder(body)

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
    """The fence of the step's write lock on ``shard_id`` (:func:`speechdata.io.shard_lock.shard_write_lock`), while it is held."""
    return (_HELD_FENCES.get() or {}).get(shard_id)


def attempt_path_of(lock_path: str) -> str:
    """Where the holder's current attempt at the shard is kept (:meth:`WriteFence.next_attempt`).

    The lock removes it when released and when taken over, so an attempt's fence, which reads only
    this file, fails from the moment its step lets the shard go."""
    return f"{lock_path}.attempt"


class Lease:
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


def lost_error(data_root: DataRoot, shard_id: str, product: str, token: str) -> Callable[[str], ShardLockLost]:
    def lost(path: str) -> ShardLockLost:
        fence = WriteFence(data_root.url, lock_relative_path(shard_id, product), token, shard_id, product)
        return ShardLockLost(fence, fence.holder(), path)

    return lost


@contextlib.contextmanager
def fenced(
    data_root: DataRoot, shard_id: str, product: str, lock: contextlib.AbstractContextManager[LockHolder | None]
) -> Iterator[LockHolder | None]:
    """``lock``, with its :class:`WriteFence` given by :func:`held_fence` while it is held."""
    with lock as holder:
        if holder is None:
            yield None
            return
        fence = WriteFence(data_root.url, lock_relative_path(shard_id, product), holder.token, shard_id, product)
        _HELD_FENCES.set({**(_HELD_FENCES.get() or {}), shard_id: fence})
        try:
            yield holder
        finally:
            # Not a token reset: the block may end in another context than it began (a generator).
            _HELD_FENCES.set({key: held for key, held in (_HELD_FENCES.get() or {}).items() if held is not fence})
