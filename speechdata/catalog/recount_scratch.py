"""Where a recount of many shards reads its rows: a scratch connection outside the refresh's transaction.

A refresh is one transaction, and a transaction keeps every temp table it dropped (and every row
it deleted) until it commits, for a rollback. The accounting and quality recounts of a first
import read each turn of :data:`~speechdata.catalog.incremental.SHARDS_PER_RECOUNT` shards into temp
tables and drop them: on the refresh's own connection every turn's rows stayed, 3.5 GB of them at
10 000 shards (spilled, with their bookkeeping in memory the memory limit does not bound, about
20 KB per shard; docs/performance.md, "The catalog's first import within a memory limit").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb


@contextlib.contextmanager
def recount_scratch(connection: duckdb.DuckDBPyConnection, turns: int) -> Iterator[duckdb.DuckDBPyConnection]:
    """Where a recount of ``turns`` turns (:data:`~speechdata.catalog.incremental.SHARDS_PER_RECOUNT`
    shards each) reads its rows into temp tables: with more than one turn, a second connection to
    the refresh's database (its memory limit, threads and spill folder) outside the refresh's
    transaction. Each statement there commits on its own, so a dropped turn's rows go with it; only
    the counts reach the refresh's transaction (:func:`insert_counted`), and the scratch's temp
    tables go when it closes. One turn (a refresh of the shards that changed) keeps only its own
    rows: it reads on the refresh's connection, without the copy of the counts."""
    if turns <= 1:
        yield connection
        return
    scratch = connection.cursor()
    try:
        yield scratch
    finally:
        scratch.close()


def insert_counted(
    connection: duckdb.DuckDBPyConnection,
    table: str,
    scratch: duckdb.DuckDBPyConnection,
    select_sql: str,
    parameters: list | None = None,
) -> None:
    """``INSERT INTO table`` (on ``connection``, in its transaction) the rows of ``select_sql`` run
    on ``scratch`` (its columns in the table's order; :func:`recount_scratch`)."""
    if scratch is connection:
        connection.execute(f"INSERT INTO {table} {select_sql}", parameters or [])
        return
    relation = scratch.sql(select_sql, params=parameters or None)
    # Read whole first (the counts of a turn): the insert never pulls from a query still running on the scratch.
    rows = relation.to_arrow_table() if hasattr(relation, "to_arrow_table") else relation.fetch_arrow_table()
    connection.from_arrow(rows).insert_into(table)
