"""How the catalog's views name files: relative to the data root a reader sets, so a root can move.

Every view reads ``<root>/<relative glob>`` where ``<root>`` is the connection's ``speechdata_root``
variable (set by :func:`speechdata.io.duckdb_object_store.enable_data_root_reads` to the root being
read) and, when unset (a plain ``duckdb.connect``), the root the catalog was built at. Roots are
glob-escaped: ``/data/run[1]`` matches itself, not a character class.
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


def under_root(relative_glob: str, built_at: str) -> str:
    """A file-name expression for DDL: ``relative_glob`` under the reader's root, else ``built_at``
    (an escaped root, :func:`glob_root`)."""
    return f"(coalesce(getvariable('{ROOT_VARIABLE}'), {sql_literal(built_at)}) || '/' || {sql_literal(relative_glob)})"
