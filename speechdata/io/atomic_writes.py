"""Atomic, idempotent writes on any fsspec filesystem.

Every product is written under a temporary name beside its final path and then moved into place,
so a reader never sees half a file and a crashed run leaves at most an orphaned temp file (which
the next run's write replaces, never appends to). On local disks and POSIX filesystems the move is
``os.replace``, which is atomic; on object stores it is a server-side copy of a complete object.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import posixpath
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from speechdata.io.parquet_integrity import READ_OPTIONS, WRITE_OPTIONS

TEMP_PREFIX = "._tmp-"

_CHANGE_GUARDS: list[Callable[[str], None]] = []


@contextlib.contextmanager
def guarded_changes(check: Callable[[str], None]) -> Iterator[None]:
    """Run ``check(path)`` before every change this process makes to a data root inside the block.

    A change is a file moved into place or a file of a previous writer removed; ``check`` raises to
    stop it. A resident GPU worker runs each shard inside one, checking that the shard's lock is still
    its driver's (:class:`speechdata.io.shard_lock.WriteFence`): a worker runs one shard at a time,
    so every change it makes in the block is that shard's. Temp files are written unchecked: they are
    never read, and a refused writer removes its own.
    """
    _CHANGE_GUARDS.append(check)
    try:
        yield
    finally:
        _CHANGE_GUARDS.remove(check)


def before_change(path: str) -> None:
    """Let every :func:`guarded_changes` check of this process refuse a change to ``path``."""
    for check in tuple(_CHANGE_GUARDS):
        check(path)


MAX_TEMP_NAME_TAIL = 200
"""Temp names keep at most this much of the final name, so prefix + tail stays under 255 bytes."""


def _temp_path_beside(path: str) -> str:
    parent, name = posixpath.split(path)
    owner = _current_temp_owner()
    if owner is None:
        return posixpath.join(parent, f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{name[-MAX_TEMP_NAME_TAIL:]}")
    owner.folders.add(parent)
    return posixpath.join(parent, f"{TEMP_PREFIX}{owner.tag}{uuid.uuid4().hex[:6]}-{name[-MAX_TEMP_NAME_TAIL:]}")


_OWNER_TAG_LETTERS = "ghijklmnopqrstuvwxyz"
"""Owner tags are spelled in letters no hex digit uses: an untagged temp (12 hex) never carries one."""


@dataclass
class TempOwner:
    """One writer's temps: each is named ``._tmp-<tag><6 hex>-<name>``, and every folder it wrote a
    temp into is remembered, so that its stale temps can be found again without a listing of the root."""

    tag: str
    folders: set[str] = field(default_factory=set)


_TEMP_OWNER: contextvars.ContextVar[TempOwner | None] = contextvars.ContextVar("temp_owner", default=None)
_PROCESS_TEMP_OWNERS: list[TempOwner] = []


def _current_temp_owner() -> TempOwner | None:
    """This context's owner; in a thread the step started (its context is not inherited), the
    process's one owner where there is exactly one."""
    owner = _TEMP_OWNER.get()
    if owner is None and len(_PROCESS_TEMP_OWNERS) == 1:
        owner = _PROCESS_TEMP_OWNERS[0]
    return owner


def temp_owner_tag(owner: str) -> str:
    """Six letters from ``owner`` (``<shard>/<product>``): the same writer has the same tag in every run."""
    digest = hashlib.sha256(owner.encode()).digest()
    return "".join(_OWNER_TAG_LETTERS[b % len(_OWNER_TAG_LETTERS)] for b in digest[:6])


@contextlib.contextmanager
def owned_temps(fs: fsspec.AbstractFileSystem, owner: str) -> Iterator[TempOwner]:
    """Name every temp written inside the block after ``owner``, and when the block succeeds remove
    the stale ones: the owner's temps that are still in a folder it wrote to.

    ``owner`` must have one writer at a time (a shard's product under its lock). By the block's end
    each of its own atomic writes has been renamed into place or removed, so a temp carrying its tag
    that is still there is a killed earlier run's (a staged copy of a shard's audio can be gigabytes).
    A re-run writes the same files into the same folders, so it finds them; nothing else is listed.
    """
    scope = TempOwner(temp_owner_tag(owner))
    token = _TEMP_OWNER.set(scope)
    _PROCESS_TEMP_OWNERS.append(scope)
    try:
        yield scope
        if os.environ.get(LEAVE_ORPHAN_TEMPS_ENV):
            _leave_orphans_like_a_killed_run(fs, scope, owner)
        remove_stale_temps(fs, scope)
    finally:
        _PROCESS_TEMP_OWNERS.remove(scope)
        _TEMP_OWNER.reset(token)


def remove_stale_temps(fs: fsspec.AbstractFileSystem, owner: TempOwner) -> list[str]:
    """Remove ``owner``'s temps from the folders it wrote to; return their paths."""
    prefix = f"{TEMP_PREFIX}{owner.tag}"
    removed = []
    for folder in sorted(owner.folders):
        with contextlib.suppress(FileNotFoundError):
            for candidate in fs.ls(folder, detail=False):
                if posixpath.basename(candidate).startswith(prefix):
                    before_change(candidate)
                    with contextlib.suppress(FileNotFoundError):
                        fs.rm(candidate)
                        removed.append(candidate)
    return removed


LEAVE_ORPHAN_TEMPS_ENV = "SPEECHDATA_LEAVE_ORPHAN_TEMPS"
"""Tests only: a file path. Before an owner's sweep, one temp is left in each folder it wrote to,
exactly as a run killed mid-write leaves it, and ``<owner> <temp path>`` appended to that file."""


