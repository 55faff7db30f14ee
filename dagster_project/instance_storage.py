"""Instance storages whose run creation does not grow with the shards registered or planned.

Why: Dagster 1.13 creates a run over a ``shard`` range by resolving the range once per asset and
check of the run (26 for the per-shard job), and each resolution reads every registered key
(``DagsterInstance.get_dynamic_partitions`` -> the event log storage's ``get_dynamic_partitions``).
At 100 000 shards that is most of a run's creation, and it grows with the shards registered.

``CachingSqliteStorage`` and ``CachingPostgresStorage`` are Dagster's own SQLite and PostgreSQL
storages (``storage: custom:`` in ``dagster.yaml``, with the same config as ``storage: sqlite:`` /
``storage: postgres:``) whose event log storage keeps each definition's key list in process and,
on every call, first asks the database for that definition's version: the count of its rows, the
largest row id and the key of that row (an index answers the first two, the primary key the
third). The full list is read again only when the version changed, so a key added or deleted by
another process (the sensor daemon, the webserver) is seen on the next call. ``has_dynamic_partition``
and every write keep Dagster's queries.

The version is exact where row ids are never reused (PostgreSQL's sequence): any surviving insert
raises the largest id, any delete alone lowers the count. SQLite reuses the largest rowid after
that row is deleted; the key of the newest row catches a delete-then-add of the newest key, and
what is left unseen is deleting the newest two or more keys and adding as many with the last one
equal to the deleted newest, between two calls.

Their event log storages also write an event batch (``store_event_batch``) over one connection per
database: one transaction per SQLite file, one connection for PostgreSQL. Creating a run logs a
planned materialization per asset and shard (about 440 for a run of 32 shards), and Dagster sends
them as one batch, but its storages write a batch one event at a time, each on a new connection with
its own commit: about 8 ms an event on SQLite, the bulk of a run's creation. The events, rows and
order written are Dagster's own (each event still goes through ``store_event``); a batch that fails
rolls back whole and Dagster then writes its events one by one. Dagster batches only when
``DAGSTER_EVENT_BATCH_SIZE`` is set, so constructing these storages sets it (unless the environment
already does) in the processes that use them: the daemon, the webserver and the runs.

Tested against dagster==1.13.27 and dagster-postgres==0.29.27, the versions pyproject.toml pins.
These classes import private Dagster modules (``dagster._core...``) and override private methods of
its storages (``_connect``); ``tests/unit/test_dagster_private_imports.py`` fails, naming the symbol
and its module, when an upgrade moves one of the imports or leaves an ``@override`` overriding
nothing. Upgrading Dagster: bump the pins, run that test and tests/integration/test_instance_storage.py,
then update the versions above.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, cast

import sqlalchemy as db
from dagster._config.config_schema import UserConfigSchema
from dagster._core.events.log import EventLogEntry
from dagster._core.storage.config import PostgresStorageConfig, pg_config
from dagster._core.storage.event_log.schema import DynamicPartitionsTable
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage
from dagster._core.storage.schedules.sqlite.sqlite_schedule_storage import SqliteScheduleStorage
from dagster._core.storage.sqlalchemy_compat import db_select
from dagster._core.storage.sqlite_storage import (
    DagsterSqliteStorage,
    SqliteStorageConfig,
    _event_logs_directory,
    _runs_directory,
    _schedule_directory,
)
from dagster._serdes import ConfigurableClassData
from dagster_postgres import (
    DagsterPostgresStorage,
    PostgresEventLogStorage,
    PostgresRunStorage,
    PostgresScheduleStorage,
)
from dagster_postgres.utils import get_token_provider_from_config, pg_url_from_config
from typing_extensions import override


class PartitionsVersion(NamedTuple):
    """What changes when a definition's keys change: its row count, newest row id and newest key."""

    row_count: int
    newest_id: int | None
    newest_key: str | None


class CachedPartitions(NamedTuple):
    version: PartitionsVersion
    keys: tuple[str, ...]


