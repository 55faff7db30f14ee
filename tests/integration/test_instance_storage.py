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
