"""dagster_project.instance_storage: the instance the deploy files select reads the shard key list
again only when it changed, sees other processes' writes on the next call, and still creates range
runs that materialize every shard once."""

import shutil
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster_postgres import PostgresEventLogStorage

from dagster_project.instance_storage import CachingPostgresEventLogStorage, CachingSqliteEventLogStorage

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def local_home(tmp_path, monkeypatch) -> str:
    """A DAGSTER_HOME holding deploy/local/dagster.yaml, as `make dev` sets it up."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "local" / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return str(home)


def uncached_keys(storage, name: str) -> list[str]:
    plain = SqliteEventLogStorage if isinstance(storage, SqliteEventLogStorage) else PostgresEventLogStorage
    return list(plain.get_dynamic_partitions(storage, name))


def another_process_writes_are_seen(reader: dg.DagsterInstance, writer: dg.DagsterInstance) -> None:
    storage = reader.event_log_storage
    writer.add_dynamic_partitions("shard", [f"shard-{i:04d}" for i in range(50)])
    assert reader.get_dynamic_partitions("shard") == [f"shard-{i:04d}" for i in range(50)]
    steps = [
        lambda: writer.add_dynamic_partitions("shard", ["shard-late"]),
        lambda: writer.delete_dynamic_partition("shard", "shard-0007"),
        # SQLite gives the next row the deleted newest row's id: same count, same newest id.
        lambda: (writer.delete_dynamic_partition("shard", "shard-late"), writer.add_dynamic_partitions("shard", ["x"])),
        lambda: writer.add_dynamic_partitions("country", ["fr"]),
        lambda: writer.delete_dynamic_partition("shard", "shard-0000"),
    ]
    for step in steps:
        step()
        assert reader.get_dynamic_partitions("shard") == uncached_keys(storage, "shard")
    keys = reader.get_dynamic_partitions("shard")
    assert keys[-1] == "x" and "shard-late" not in keys and "shard-0007" not in keys and "shard-0000" not in keys
    assert len(keys) == 49 and reader.get_dynamic_partitions("country") == ["fr"]


def test_the_local_instance_sees_keys_added_and_deleted_by_another_instance(local_home):
    with dg.DagsterInstance.from_config(local_home) as reader, dg.DagsterInstance.from_config(local_home) as writer:
        assert isinstance(reader.event_log_storage, CachingSqliteEventLogStorage)
        # Dagster's default SQLite layout: the caching storage opens an existing home's databases.
        assert Path(local_home, "history", "runs", "index.db").exists()
        another_process_writes_are_seen(reader, writer)


def test_the_production_instance_sees_keys_added_and_deleted_by_another_instance(tmp_path, monkeypatch):
    from tests.e2e.postgres_server import PostgresServer

    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "production" / "dagster.yaml", home / "dagster.yaml")
    with PostgresServer() as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        with dg.DagsterInstance.from_config(str(home)) as reader, dg.DagsterInstance.from_config(str(home)) as writer:
            assert isinstance(reader.event_log_storage, CachingPostgresEventLogStorage)
            another_process_writes_are_seen(reader, writer)


def test_unchanged_keys_are_read_once_for_many_calls(local_home):
    with dg.DagsterInstance.from_config(local_home) as instance, dg.DagsterInstance.from_config(local_home) as writer:
        storage = instance.event_log_storage
        writer.add_dynamic_partitions("shard", [f"shard-{i:04d}" for i in range(300)])
        lists = [instance.get_dynamic_partitions("shard") for _ in range(30)]
        assert storage.dynamic_partitions_full_reads == 1
        assert all(keys == lists[0] for keys in lists) and len(lists[0]) == 300
        # A caller changing its list leaves the cache alone.
        lists[0].clear()
        assert len(instance.get_dynamic_partitions("shard")) == 300
        writer.add_dynamic_partitions("shard", ["shard-new"])
        for _ in range(10):
            assert instance.get_dynamic_partitions("shard")[-1] == "shard-new"
        assert storage.dynamic_partitions_full_reads == 2
        # Membership keeps Dagster's indexed query: no full read.
        assert instance.has_dynamic_partition("shard", "shard-0299")
        assert not instance.has_dynamic_partition("shard", "shard-gone")
        assert storage.dynamic_partitions_full_reads == 2


SHARDS = dg.DynamicPartitionsDefinition(name="shard")


@dg.asset(partitions_def=SHARDS, backfill_policy=dg.BackfillPolicy.single_run())
def shard_frames(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"shards": len(context.partition_keys)})


@dg.asset(partitions_def=SHARDS, deps=[shard_frames], backfill_policy=dg.BackfillPolicy.single_run())
def shard_features(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={"shards": len(context.partition_keys)})


@dg.asset_check(asset=shard_features)
def shard_features_present() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


def test_a_range_run_on_the_caching_instance_materializes_every_shard_once(local_home):
    with dg.DagsterInstance.from_config(local_home) as instance:
        shards = [f"shard-{i:04d}" for i in range(200)]
        instance.add_dynamic_partitions("shard", shards)
        reads_before = instance.event_log_storage.dynamic_partitions_full_reads
        result = dg.materialize(
            [shard_frames, shard_features, shard_features_present],
            instance=instance,
            tags={
                "dagster/asset_partition_range_start": shards[10],
                "dagster/asset_partition_range_end": shards[73],
            },
        )
        assert result.success
        # Creating and running the range run resolves the range for each asset and check: one read.
        assert instance.event_log_storage.dynamic_partitions_full_reads - reads_before == 1
        for asset in (shard_frames, shard_features):
            materialized = [
                record.partition_key for record in instance.fetch_materializations(asset.key, limit=1000).records
            ]
            assert sorted(materialized) == shards[10:74]


def run_record(instance: dg.DagsterInstance, run_id: str) -> dict:
    """What a run left in the event log, without ids and times: its events (run's file), the planned
    and done materializations (the index), and the check's executions, duplicates kept."""

    def event_row(record) -> tuple:
        event = record.event_log_entry
        return (
            event.dagster_event_type or "",
            event.step_key or "",
            event.dagster_event.partition if event.dagster_event else "",
        )

    events = sorted(map(event_row, instance.get_records_for_run(run_id, limit=10_000).records), key=str)
    stored = {}
    for asset in (shard_frames, shard_features):
        planned = instance.fetch_planned_materializations(asset.key, limit=10_000).records
        done = instance.fetch_materializations(asset.key, limit=10_000).records
        stored[asset.key.to_user_string()] = (
            sorted(record.partition_key for record in planned if record.run_id == run_id),
            sorted(record.partition_key for record in done if record.run_id == run_id),
        )
    checks = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(shard_features.key, "shard_features_present"), limit=10_000
    )
    check_rows = sorted((row.status.value, str(row.partition)) for row in checks if row.run_id == run_id)
    return {"events": events, "assets": stored, "checks": check_rows}