class DynamicPartitionsCache:
    """The caching ``get_dynamic_partitions`` for a SQL event log storage (a mixin placed first)."""

    def _init_dynamic_partitions_cache(self) -> None:
        self._cached_partitions: dict[str, CachedPartitions] = {}
        self._cached_partitions_lock = threading.Lock()
        # How many times the full key list was read: the tests and the benchmark count it.
        self.dynamic_partitions_full_reads = 0

    def _current_partitions_version(self, partitions_def_name: str) -> PartitionsVersion:
        table = DynamicPartitionsTable
        stats = db_select([db.func.count(table.c.id), db.func.max(table.c.id)]).where(
            table.c.partitions_def_name == partitions_def_name
        )
        with self.index_connection() as conn:  # ty: ignore[unresolved-attribute]
            row_count, newest_id = conn.execute(stats).one()
            newest_key = (
                conn.execute(db_select([table.c.partition]).where(table.c.id == newest_id)).scalar()
                if newest_id is not None
                else None
            )
        return PartitionsVersion(int(row_count), newest_id, newest_key)

    def _read_partitions(self, partitions_def_name: str) -> CachedPartitions:
        table = DynamicPartitionsTable
        query = (
            db_select([table.c.id, table.c.partition])
            .where(table.c.partitions_def_name == partitions_def_name)
            .order_by(table.c.id)
        )
        with self.index_connection() as conn:  # ty: ignore[unresolved-attribute]
            rows = conn.execute(query).fetchall()
        self.dynamic_partitions_full_reads += 1
        keys = tuple(cast("str", row[1]) for row in rows)
        # The version comes from the rows themselves, so a write landing between the version query
        # and this read costs one more read on the next call instead of a stale list.
        version = PartitionsVersion(len(rows), rows[-1][0], keys[-1]) if rows else PartitionsVersion(0, None, None)
        return CachedPartitions(version, keys)

    @override
    def get_dynamic_partitions(self, partitions_def_name: str) -> Sequence[str]:
        self._check_partitions_table()  # ty: ignore[unresolved-attribute]
        version = self._current_partitions_version(partitions_def_name)
        cached = self._cached_partitions.get(partitions_def_name)
        if cached is None or cached.version != version:
            cached = self._read_partitions(partitions_def_name)
            with self._cached_partitions_lock:
                self._cached_partitions[partitions_def_name] = cached
        # A list, as Dagster's storages return: a caller may change it without touching the cache.
        return list(cached.keys)


EVENT_BATCH_SIZE_ENV = "DAGSTER_EVENT_BATCH_SIZE"
EVENT_BATCH_SIZE = 1000
"""Events per batch write: a run of 32 shards plans about 440, so one batch each."""


def enable_event_batches() -> None:
    """Dagster reads this switch from the environment at every event: set it where it is not set."""
    os.environ.setdefault(EVENT_BATCH_SIZE_ENV, str(EVENT_BATCH_SIZE))


class _OpenBatch(threading.local):
    """The batch this thread is writing: its connections by database, closed together at the end."""

    stack: contextlib.ExitStack | None = None
    connections: dict[str, Any]


class OneConnectionBatches:
    """``store_event_batch`` over one connection per database (a mixin placed before the storage).

    Every connection the storage opens while this thread writes a batch (``_connect``, which
    ``run_connection``, ``index_connection`` and ``index_transaction`` all go through) is the
    batch's connection to that database, opened on first use and committed or rolled back when the
    batch ends. Other threads keep their own connections (SQLite: they wait on the storage's lock).
    """

    def _init_one_connection_batches(self) -> None:
        self._open_batch = _OpenBatch()
        # How many batches were written over shared connections: the tests count it.
        self.one_connection_batches = 0

    @override
    def store_event_batch(self, events: Sequence[EventLogEntry]) -> None:
        if len(events) < 2 or self._open_batch.stack is not None:
            super().store_event_batch(events)  # ty: ignore[unresolved-attribute]
            return
        with contextlib.ExitStack() as stack:
            self._open_batch.stack, self._open_batch.connections = stack, {}
            try:
                super().store_event_batch(events)  # ty: ignore[unresolved-attribute]
            finally:
                self._open_batch.stack = None
        self.one_connection_batches += 1

    @contextlib.contextmanager
    def _batch_connection(self, database: str, connect: Any) -> Iterator[Any]:
        batch = self._open_batch
        if batch.stack is None:
            with connect() as conn:
                yield conn
            return
        if database not in batch.connections:
            batch.connections[database] = batch.stack.enter_context(connect())
        yield batch.connections[database]


