"""Who holds a shard's write lock: the holder record, its lease, and when it counts as gone.

A lock (:mod:`speechdata.io.shard_lock`) is a small JSON file or object naming its holder; the
holder renews its heartbeat while it holds it, and a lock is *stale*, and may be taken over, only
when its lease ran out, its pid is gone on this host, or it is unreadable.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from speechdata.io.confinement import ConfinementError, validate_partition_key

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


def lock_relative_path(shard_id: str, product: str) -> str:
    validate_partition_key(shard_id)
    safe_product = product.replace("/", "__")
    if not safe_product or safe_product.startswith(".") or "\x00" in safe_product:
        raise ConfinementError("product name", product, LOCKS_DIR, "must be a plain name")
    return f"{LOCKS_DIR}/{shard_id}/{safe_product}.lock"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by someone else
    return True


def new_holder(run_id: str | None, lease_s: float) -> LockHolder:
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


def parse_holder(body: str | bytes) -> LockHolder:
    try:
        fields = json.loads(body)
        # Fields a later version may add are ignored: its lock still names a holder here.
        return LockHolder(**{name: value for name, value in fields.items() if name in _HOLDER_FIELDS})
    except (ValueError, TypeError, AttributeError):
        # Written by something else than a holder (a lock appears with its content whole):
        # nobody can be named, so it is treated as a holder that is gone.
        return LockHolder(host="?", pid=-1, started_at="?", token="unreadable")


def holder_body(holder: LockHolder) -> bytes:
    return json.dumps(asdict(holder)).encode()


def read_holder(path: str) -> LockHolder | None:
    """The holder a local lock file names, its heartbeat being the file's modification time."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        renewed_at = os.fstat(descriptor).st_mtime
        holder = parse_holder(handle.read(1 << 16))
    return holder if holder.token == "unreadable" else replace(holder, renewed_at=renewed_at)


def is_stale(holder: LockHolder, holder_finished: Callable[[LockHolder], bool] | None) -> bool:
    """Whether the holder is known to be gone. A leased lock is alive exactly while it is renewed;
    what an instance knows (or does not know) of its run never ends it."""
    if holder.token == "unreadable":
        return True
    if holder.host == socket.gethostname() and not pid_alive(holder.pid):
        return True
    if holder.lease_s > 0:
        return holder.lease_expired()
    # A lock from before leases: only its run, known to have ended, frees it.
    return holder_finished is not None and holder_finished(holder)
