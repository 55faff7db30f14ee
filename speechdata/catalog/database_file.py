"""The catalog's database file: refreshed into a new file swapped in whole, opened read-only by readers.

A refresh never opens ``catalog.duckdb`` for writing. It copies the current file to a temp beside
it (``._tmp-<12 hex>-catalog.duckdb``: the incremental state comes along, so only changed files are
read), refreshes the copy, checkpoints and closes it, and renames it over ``catalog.duckdb``
(``os.replace``). So:

* a reader holding the catalog open (``duckdb.connect(path, read_only=True)``, the CLI) keeps
  reading the version it opened, whole, and never makes the refresh wait (the refresh takes no
  lock a reader holds);
* a reader that opens the catalog during a refresh gets the previous version;
* a refresh that fails or is killed leaves the previous file untouched (its temp is removed by the
  next refresh);
* refreshes wait for each other (a lock file beside the catalog), never for readers.

The catalog is derived data: everything in it is recomputed from the files under the data root.
A file DuckDB cannot open or whose state tables cannot be read (garbage, cut short, written by an
incompatible DuckDB) is therefore rebuilt from scratch, and the refresh says why
(:attr:`RefreshedCatalog.rebuilt_because`); nothing is lost.

Within one process DuckDB shares a database instance between connections to the same path: a
process sees the new version once it has closed its connections to the old one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from speechdata.catalog.readonly import lock_down
from speechdata.catalog.views import CatalogSummary, refresh_catalog
from speechdata.io.duckdb_object_store import enable_data_root_reads
from speechdata.io.storage import TEMP_PREFIX, DataRoot

BUILD_COMMAND = "speechdata catalog --refresh"


class CatalogNotBuilt(FileNotFoundError):
    """The catalog file does not exist: it names the path and how to build it."""


@dataclass(frozen=True)
class RefreshedCatalog:
    summary: CatalogSummary
    reads_through: str
    """How the refresh read the root: ``local``, ``httpfs`` or ``fsspec``."""
    rebuilt_because: str | None = None
    """Why the previous file could not be used and the catalog was rebuilt from scratch; ``None``
    when the previous file (or none) was the starting point."""
    tables: dict[str, pa.Table] = field(default_factory=dict)
    """The results of the ``queries`` asked of the new file before it was swapped in."""


def refresh_catalog_file(
    database_path: str, root: DataRoot, *, full: bool = False, queries: Mapping[str, str] | None = None
) -> RefreshedCatalog:
    """Refresh the catalog at ``database_path`` (a local file) over ``root`` into a new file, then
    swap it in atomically. ``queries`` (name -> SQL) run on the new file before the swap."""
    database_path = os.path.abspath(database_path)
    folder = os.path.dirname(database_path)
    os.makedirs(folder, exist_ok=True)
    with _refresh_lock(database_path):
        _remove_orphaned_builds(database_path)
        build = os.path.join(folder, f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{os.path.basename(database_path)}")
        try:
            connection, rebuilt_because = _open_seeded(database_path, build)
            try:
                reads_through = enable_data_root_reads(connection, root)
                summary = refresh_catalog(connection, root.uri(""), full=full or rebuilt_because is not None)
                tables = {name: _arrow(connection.sql(sql)) for name, sql in (queries or {}).items()}
                connection.execute("CHECKPOINT")
            finally:
                connection.close()
            # A WAL left beside the old file by a writer of the old kind must not be replayed onto the new one.
            with contextlib.suppress(FileNotFoundError):
                os.remove(database_path + ".wal")
            os.replace(build, database_path)
            _fsync_folder(folder)
        finally:
            for leftover in (build, build + ".wal"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
    return RefreshedCatalog(summary, reads_through, rebuilt_because, tables)


def _open_seeded(database_path: str, build: str) -> tuple[duckdb.DuckDBPyConnection, str | None]:
    """A connection to ``build``, a copy of the current catalog; when that copy is unusable, to an
    empty ``build`` and why the copy was not used."""
    if not os.path.exists(database_path):
        return duckdb.connect(build), None
    shutil.copyfile(database_path, build)
    if os.path.exists(database_path + ".wal"):
        shutil.copyfile(database_path + ".wal", build + ".wal")
    connection = None
    try:
        connection = duckdb.connect(build)
        _read_every_table(connection)
        return connection, None
    except duckdb.Error as error:
        if connection is not None:
            connection.close()
        lines = str(error).strip().splitlines()
        detail = (lines[0] if lines else type(error).__name__).replace(build, database_path)
        problem = f"{os.path.basename(database_path)} is unreadable ({detail})"
    for path in (build, build + ".wal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    return duckdb.connect(build), problem


def _read_every_table(connection: duckdb.DuckDBPyConnection) -> None:
    """Read every block of every table: a file cut short can open and fail only at the blocks it lost."""
    tables = [row[0] for row in connection.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
    for table in tables:
        # hash() of the whole row makes DuckDB read every column, without bringing the rows into Python.
        connection.execute(f'SELECT sum(hash(t)) FROM "{table}" AS t').fetchall()


def _arrow(relation) -> pa.Table:
    return relation.to_arrow_table() if hasattr(relation, "to_arrow_table") else relation.fetch_arrow_table()


@contextlib.contextmanager
def _refresh_lock(database_path: str) -> Iterator[None]:
    """Refreshes of one catalog one at a time; readers never take this lock."""
    lock_path = os.path.join(os.path.dirname(database_path), f".{os.path.basename(database_path)}.refresh-lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_orphaned_builds(database_path: str) -> None:
    """Temps of refreshes that were killed (safe: this runs under the refresh lock)."""
    folder, name = os.path.split(database_path)
    for entry in os.listdir(folder):
        if entry.startswith(TEMP_PREFIX) and (entry.endswith("-" + name) or entry.endswith("-" + name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, entry))


def _fsync_folder(folder: str) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def require_catalog(database_path: str, location: str | None = None) -> None:
    """:class:`CatalogNotBuilt` naming ``location`` (default: the path) when no catalog file is there."""
    if not os.path.isfile(database_path):
        raise CatalogNotBuilt(
            f"no catalog at {location or database_path}: build it with `{BUILD_COMMAND}` "
            "(or materialize the manifest_catalog asset)"
        )


@contextlib.contextmanager
def open_catalog_read_only(
    database_path: str, root: DataRoot, location: str | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the catalog at ``database_path`` (a local file) whose views read
    ``root`` and nothing else (:func:`~speechdata.catalog.readonly.lock_down`). :class:`CatalogNotBuilt`
    names ``location`` (default: the path) when no refresh ever built it."""
    require_catalog(database_path, location)
    connection = duckdb.connect(database_path, read_only=True)
    try:
        # Every refresh writes ``catalog_info``: without it the file is a database no refresh built
        # (a ``duckdb.connect(path)`` creates an empty one), and a query would only say "no table samples".
        built = connection.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'catalog_info'").fetchone()
        if not built[0]:
            raise CatalogNotBuilt(
                f"the catalog at {location or database_path} was never built (no catalog_info table): build it "
                f"with `{BUILD_COMMAND}` (or materialize the manifest_catalog asset)"
            )
        lock_down(connection, root)
        yield connection
    finally:
        connection.close()
