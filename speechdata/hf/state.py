"""One country's publishing state in DuckDB: the original script's CSV manifests, made transactional.

One database per country (``hf/_state/<dataset>/<country>.duckdb``), so countries publish in
parallel without contending for one writer. Three tables:

- ``recordings``: one row per source recording: ``duration_hours`` and ``size_mb`` (the original
  publishing script's ``_splits.csv``), its ``split`` (never changed once set) and, for train, its ``subset_id``.
- ``segments``: one row per segment, identified by ``(shard_id, key)`` (``key`` is the landed
  ``utt_id``: two shards may both hold ``utt_000000``, and both are published): recording,
  ``split``, ``subset_id``, the dataset file it is in, ``status`` (``pending`` = written locally,
  ``uploaded``, ``filtered`` with ``reason``, ``error`` with ``error_message``, ``withdrawn`` = its
  shard was re-landed without it and its file is still to be rewritten without it).
- ``files``: one row per file of the dataset folder (parquet shards and the card): ``sha256``,
  ``bytes``, ``rows``, ``status`` (``pending``, ``uploaded``, ``error``, ``deleted`` = removed
  locally, still to delete on the Hub), ``error_message`` and the ``shard_id`` whose segments it
  holds (a split is one *part* per shard: NULL for the card and for files written before parts).
- ``shards``: one row per shard the country's refresh has read: the ``stamp`` (size and time) of
  its utterance index and near-duplicate list when read, the ``fingerprint`` and number (``segments``) of its rows of
  the country, and whether its published index (``needs_index``) and ``hf`` ledger (``needs_gate``)
  are still to write and check. A refresh reads only the shards whose stamp changed.
- ``part_writes``: the parts ``(split, shard_id)`` a build has started writing and not yet
  recorded; a killed build's part is written again (its stray files removed) by the next.
- ``catalog_unreported_shards``: the shards whose published index and ``hf_dataset`` rejects were
  written and that no recorded build has named to the catalog yet (``reported_by``: the build that
  named them last, NULL while none has); written before the files, so a build that stops anywhere
  leaves them for the next one to name (:mod:`speechdata.hf.published_index`).

A data root on object storage keeps the database there too: it is copied to a local temp file,
changed, and copied back atomically (DuckDB writes only to local files).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import duckdb
import pyarrow as pa

from speechdata.io.duckdb_object_store import database_on_root
from speechdata.io.storage import DataRoot, _is_local

SCHEMA = """
CREATE TABLE IF NOT EXISTS settings (
    name VARCHAR PRIMARY KEY, value VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS recordings (
    recording_id VARCHAR PRIMARY KEY,
    video_id VARCHAR,
    shard_id VARCHAR NOT NULL,
    audio_path VARCHAR NOT NULL,
    source_sample_rate INTEGER,
    duration_hours DOUBLE NOT NULL,
    size_mb DOUBLE,
    split VARCHAR NOT NULL,
    subset_id INTEGER,
    assigned_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS segments (
    shard_id VARCHAR NOT NULL,
    key VARCHAR NOT NULL,
    recording_id VARCHAR NOT NULL,
    split VARCHAR NOT NULL,
    subset_id INTEGER,
    file VARCHAR,
    status VARCHAR NOT NULL,
    reason VARCHAR,
    error_message VARCHAR,
    updated_at TIMESTAMP DEFAULT current_timestamp,
    PRIMARY KEY (shard_id, key)
);
CREATE TABLE IF NOT EXISTS files (
    path_in_repo VARCHAR PRIMARY KEY,
    split VARCHAR,
    rows BIGINT,
    bytes BIGINT,
    sha256 VARCHAR,
    status VARCHAR NOT NULL,
    error_message VARCHAR,
    commit_oid VARCHAR,
    updated_at TIMESTAMP DEFAULT current_timestamp
);
CREATE TABLE IF NOT EXISTS shards (
    shard_id VARCHAR PRIMARY KEY,
    stamp VARCHAR,
    fingerprint VARCHAR NOT NULL,
    needs_index BOOLEAN NOT NULL,
    needs_gate BOOLEAN NOT NULL
);
CREATE TABLE IF NOT EXISTS catalog_unreported_shards (
    shard_id VARCHAR PRIMARY KEY,
    reported_by VARCHAR
);
CREATE TABLE IF NOT EXISTS part_writes (
    split VARCHAR NOT NULL,
    shard_id VARCHAR NOT NULL,
    PRIMARY KEY (split, shard_id)
);
ALTER TABLE segments ADD COLUMN IF NOT EXISTS usable_s DOUBLE;
ALTER TABLE files ADD COLUMN IF NOT EXISTS shard_id VARCHAR;
ALTER TABLE shards ADD COLUMN IF NOT EXISTS segments BIGINT;
ALTER TABLE files ADD COLUMN IF NOT EXISTS pseudo_labels BIGINT;
"""

LOCK_TIMEOUT_S = 300.0

SEGMENT_STATUSES = ("pending", "uploaded", "filtered", "error", "withdrawn")
FILE_STATUSES = ("pending", "uploaded", "error", "deleted")


@contextlib.contextmanager
def state_connection(data_root: DataRoot, relative: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to the state database at ``relative``; changes persist only if the block succeeds."""
    path = data_root.path(relative)
    if _is_local(data_root.fs):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        connection = _connect_waiting(path)
        try:
            connection.execute("BEGIN TRANSACTION")
            _key_segments_by_shard(connection)
            connection.execute(SCHEMA)
            yield connection
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        finally:
            connection.close()
        return
    with database_on_root(data_root, relative) as local:
        connection = duckdb.connect(local)
        try:
            _key_segments_by_shard(connection)
            connection.execute(SCHEMA)
            yield connection
            connection.execute("CHECKPOINT")
        finally:
            connection.close()


def _key_segments_by_shard(connection: duckdb.DuckDBPyConnection) -> None:
    """Re-key a ``segments`` table written when ``key`` alone was its primary key (ids collided across shards)."""
    constraint = connection.execute(
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE table_name = 'segments' AND constraint_type = 'PRIMARY KEY'"
    ).fetchall()
    if not constraint or list(constraint[0][0]) != ["key"]:
        return
    connection.execute("ALTER TABLE segments RENAME TO segments_keyed_by_utt_id")
    connection.execute(SCHEMA)
    connection.execute(
        "INSERT INTO segments BY NAME SELECT shard_id, key, recording_id, split, subset_id, file, status, reason, "
        "error_message, updated_at FROM segments_keyed_by_utt_id"
    )
    connection.execute("DROP TABLE segments_keyed_by_utt_id")


@contextlib.contextmanager
def read_state(data_root: DataRoot, relative: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to an existing state database: another country's run may be writing it,
    and a read never puts a copy back over what that run stores (on an object-store root)."""
    with database_on_root(data_root, relative, read_only=True) as local:
        connection = _connect_waiting(local, read_only=True)
        try:
            yield connection
        finally:
            connection.close()


def _connect_waiting(
    path: str, timeout_s: float = LOCK_TIMEOUT_S, read_only: bool = False
) -> duckdb.DuckDBPyConnection:
    """Connect, waiting while another process holds the file (DuckDB allows one writing process)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return duckdb.connect(path, read_only=read_only)
        except duckdb.IOException as exc:
            if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def rows_as_dicts(connection: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict]:
    cursor = connection.execute(sql, params or [])
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def get_setting(connection: duckdb.DuckDBPyConnection, name: str) -> str | None:
    rows = connection.execute("SELECT value FROM settings WHERE name = ?", [name]).fetchall()
    return rows[0][0] if rows else None


def set_setting(connection: duckdb.DuckDBPyConnection, name: str, value: str) -> None:
    connection.execute("INSERT OR REPLACE INTO settings VALUES (?, ?)", [name, value])


@contextlib.contextmanager
def registered_rows(connection: duckdb.DuckDBPyConnection, name: str, columns: dict[str, pa.Array]) -> Iterator[str]:
    """Expose ``columns`` to SQL as the relation ``name`` for set-based inserts and updates.

    Per-row ``executemany`` costs about a millisecond a row in DuckDB; a country with a million
    segments is updated in one statement this way.
    """
    connection.register(name, pa.table(columns))
    try:
        yield name
    finally:
        connection.unregister(name)


def execute_many(connection: duckdb.DuckDBPyConnection, sql: str, parameter_sets: list[list]) -> None:
    """``executemany`` that accepts an empty list (DuckDB refuses one)."""
    if parameter_sets:
        connection.executemany(sql, parameter_sets)
