"""Creating the catalog's views without opening every file of the corpus.

``CREATE VIEW`` binds the view's query: each ``read_parquet`` over a per-shard glob lists the glob
and, with ``union_by_name``, opens every matching file's metadata to build the union of their
schemas. A refresh that (re)creates the views (every full refresh: the first import, a layout
upgrade) therefore held every file's metadata of the corpus at once, in memory DuckDB's
``memory_limit`` does not bound: about 85 KB per shard, 420 MB at 5 000 shards, and it grew with
the corpus (docs/performance.md, "The catalog's first import within a memory limit").

What the binding decides is not kept: DuckDB binds a view again each time a query reads it (a
column that appears in a later shard, a type that widens, all show without the view being created
again), and the view's SQL names its files under the root variable
(:mod:`speechdata.catalog.root_paths`), read when the query runs. So the refresh creates the views
with that variable pointed at a stand-in root: a folder of its own holding, for each per-shard glob
that matches anything under the real root, one empty parquet file with the columns of one real
file, at the same relative path. Binding then opens one small file per glob, whatever the corpus
size, and the views stored (their SQL, the digest the refresh records) are the same text as when
bound over the real root; readers set the variable to their root, as before.

When the views do not all bind over the stand-ins (a listing scoped to a few shards has no file
for some glob; a column a view names is missing from the file chosen for its glob), they are bound
over the real root, as before.
"""

from __future__ import annotations

import os

import duckdb

from speechdata.catalog.incremental import ListedFile, locations_of
from speechdata.catalog.root_paths import set_root_variable, sql_literal
from speechdata.catalog.view_definitions import create_views
from speechdata.io.duckdb_object_store import enable_data_root_reads
from speechdata.io.storage import DataRoot


def write_stand_ins(
    root: DataRoot, root_uri: str, listed_by_glob: dict[str, dict[str, ListedFile]], folder: str
) -> None:
    """In ``folder`` (created), for each glob with files, the first file's columns in an empty
    parquet file at its relative path (read through a connection of its own, one footer per glob)."""
    os.makedirs(folder, exist_ok=True)
    chosen = sorted({min(files) for files in listed_by_glob.values() if files})
    connection = duckdb.connect(":memory:")
    try:
        enable_data_root_reads(connection, root)
        for path, location in zip(chosen, locations_of(root_uri, chosen), strict=True):
            target = _inside(folder, path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            connection.execute(
                f"COPY (SELECT * FROM read_parquet(?, hive_partitioning = false) LIMIT 0) "
                f"TO {sql_literal(target)} (FORMAT parquet)",
                [location],
            )
    finally:
        connection.close()


def _inside(folder: str, relative_path: str) -> str:
    """``relative_path`` under ``folder``, refused when it would leave it (a listed path never does)."""
    target = os.path.normpath(os.path.join(folder, relative_path))
    if os.path.isabs(relative_path) or os.path.commonpath([folder, target]) != os.path.normpath(folder):
        raise ValueError(f"catalog view binding: listed path {relative_path!r} leaves the stand-in root")
    return target


def binds_over(folder: str, definitions: list[tuple[str, str]]) -> bool:
    """Whether every view of ``definitions`` binds with its root at ``folder`` (tried on a
    connection of its own: a failed ``CREATE VIEW`` would abort the caller's transaction)."""
    probe = duckdb.connect(":memory:")
    try:
        set_root_variable(probe, folder)
        for view, sql in definitions:
            probe.execute(f"CREATE VIEW {view} AS {sql}")
    except duckdb.Error:
        return False
    finally:
        probe.close()
    return True


def create_views_over_stand_ins(
    connection: duckdb.DuckDBPyConnection,
    definitions: list[tuple[str, str]],
    root: DataRoot,
    root_uri: str,
    listed_by_glob: dict[str, dict[str, ListedFile]],
    folder: str,
) -> bool:
    """:func:`~speechdata.catalog.view_definitions.create_views` on ``connection`` (whose views read
    ``root``, named ``root_uri`` in the root variable), bound over stand-ins written into ``folder`` (the caller removes it) when they bind,
    else over the real root; the connection's root variable is the real root's again after.
    Returns whether the stand-ins bound."""
    try:
        write_stand_ins(root, root_uri, listed_by_glob, folder)
        stand_ins = binds_over(folder, definitions)
    except duckdb.Error:  # a file that cannot be read: bound over the root, it fails there as before
        stand_ins = False
    if stand_ins:
        set_root_variable(connection, folder)
    try:
        create_views(connection, definitions)
    finally:
        set_root_variable(connection, root_uri)
    return stand_ins
