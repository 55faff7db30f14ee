"""The data root: every path under it confined to it, every write atomic.

:class:`DataRoot` resolves relative paths on any fsspec filesystem (refusing one that leaves the
root, symlinks included), refuses to store the root's absolute path in a table, and writes through
:mod:`speechdata.io.atomic_writes` (temp name beside the final path, then moved into place). The
atomic-write functions are re-exported here: this module is where callers have always found them.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterator

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from speechdata.io.atomic_writes import (
    LEAVE_ORPHAN_TEMPS_ENV,
    TEMP_PREFIX,
    atomic_open,
    atomic_parquet_writer,
    before_change,
    guarded_changes,
    is_local_filesystem,
    owned_temps,
    protocol_of,
    read_parquet,
    read_parquet_handle,
    remove_orphaned_temps_of,
    remove_temps_under,
    replace_file,
    temp_owner_tag,
    write_bytes_atomic,
    write_parquet_atomic,
)
from speechdata.io.confinement import confined_landed_shard, relative_path_problem
from speechdata.io.layout import LANDING, ConfinementError, is_valid_key
from speechdata.io.parquet_integrity import READ_OPTIONS, naming_unreadable
from speechdata.io.regular_files import RegularFilesOnly, require_regular

__all__ = [
    # Defined in speechdata.io.atomic_writes; imported from here across the code base and its tests.
    "LEAVE_ORPHAN_TEMPS_ENV",
    "TEMP_PREFIX",
    "atomic_open",
    "atomic_parquet_writer",
    "before_change",
    "guarded_changes",
    "owned_temps",
    "read_parquet",
    "read_parquet_handle",
    "remove_orphaned_temps_of",
    "remove_temps_under",
    "temp_owner_tag",
    "write_bytes_atomic",
    "write_parquet_atomic",
    # Defined here.
    "LINK_RULE",
    "REJECTS_LEDGER_COLUMNS",
    "AbsolutePathStored",
    "DataRoot",
    "OutsideDataRoot",
    "escape_glob",
    "filesystem_for",
]

_is_local = is_local_filesystem
"""The name a few callers import (``speechdata.io.atomic_writes.is_local_filesystem``)."""


def escape_glob(text: str) -> str:
    """``text`` matched literally by DuckDB's and fsspec's globs (``[1]`` becomes ``[[]1]``): a data
    root whose path holds glob characters still finds its own files."""
    return re.sub(r"([*?\[])", r"[\1]", text)


def filesystem_for(root_url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """Resolve a data-root URL (local path, ``file://``, ``s3://``...) into a filesystem and root path.

    A local one reads only regular files (:class:`~speechdata.io.regular_files.RegularFilesOnly`):
    a FIFO or a device planted where a file is read is refused by name instead of blocking the reader."""
    fs, root = fsspec.core.url_to_fs(root_url)
    if is_local_filesystem(fs):
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
        return protocol_of(self.fs)

    @property
    def is_local(self) -> bool:
        """A local (POSIX) directory: files can be handed to libraries that only open paths."""
        return is_local_filesystem(self.fs)

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
        replace_file(self.fs, self.path(source), self.path(destination))

    def open_atomic(self, relative: str):
        """A binary handle whose content appears at ``relative`` only when the block ends without error."""
        return atomic_open(self.fs, self.path(relative), "wb")


def _open_for_arrow(data_root: DataRoot, relative: str):
    """Arrow's own file for a local root: its reads land in Arrow's memory pool, which reuses them.
    Through a Python file object every read is a new multi-MB ``bytes``, and glibc's heap fragments
    under them until resident memory grows with the number of row groups read."""
    if data_root.is_local:
        require_regular(data_root.fs, data_root.path(relative))  # Arrow opens it by name: a FIFO would block it
        return pa.OSFile(data_root.path(relative), "rb")
    return data_root.fs.open(data_root.path(relative), "rb")
