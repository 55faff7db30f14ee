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
import re
import stat
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from speechdata.io.confinement import confined_landed_shard, relative_path_problem
from speechdata.io.layout import LANDING, ConfinementError, is_valid_key
from speechdata.io.parquet_integrity import READ_OPTIONS, WRITE_OPTIONS, naming_unreadable
from speechdata.io.regular_files import RegularFilesOnly, require_regular

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


def escape_glob(text: str) -> str:
    """``text`` matched literally by DuckDB's and fsspec's globs (``[1]`` becomes ``[[]1]``): a data
    root whose path holds glob characters still finds its own files."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def filesystem_for(root_url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve a data-root URL (local path, ``file://``, ``s3://``...) into a filesystem and root path.

    A local one reads only regular files (:class:`~speechdata.io.regular_files.RegularFilesOnly`):
    a FIFO or a device planted where a file is read is refused by name instead of blocking the reader."""
    fs, root = fsspec.core.url_to_fs(root_url)
    if _is_local(fs):
        fs = RegularFilesOnly(**fs.storage_options)
    return fs, root.rstrip("/") or "/"


class OutsideDataRoot(ConfinementError):
    """A path under the data root that is not a plain relative path, or that resolves outside the root
    (a product folder, or a folder or file below it, that is a symlink out)."""


LINK_RULE = (
    "every folder and file under the data root must resolve inside it: a product folder may not be a "
    "symlink out of the root (to put it on another disk, mount the disk at the folder, or link the whole "
    "data root)"
)
"""The one rule for links under the data root (docs/reliability.md, "Confinement in one place")."""


class AbsolutePathStored(ValueError):
    """A table about to be stored under the data root names the root by its absolute path."""

    def __init__(self, relative: str, column: str, value: str):
        super().__init__(
            f"refusing to write {relative}: column {column!r} holds the data root's absolute path ({value!r}); "
            "every stored reference is relative to the data root (docs/storage-layout.md)"
        )


_PATH_COLUMN = re.compile(r"(^|_)(path|url|uri|file|filepath|dir|directory|location)s?$")
"""Columns that hold references to files: a stored one must be relative to the data root."""


REJECTS_LEDGER_COLUMNS = ["utt_id", "stage", "reason", "detail"]
"""The columns of a rejects ledger (``speechdata.accounting.rejects.REJECTS_SCHEMA``'s, which sits above the
storage layer; a test keeps them equal): its ``detail`` has the root's prefix taken off, not refused."""


def _checked_columns(schema: pa.Schema) -> list[str]:
    is_ledger = schema.names == REJECTS_LEDGER_COLUMNS
    return [
        field.name
        for field in schema
        if (pa.types.is_string(field.type) or pa.types.is_large_string(field.type))
        and (_PATH_COLUMN.search(field.name) or (is_ledger and field.name == "detail"))
    ]


class _RootPathCheckingWriter:
    """A ``pq.ParquetWriter`` whose every table or batch passes :meth:`DataRoot.without_root_paths`."""

    def __init__(self, writer: pq.ParquetWriter, check: Callable[[pa.Table], pa.Table]):
        self._writer, self._check = writer, check

    def write_table(self, table: pa.Table, *args, **kwargs) -> None:
        self._writer.write_table(self._check(table), *args, **kwargs)

    def write_batch(self, batch: pa.RecordBatch, *args, **kwargs) -> None:
        self._writer.write_table(self._check(pa.Table.from_batches([batch])), *args, **kwargs)

    def write(self, table_or_batch, *args, **kwargs) -> None:
        if isinstance(table_or_batch, pa.RecordBatch):
            self.write_batch(table_or_batch, *args, **kwargs)
        else:
            self.write_table(table_or_batch, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._writer, name)


