"""Which layout of the catalog's state tables a state was written with.

A refresh keeps some tables derived from others (per-shard rejected counts, histogram totals:
:mod:`~speechdata.catalog.incremental`, :mod:`~speechdata.catalog.quality_state`) up to date for the
shards it looks at. A state written before such a table existed has none of its rows, and a scoped
refresh cannot fill them from the shards it looks at: a state that records an earlier layout, or
none, is rebuilt by a full refresh (every file read again), once.
"""

from __future__ import annotations

import duckdb

STATE_LAYOUT_VERSION = 2
"""1 (none recorded): before ``catalog_rejected_shards`` and ``catalog_quality_bin_totals``."""
_LAYOUT = "catalog_state_layout"
STATE_LAYOUT_TABLES = {_LAYOUT: "version BIGINT"}


def state_predates_layout(connection: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's state records a layout other than :data:`STATE_LAYOUT_VERSION`,
    or none (an empty state included): its refresh must be full."""
    recorded = connection.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = ?",
        [_LAYOUT],
    ).fetchone()[0]
    if not recorded:
        return True
    return connection.execute(f"SELECT version FROM {_LAYOUT}").fetchall() != [(STATE_LAYOUT_VERSION,)]


def record_state_layout(connection: duckdb.DuckDBPyConnection) -> None:
    """After a refresh brought every table of the state up to date, in its transaction."""
    connection.execute(f"DELETE FROM {_LAYOUT}")
    connection.execute(f"INSERT INTO {_LAYOUT} VALUES (?)", [STATE_LAYOUT_VERSION])
