"""How the catalog's views name files: relative to the data root they are opened in, never the one
they were built over.

Every view reads ``<root>/<relative glob>``, where ``<root>`` is resolved when the query runs:

* the connection's ``speechdata_root`` variable when set (the refresh, the ``speechdata catalog``
  command and :func:`speechdata.io.duckdb_object_store.enable_data_root_reads` set it to the root
  being read);
* else, in a plain ``duckdb.connect('<root>/catalog.duckdb')``, the folder holding the catalog file:
  a catalog copied or moved with its data root reads the copy's files, and the old root, even
  while it still exists, is never read;
* else (the catalog file's folder cannot be told, for example ``temp_directory`` set elsewhere, or
  the catalog ``ATTACH``\\ ed under another name) the query fails naming the root the catalog was
  built over and the ``SET VARIABLE`` that points it at a root.

DuckDB gives a view no scalar for its own database file, so the folder comes from the default
``temp_directory`` (``<folder>/<database>.<ext>.tmp``), and only when its name matches the current
database. Roots are glob-escaped: ``/data/run[1]`` matches itself, not a character class.
"""

from __future__ import annotations

import duckdb

from speechdata.io.duckdb_object_store import duckdb_location
from speechdata.io.storage import escape_glob

ROOT_VARIABLE = "speechdata_root"


def sql_literal(text: str) -> str:
    """A SQL string literal (for DDL, where DuckDB takes no parameters; never for user values)."""
    return "'" + text.replace("'", "''") + "'"


def glob_root(root_uri: str) -> str:
    """The root as DuckDB names it, glob-escaped."""
    return escape_glob(duckdb_location(root_uri))


def set_root_variable(connection: duckdb.DuckDBPyConnection, root_uri: str) -> None:
    """Point the views at the data root at ``root_uri``."""
    connection.execute(f"SET VARIABLE {ROOT_VARIABLE} = ?", [glob_root(root_uri)])


_TEMP_DIRECTORY = "current_setting('temp_directory')"
_DATABASE_FOLDER_KNOWN = (
    f"(ends_with({_TEMP_DIRECTORY}, '.tmp') "
    f"AND starts_with(parse_filename({_TEMP_DIRECTORY}), current_database() || '.'))"
)
# Same escaping as speechdata.io.storage.escape_glob, in SQL: the folder is only known at query time.
_DATABASE_FOLDER = f"regexp_replace(rtrim(parse_dirpath({_TEMP_DIRECTORY}), '/'), '([*?\\[])', '[\\1]', 'g')"


def root_expression(built_at: str) -> str:
    """The SQL expression for the root a view reads (see the module docstring); ``built_at`` (an
    escaped root, :func:`glob_root`) is named in the error, never read."""
    message = (
        "the catalog views read the data root in the speechdata_root variable or, when it is unset, "
        "the folder holding the catalog file, and this connection has neither (temp_directory moved, "
        "or the catalog attached under another name). This catalog was built over "
        f"{built_at}: run SET VARIABLE {ROOT_VARIABLE} = '<data root>'; first"
    )
    return (
        f"coalesce(getvariable('{ROOT_VARIABLE}'), CASE WHEN {_DATABASE_FOLDER_KNOWN} THEN {_DATABASE_FOLDER} "
        f"ELSE CAST(error({sql_literal(message)}) AS VARCHAR) END)"
    )


def under_root(relative_glob: str, built_at: str) -> str:
    """A file-name expression for DDL: ``relative_glob`` under the root the view is read in
    (:func:`root_expression`)."""
    return f"({root_expression(built_at)} || '/' || {sql_literal(relative_glob)})"