class DataRoot:
    """The data root: an fsspec URL, its filesystem, and paths under it.

    Every path under the root is made by :meth:`path` (or :meth:`glob`), which is the confinement
    check every read and write of the platform goes through: the relative path must be plain (no
    ``..``, not absolute) and, on a local disk, resolve inside the root once symlinks are followed.
    The root itself may be a symlink; nothing under it may link out (:data:`LINK_RULE`).

    Pickles as its URL only, so it can be handed to worker processes.
    """

    def __init__(self, url: str):
        self.url = url
        self.fs, self.root = filesystem_for(url)
        self._resolved_root: str | None = None

    def __reduce__(self):
        return (DataRoot, (self.url,))

    def __repr__(self) -> str:
        return f"DataRoot({self.url!r})"

    @property
    def protocol(self) -> str:
        """The filesystem's protocol: ``file``, ``s3``, ``gcs``..."""
        return _protocol(self.fs)

    @property
    def is_local(self) -> bool:
        """A local (POSIX) directory: files can be handed to libraries that only open paths."""
        return _is_local(self.fs)

    def path(self, relative: str) -> str:
        """The filesystem path of ``relative`` (a path from :mod:`speechdata.io.layout`), once it is
        confined to the root; else :class:`OutsideDataRoot` naming the path, the folder that links out
        and the rule. ``""`` is the root itself, with a trailing slash."""
        relative = relative.lstrip("/")  # joined to the root, a leading slash always named a path under it
        if relative == "":
            return f"{self.root}/"
        problem = relative_path_problem(relative)
        if problem is not None:
            raise OutsideDataRoot("path", relative, self.root, f"must be a plain relative path, found {problem}")
        joined = f"{self.root}/{relative}"
        if self.is_local:
            self._require_inside(relative, joined)
        return joined

    def real_root(self) -> str:
        """``realpath`` of a local root (the root may itself be a symlink)."""
        if self._resolved_root is None:
            self._resolved_root = os.path.realpath(self.root)
        return self._resolved_root

    def _require_inside(self, relative: str, joined: str) -> None:
        """One ``lstat`` per existing component under the root (the root's own path is resolved once):
        a plain folder or file cannot leave the root, so only a symlink met on the way is resolved."""
        current = self.root
        for part in relative.split("/"):
            current = f"{current}/{part}"
            try:
                mode = os.lstat(current).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return  # nothing exists below a missing entry: no link left to follow
            if stat.S_ISLNK(mode):
                break
        else:
            return
        real_root = self.real_root()
        real = os.path.realpath(joined)
        if real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep):
            return
        landing, _, rest = relative.partition("/")
        shard_id = rest.partition("/")[0]
        if landing == LANDING and is_valid_key("shard", shard_id):
            # A landed shard has the landing edge's own, stricter refusal (LandedShardOutsideRoot), which
            # the sensor and the shard assets report on the shard's partition.
            confined_landed_shard(self.root, shard_id)
        folder, target = self._link_out(relative) or (relative, real)
        raise OutsideDataRoot(
            "path", relative, self.root, f"{folder!r} resolves to {target!r}, outside the data root; {LINK_RULE}"
        )

    def _link_out(self, relative: str) -> tuple[str, str] | None:
        """The first folder or file on the way to ``relative`` that is a symlink out of the root."""
        real_root = self.real_root().rstrip(os.sep) + os.sep
        parts = relative.split("/")
        for depth in range(1, len(parts) + 1):
            candidate = "/".join(parts[:depth])
            full = f"{self.root}/{candidate}"
            if os.path.islink(full) and not (os.path.realpath(full) + os.sep).startswith(real_root):
                return candidate, os.path.realpath(full)
        return None

    def uri(self, relative: str) -> str:
        """A URL a person or another tool can open (``file:///...``, ``s3://...``)."""
        return self.fs.unstrip_protocol(self.path(relative))

    def glob(self, pattern: str) -> list[str]:
        """Filesystem paths matching ``pattern`` (relative, with wildcards) under the root; the root's
        own path is matched literally, so a root such as ``/data/run[1]`` still finds its files. Each
        match is confined like :meth:`path`: a match that resolves outside the root raises."""
        problem = relative_path_problem(pattern)
        if problem is not None:
            raise OutsideDataRoot("glob", pattern, self.root, f"must be a plain relative pattern, found {problem}")
        parts = pattern.split("/")
        literal = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
        if literal:
            self.path("/".join(parts[:literal]))  # the folders before the first wildcard, links included
        found = self.fs.glob(f"{escape_glob(self.root)}/{pattern}")
        if self.is_local:
            prefix = f"{self.root}/"
            for match in found:
                relative = match[len(prefix) :] if match.startswith(prefix) else match
                self._require_inside(relative, match)
        return found

    def exists(self, relative: str) -> bool:
        return self.fs.exists(self.path(relative))

    def read_parquet(self, relative: str, columns: list[str] | None = None) -> pa.Table:
        """The table, every page read checked against its checksum; a damaged or truncated file raises
        :class:`~speechdata.io.parquet_integrity.UnreadableIntermediate` naming ``relative``."""
        with naming_unreadable(relative):
            return read_parquet(self.fs, self.path(relative), columns)

    @contextlib.contextmanager
    def open_parquet(self, relative: str, **options) -> Iterator[pq.ParquetFile]:
        """A ``pq.ParquetFile`` that verifies each page it reads; what fails inside the block (open,
        footer, any page) raises :class:`~speechdata.io.parquet_integrity.UnreadableIntermediate`
        naming ``relative``. ``options``: ``pq.ParquetFile``'s (``buffer_size``...)."""
        with naming_unreadable(relative), _open_for_arrow(self, relative) as handle:
            yield pq.ParquetFile(handle, **READ_OPTIONS, **options)

    def write_parquet(self, relative: str, table: pa.Table, **parquet_options) -> None:
        table = self.without_root_paths(relative, table)
        remove_orphaned_temps_of(self.fs, self.path(relative))
        write_parquet_atomic(self.fs, self.path(relative), table, **parquet_options)

    def write_bytes(self, relative: str, data: bytes) -> None:
        write_bytes_atomic(self.fs, self.path(relative), data)

    @contextlib.contextmanager
    def parquet_writer(self, relative: str, schema: pa.Schema, **parquet_options) -> Iterator[pq.ParquetWriter]:
        remove_orphaned_temps_of(self.fs, self.path(relative))
        with atomic_parquet_writer(self.fs, self.path(relative), schema, **parquet_options) as writer:
            if not _checked_columns(schema):
                yield writer
            else:
                yield _RootPathCheckingWriter(writer, lambda table: self.without_root_paths(relative, table))

    def absolute_prefixes(self) -> list[str]:
        """How this root's absolute location can appear in text: its URL, its path and, on a local disk,
        its resolved path, each with a trailing slash (longest first). None for a root of ``/``."""
        forms = {self.fs.unstrip_protocol(self.root), self.root}
        if self.is_local:
            forms.add(self.real_root())
        return sorted((form.rstrip("/") + "/" for form in forms if form.rstrip("/")), key=len, reverse=True)

    def without_root_paths(self, relative: str, table: pa.Table) -> pa.Table:
        """``table`` as it may be stored at ``relative``: no absolute path of the root in it.

        The one chokepoint of "every stored reference is relative to the data root": a rejects
        ledger's ``detail`` (text for people, often an error message of a library that names a file)
        has the root's prefix taken off, so the same shard writes byte-identical ledgers under any
        root; a path-like column of any other table (``*_path``, ``*_url``, ``*_uri``, ``*_file``...)
        that holds one is refused with :class:`AbsolutePathStored`, naming the file and column.
        """
        checked = _checked_columns(table.schema)
        if not checked:
            return table
        prefixes = self.absolute_prefixes()
        is_ledger = table.schema.names == REJECTS_LEDGER_COLUMNS
        for name in checked:
            column = table[name]
            if is_ledger and name == "detail":
                for prefix in prefixes:
                    column = pc.replace_substring(column, prefix, "")
                table = table.set_column(table.schema.get_field_index(name), table.schema.field(name), column)
                continue
            if is_ledger:
                continue
            for prefix in prefixes:
                hits = pc.filter(column, pc.fill_null(pc.match_substring(column, prefix), False))
                if len(hits):
                    raise AbsolutePathStored(relative, name, hits[0].as_py())
        return table

    def replace(self, source: str, destination: str) -> None:
        """Move ``source`` over ``destination`` (both relative): atomic on a local disk."""
        self.fs.makedirs(posixpath.dirname(self.path(destination)), exist_ok=True)
        _replace(self.fs, self.path(source), self.path(destination))

    def open_atomic(self, relative: str):
        """A binary handle whose content appears at ``relative`` only when the block ends without error."""
        return atomic_open(self.fs, self.path(relative), "wb")


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
        _replace(fs, temp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError, OSError):
            fs.rm(temp)
        raise


def _replace(fs: fsspec.AbstractFileSystem, temp: str, path: str) -> None:
    before_change(path)
    if _is_local(fs):
        import os

        os.replace(temp, path)
    else:
        fs.mv(temp, path)


def _protocol(fs: fsspec.AbstractFileSystem) -> str:
    return fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return _protocol(fs) in ("file", "local")


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
    if _is_local(fs):
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


def _open_for_arrow(data_root: DataRoot, relative: str):
    """Arrow's own file for a local root: its reads land in Arrow's memory pool, which reuses them.
    Through a Python file object every read is a new multi-MB ``bytes``, and glibc's heap fragments
    under them until resident memory grows with the number of row groups read."""
    if data_root.is_local:
        require_regular(data_root.fs, data_root.path(relative))  # Arrow opens it by name: a FIFO would block it
        return pa.OSFile(data_root.path(relative), "rb")
    return data_root.fs.open(data_root.path(relative), "rb")
