"""Read-only means read-only: a catalog connection for people's SQL can neither write nor read
files outside the data root's catalogued folders.

DuckDB's ``read_only`` connection protects the database file only: ``COPY ... TO '/anywhere'`` and
``read_text('/etc/passwd')`` still run. Here the connection may read only the folders the views
read (``allowed_directories``), external access is otherwise off, the configuration is locked so a
query cannot turn it back on, and statements other than queries are refused before they run.
"""

from __future__ import annotations

import duckdb

from speechdata.bridge.manifest import MANIFESTS_DIR
from speechdata.io import layout
from speechdata.io.storage import DataRoot, escape_glob

READABLE_FOLDERS = (MANIFESTS_DIR, layout.SHARDS, layout.LANDING, layout.TRANSLATION, layout.ASR)
"""What the catalog's views read, relative to the data root."""

_QUERY_TYPES = {"SELECT", "EXPLAIN"}


def lock_down(connection: duckdb.DuckDBPyConnection, root: DataRoot) -> None:
    """Allow reads under the root's catalogued folders only, then lock the configuration.

    On an object-store root the views read through httpfs or a registered fsspec filesystem, which
    DuckDB's path allow-list does not cover; there only the statement check below applies.
    """
    if not root.is_local:
        return
    base = root.root.rstrip("/")
    # The views' globs name the root escaped (``run[1]`` as ``run[[]1]``); DuckDB checks that text.
    bases = sorted({base, escape_glob(base)})
    allowed = ", ".join("'" + f"{b}/{folder}/".replace("'", "''") + "'" for b in bases for folder in READABLE_FOLDERS)
    connection.execute(f"SET allowed_directories = [{allowed}]")
    connection.execute("SET enable_external_access = false")
    connection.execute("SET lock_configuration = true")


def check_query_only(connection: duckdb.DuckDBPyConnection, sql: str) -> None:
    """ValueError naming the statement when ``sql`` holds anything but queries (COPY, ATTACH, SET...)."""
    try:
        statements = connection.extract_statements(sql)
    except duckdb.Error:
        return  # a syntax error: running it reports DuckDB's own message
    for statement in statements:
        kind = statement.type.name.upper()
        if kind not in _QUERY_TYPES:
            raise ValueError(f"read-only catalog: only queries (SELECT, EXPLAIN) run here, refused a {kind} statement")