class CachingSqliteEventLogStorage(DynamicPartitionsCache, OneConnectionBatches, SqliteEventLogStorage):
    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._init_one_connection_batches()  # before the storage's own start-up connects
        super().__init__(base_dir, inst_data=inst_data)
        self._init_dynamic_partitions_cache()
        # A batch holds a connection to the run's file and one to the index while it opens the
        # other: the same thread takes the storage's connection lock twice.
        self._db_lock = threading.RLock()
        enable_event_batches()

    @override
    def _connect(self, shard: str) -> Any:  # ty: ignore[invalid-method-override]
        return self._batch_connection(shard, lambda: SqliteEventLogStorage._connect(self, shard))


class CachingPostgresEventLogStorage(DynamicPartitionsCache, OneConnectionBatches, PostgresEventLogStorage):
    def __init__(self, postgres_url: str, should_autocreate_tables: bool = True, **kwargs):
        self._init_one_connection_batches()  # before the storage's own start-up connects
        super().__init__(postgres_url, should_autocreate_tables, **kwargs)
        self._init_dynamic_partitions_cache()
        enable_event_batches()

    @override
    def _connect(self) -> Any:  # ty: ignore[invalid-method-override]
        return self._batch_connection("postgres", self._batch_transaction)

    @contextlib.contextmanager
    def _batch_transaction(self) -> Iterator[Any]:
        # Dagster's engine autocommits every statement; a batch is one transaction, so one that
        # fails half-way leaves nothing behind for Dagster's one-by-one retry to write twice.
        with PostgresEventLogStorage._connect(self) as conn:
            if self._open_batch.stack is None:
                yield conn
                return
            conn.execution_options(isolation_level="READ COMMITTED")
            with conn.begin():
                yield conn


class CachingSqliteStorage(DagsterSqliteStorage):
    """Dagster's SQLite storage (same layout under ``base_dir``) with the caching event log storage."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        # DagsterSqliteStorage.__init__ would open a plain event log storage first: build the three here.
        self.base_dir = base_dir
        self._run_storage = SqliteRunStorage.from_local(_runs_directory(base_dir))
        self._event_log_storage = CachingSqliteEventLogStorage(_event_logs_directory(base_dir))
        self._schedule_storage = SqliteScheduleStorage.from_local(_schedule_directory(base_dir))
        self._inst_data = inst_data
        super(DagsterSqliteStorage, self).__init__()

    @classmethod
    @override
    def from_config_value(  # ty: ignore[invalid-method-override]
        cls, inst_data: ConfigurableClassData, config_value: SqliteStorageConfig
    ) -> CachingSqliteStorage:
        return cls.from_local(inst_data=inst_data, **config_value)


class CachingPostgresStorage(DagsterPostgresStorage):
    """Dagster's PostgreSQL storage (same config as ``storage: postgres:``) with the caching event log storage."""

    def __init__(
        self,
        postgres_url: str,
        should_autocreate_tables: bool = True,
        inst_data: ConfigurableClassData | None = None,
        token_provider=None,
    ):
        # DagsterPostgresStorage.__init__ would open a plain event log storage first: build the three here.
        self.postgres_url = postgres_url
        self.should_autocreate_tables = should_autocreate_tables
        self._inst_data = inst_data
        self._run_storage = PostgresRunStorage(postgres_url, should_autocreate_tables, token_provider=token_provider)
        self._event_log_storage = CachingPostgresEventLogStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
        self._schedule_storage = PostgresScheduleStorage(
            postgres_url, should_autocreate_tables, token_provider=token_provider
        )
        super(DagsterPostgresStorage, self).__init__()

    @classmethod
    @override
    def config_type(cls) -> UserConfigSchema:
        return pg_config()

    @classmethod
    @override
    def from_config_value(  # ty: ignore[invalid-method-override]
        cls, inst_data: ConfigurableClassData | None, config_value: PostgresStorageConfig
    ) -> CachingPostgresStorage:
        return cls(
            inst_data=inst_data,
            postgres_url=pg_url_from_config(config_value),
            should_autocreate_tables=config_value.get("should_autocreate_tables", True),
            token_provider=get_token_provider_from_config(config_value),
        )