def materialize_range(instance: dg.DagsterInstance, shards: list[str]) -> str:
    result = dg.materialize(
        [shard_frames, shard_features, shard_features_present],
        instance=instance,
        tags={"dagster/asset_partition_range_start": shards[0], "dagster/asset_partition_range_end": shards[-1]},
    )
    assert result.success
    return result.run_id


class CountingConnections:
    """Counts the connections Dagster's SQLite event log storage opens (each its own commit)."""

    def __init__(self, monkeypatch):
        self.opened = 0
        original = SqliteEventLogStorage._connect

        def counting(storage, shard):
            self.opened += 1
            return original(storage, shard)

        monkeypatch.setattr(SqliteEventLogStorage, "_connect", counting)


def test_a_run_writes_its_planned_events_in_one_transaction_per_database_with_dagsters_rows(
    local_home, tmp_path, monkeypatch
):
    # Both instances batch (the caching storage would set it anyway): the difference is the storage.
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    shards = [f"shard-{i:04d}" for i in range(64)]
    connections = CountingConnections(monkeypatch)
    records, opened = {}, {}
    plain_home = tmp_path / "plain_home"
    plain_home.mkdir()
    for name in ("plain", "caching"):
        home = local_home if name == "caching" else str(plain_home)
        with dg.DagsterInstance.from_config(home) as instance:
            assert isinstance(instance.event_log_storage, CachingSqliteEventLogStorage) == (name == "caching")
            instance.add_dynamic_partitions("shard", shards)
            before = connections.opened
            run_id = materialize_range(instance, shards)
            opened[name] = connections.opened - before
            records[name] = run_record(instance, run_id)
            if name == "caching":
                # The run's planned events, and each step's materializations of its 64 shards.
                assert instance.event_log_storage.one_connection_batches >= 3
    # The same events and rows as Dagster's storage writes, none twice.
    assert records["caching"] == records["plain"]
    assert records["plain"]["assets"]["shard_frames"] == (shards, shards)
    planned_events = sum(1 for row in records["plain"]["events"] if row[0].endswith("_PLANNED"))
    assert planned_events >= 2 * len(shards)
    # Dagster opens two connections (the run's file, the index) for each planned event, and more
    # for each materialization; a batch opens two in all.
    assert opened["caching"] <= opened["plain"] - 2 * planned_events + 4, opened