def _leave_orphans_like_a_killed_run(fs: fsspec.AbstractFileSystem, owner: TempOwner, name: str) -> None:
    with open(os.environ[LEAVE_ORPHAN_TEMPS_ENV], "a") as log:
        for folder in sorted(owner.folders):
            orphan = posixpath.join(folder, f"{TEMP_PREFIX}{owner.tag}{uuid.uuid4().hex[:6]}-killed-write")
            with fs.open(orphan, "wb") as handle:
                handle.write(b"half written")
            log.write(f"{name} {orphan}\n")


def remove_orphaned_temps_of(fs: fsspec.AbstractFileSystem, path: str) -> int:
    """Delete the temps of ``path`` a killed writer left beside it; return how many.

    Called at the start of the next write of the same file: only one writer of a file runs at a time
    (one step per shard and asset), and readers never open temp names, so nothing else needs them.
    Only this file's temps (``._tmp-<12 hex>-<its name>``) are touched, never another writer's.
    """
    parent, name = posixpath.split(path)
    if not fs.exists(parent):
        return 0
    tail = "-" + name[-MAX_TEMP_NAME_TAIL:]
    removed = 0
    for candidate in fs.ls(parent, detail=False):
        base = posixpath.basename(candidate)
        if base.startswith(TEMP_PREFIX) and base.endswith(tail) and len(base) == len(TEMP_PREFIX) + 12 + len(tail):
            before_change(candidate)
            with contextlib.suppress(FileNotFoundError):
                fs.rm(candidate)
                removed += 1
    return removed


def remove_temps_under(fs: fsspec.AbstractFileSystem, folder: str) -> list[str]:
    """Delete every ``._tmp-*`` file under ``folder`` (recursively); return their paths.

    For a folder whose one writer has finished every write (an importer marking its shard landed,
    a stage ending under its lock): any temp left there is a killed writer's, never read, never
    renamed, and possibly as large as the file it was to become."""
    if not fs.exists(folder):
        return []
    removed = []
    for candidate in sorted(fs.find(folder)):
        if posixpath.basename(candidate).startswith(TEMP_PREFIX):
            before_change(candidate)
            with contextlib.suppress(FileNotFoundError):
                fs.rm(candidate)
                removed.append(candidate)
    return removed


@contextlib.contextmanager
def atomic_open(fs: fsspec.AbstractFileSystem, path: str, mode: str = "wb") -> Iterator[IO]:
    """Open ``path`` for writing; the file appears under its final name only if the block succeeds."""
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_open writes only ('wb' or 'w'), got mode {mode!r}")
    with _atomic_temp(fs, path) as temp, fs.open(temp, mode) as handle:
        yield handle


@contextlib.contextmanager
def _atomic_temp(fs: fsspec.AbstractFileSystem, path: str) -> Iterator[str]:
    """A temp path beside ``path``, moved over ``path`` when the block succeeds and removed when it fails."""
    fs.makedirs(posixpath.dirname(path), exist_ok=True)
    temp = _temp_path_beside(path)
    try:
        yield temp
        replace_file(fs, temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError, OSError):
            fs.rm(temp)
        raise


def replace_file(fs: fsspec.AbstractFileSystem, temp: str, path: str) -> None:
    before_change(path)
    if is_local_filesystem(fs):
        import os

        os.replace(temp, path)
    else:
        fs.mv(temp, path)


def protocol_of(fs: fsspec.AbstractFileSystem) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def is_local_filesystem(fs: fsspec.AbstractFileSystem) -> bool:
    return protocol_of(fs) in ("file", "local")


def write_bytes_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    with atomic_open(fs, path) as handle:
        handle.write(data)


def write_parquet_atomic(fs: fsspec.AbstractFileSystem, path: str, table: pa.Table, **parquet_options) -> None:
    """Write a whole table as one parquet file, atomically (zstd unless told otherwise)."""
    parquet_options = {"compression": "zstd", **WRITE_OPTIONS, **parquet_options}
    with atomic_open(fs, path) as handle:
        pq.write_table(table, handle, **parquet_options)


@contextlib.contextmanager
def atomic_parquet_writer(
    fs: fsspec.AbstractFileSystem, path: str, schema: pa.Schema, **parquet_options
) -> Iterator[pq.ParquetWriter]:
    """Stream row groups into one parquet file that appears atomically when the block ends."""
    parquet_options.setdefault("compression", "zstd")
    parquet_options = {**WRITE_OPTIONS, **parquet_options}
    if is_local_filesystem(fs):
        # Arrow writes a local file itself: through a Python handle it first copies every page into a
        # bytes object (the audio container: 5 ms of CPU per 24 MB, docs/changelog.md, Ingest).
        with (
            _atomic_temp(fs, path) as temp,
            pa.OSFile(temp, "wb") as sink,
            pq.ParquetWriter(sink, schema, **parquet_options) as writer,
        ):
            yield writer
        return
    with atomic_open(fs, path) as handle:
        writer = pq.ParquetWriter(handle, schema, **parquet_options)
        try:
            yield writer
        finally:
            writer.close()


def read_parquet(fs: fsspec.AbstractFileSystem, path: str, columns: list[str] | None = None) -> pa.Table:
    with fs.open(path, "rb") as handle:
        return read_parquet_handle(handle, columns)


def read_parquet_handle(handle: IO, columns: list[str] | None = None) -> pa.Table:
    """Read a parquet file from an open Python file object.

    ``pq.ParquetFile`` rather than ``pq.read_table``: the dataset scanner behind ``read_table`` leaves
    an I/O thread joinable on a Python file object and the interpreter aborts at exit
    ("terminate called without an active exception"; pyarrow 21-26 on this platform).
    """
    return pq.ParquetFile(handle, **READ_OPTIONS).read(columns=columns)
