"""How readers open the catalog: read-only, its views confined to the data root, and a clear error
when no refresh ever built it. The refresh side is :mod:`~speechdata.catalog.database_file`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import duckdb

from speechdata.catalog.database_checks import BUILD_COMMAND, check_catalog_file
from speechdata.catalog.readonly import lock_down
from speechdata.io.storage import DataRoot


class CatalogNotBuilt(FileNotFoundError):
    """The catalog file does not exist: it names the path and how to build it."""


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
    for path in (database_path, database_path + ".wal"):
        check_catalog_file(path)
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