def fail_one_batched_write(monkeypatch, storage_class, at_event: int) -> list[int]:
    """Makes the ``at_event``-th event written inside an event batch fail, once."""
    from dagster._core.storage.event_log.base import EventLogStorage

    store_event, store_event_batch = storage_class.store_event, EventLogStorage.store_event_batch
    in_batch, written, failures = [False], [0], []

    def failing_store_event(storage, event):
        if in_batch[0] and not failures:
            written[0] += 1
            if written[0] == at_event:
                failures.append(at_event)
                raise RuntimeError("disk went away half-way through a batch")
        return store_event(storage, event)

    def flagged_store_event_batch(storage, events):
        in_batch[0] = True
        try:
            return store_event_batch(storage, events)
        finally:
            in_batch[0] = False

    monkeypatch.setattr(storage_class, "store_event", failing_store_event)
    monkeypatch.setattr(EventLogStorage, "store_event_batch", flagged_store_event_batch)
    return failures


def assert_each_shard_planned_and_done_once(record: dict, shards: list[str]) -> None:
    for asset in ("shard_frames", "shard_features"):
        assert record["assets"][asset] == (shards, shards)
    planned = [row for row in record["events"] if row[0] == "ASSET_MATERIALIZATION_PLANNED"]
    assert len(planned) == 2 * len(shards) and len(set(planned)) == len(planned)


def test_a_batch_failing_half_way_leaves_no_event_written_twice_or_lost_sqlite(local_home, monkeypatch):
    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    shards = [f"shard-{i:04d}" for i in range(40)]
    failures = fail_one_batched_write(monkeypatch, SqliteEventLogStorage, at_event=17)
    with dg.DagsterInstance.from_config(local_home) as instance:
        instance.add_dynamic_partitions("shard", shards)
        run_id = materialize_range(instance, shards)
        assert failures == [17]
        # Dagster's fallback wrote the failed batch one event at a time over a rolled-back one.
        assert_each_shard_planned_and_done_once(run_record(instance, run_id), shards)


def test_a_batch_failing_half_way_leaves_no_event_written_twice_or_lost_postgres(tmp_path, monkeypatch):
    from tests.e2e.postgres_server import PostgresServer

    monkeypatch.setenv("DAGSTER_EVENT_BATCH_SIZE", "1000")
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "production" / "dagster.yaml", home / "dagster.yaml")
    shards = [f"shard-{i:04d}" for i in range(40)]
    with PostgresServer() as server:
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            storage = instance.event_log_storage
            assert isinstance(storage, CachingPostgresEventLogStorage)
            instance.add_dynamic_partitions("shard", shards)
            run_id = materialize_range(instance, shards)
            assert storage.one_connection_batches >= 1
            assert_each_shard_planned_and_done_once(run_record(instance, run_id), shards)
            failures = fail_one_batched_write(monkeypatch, PostgresEventLogStorage, at_event=17)
            run_id = materialize_range(instance, shards)
            assert failures == [17]
            assert_each_shard_planned_and_done_once(run_record(instance, run_id), shards)
