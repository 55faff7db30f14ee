"""Checks of the catalog's DuckDB files: that each is a regular file, that every block of it reads,
and which objects in it are not the catalog's own (:mod:`~speechdata.catalog.database_file` drops them)."""

from __future__ import annotations

import hashlib
import os
import stat

import duckdb

BUILD_COMMAND = "speechdata catalog --refresh"


class CatalogFileRefused(OSError):
    """A catalog file (or its ``.wal``) is a symbolic link or not a regular file: it names the path."""


def check_catalog_file(path: str) -> None:
    """:class:`CatalogFileRefused` when ``path`` exists and is not a regular file (a symbolic link
    included, whatever it points at); nothing when it is one or does not exist."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise CatalogFileRefused(
            f"{path} is a symbolic link (to {os.readlink(path)}): the catalog's files must be regular files "
            f"of the data root; remove it and run `{BUILD_COMMAND}`"
        )
    if not stat.S_ISREG(info.st_mode):
        raise CatalogFileRefused(
            f"{path} is not a regular file ({_kind(info.st_mode)}): remove it and run `{BUILD_COMMAND}`"
        )


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a file"


def unreadable(path: str, named: str, error: Exception) -> str:
    lines = str(error).strip().splitlines()
    detail = (lines[0] if lines else type(error).__name__).replace(path, named)
    return f"{os.path.basename(named)} is unreadable ({detail})"


def open_checked(
    path: str, named: str, config: dict | None = None
) -> tuple[duckdb.DuckDBPyConnection | None, str | None]:
    """A connection to ``path`` (with DuckDB ``config``) whose every table reads, or None and why (naming ``named``)."""
    connection = None
    try:
        connection = duckdb.connect(path, config=config or {})
        read_every_table(connection)
        return connection, None
    except duckdb.Error as error:
        if connection is not None:
            connection.close()
        return None, unreadable(path, named, error)


def views_digest(connection: duckdb.DuckDBPyConnection) -> str:
    """The digest of the database's views as DuckDB stores them (a view replaced by hand changes it)."""
    rows = connection.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE database_name = current_database() "
        "AND NOT internal AND NOT temporary ORDER BY view_name"
    ).fetchall()
    return hashlib.sha256(repr(rows).encode("utf-8")).hexdigest()


def foreign_objects(connection: duckdb.DuckDBPyConnection, tables: set[str], views: set[str]) -> list[str]:
    """Every object of the connection's database that is not one of ``tables`` or ``views``
    (``kind name``): other tables and views, anything in another schema, macros, sequences, types, indexes."""
    queries = (
        ("schema", "SELECT 'schema', schema_name, schema_name FROM duckdb_schemas() WHERE NOT internal"),
        ("table", "SELECT 'table', schema_name, table_name FROM duckdb_tables() WHERE NOT temporary"),
        ("view", "SELECT 'view', schema_name, view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary"),
        # One scan of duckdb_functions() (every built-in function: about 0.1 s), for both kinds of macro.
        (
            "macro",
            "SELECT DISTINCT CASE function_type WHEN 'macro' THEN 'macro' ELSE 'table macro' END, schema_name, "
            "function_name FROM duckdb_functions() WHERE NOT internal AND function_type IN ('macro', 'table_macro')",
        ),
        ("sequence", "SELECT 'sequence', schema_name, sequence_name FROM duckdb_sequences() WHERE NOT temporary"),
        ("type", "SELECT 'type', schema_name, type_name FROM duckdb_types() WHERE NOT internal"),
        ("index", "SELECT 'index', schema_name, index_name FROM duckdb_indexes() WHERE true"),
    )
    found = []
    for _, sql in queries:
        for kind, schema, name in connection.execute(sql + " AND database_name = current_database()").fetchall():
            if kind == "schema":
                ours = schema in ("main", "pg_catalog", "information_schema")
            else:
                ours = schema == "main" and ((kind == "table" and name in tables) or (kind == "view" and name in views))
            if not ours:
                found.append(f"{kind} {schema}.{name}")
    return found


def drop_foreign_objects(connection: duckdb.DuckDBPyConnection, tables: set[str], views: set[str]) -> list[str]:
    """Drop every :func:`foreign_objects` of the connection's database; returns what was dropped."""
    found = foreign_objects(connection, tables, views)
    statements = {
        "schema": "DROP SCHEMA IF EXISTS {name} CASCADE",
        "table": "DROP TABLE IF EXISTS {qualified} CASCADE",
        "view": "DROP VIEW IF EXISTS {qualified} CASCADE",
        "macro": "DROP MACRO IF EXISTS {qualified}",
        "table macro": "DROP MACRO TABLE IF EXISTS {qualified}",
        "sequence": "DROP SEQUENCE IF EXISTS {qualified} CASCADE",
        "type": "DROP TYPE IF EXISTS {qualified} CASCADE",
        "index": "DROP INDEX IF EXISTS {qualified}",
    }
    # Schemas first: everything in them goes with them.
    for entry in sorted(found, key=lambda e: not e.startswith("schema ")):
        kind, qualified = entry.rsplit(" ", 1)
        schema, name = qualified.split(".", 1)
        quoted = f"{_quote(schema)}.{_quote(name)}"
        connection.execute(statements[kind].format(name=_quote(name), qualified=quoted))
    return found


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def read_every_table(connection: duckdb.DuckDBPyConnection) -> None:
    """Read every block of every table: a file cut short can open and fail only at the blocks it lost."""
    tables = connection.execute(
        "SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database()"
    ).fetchall()
    for schema, table in tables:
        # hash() of the whole row makes DuckDB read every column, without bringing the rows into Python.
        connection.execute(f"SELECT sum(hash(t)) FROM {_quote(schema)}.{_quote(table)} AS t").fetchall()
