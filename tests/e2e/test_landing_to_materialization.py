"""The real daemon: a shard that lands is registered by the sensor and materialized, once.

The instance is the production one (deploy/production/dagster.yaml): runs, event logs and sensor
ticks in a real PostgreSQL server the test starts. The SQLite instance of `make dev` is the one every
integration test's `instance_for_test` uses.
"""

import time

import pytest

from speechdata.io.storage import DataRoot
from speechdata.testing.shards import build_sample_shard
from tests import spec_snapshot
from tests.e2e.dagster_dev import ROOT, DagsterDev
from tests.e2e.postgres_server import PostgresServer

pytestmark = pytest.mark.e2e

# A run is a fresh process (imports, NeMo's ~30 s) on 2 shared cores: a shard takes 1-3 minutes here.
SHARD_TIMEOUT_S = 420

SHARD_ASSETS = spec_snapshot.job_asset_keys("per_shard_job")
"""What the landing sensor's run materializes, from the reviewed spec snapshot."""


def wait_for(predicate, dev: DagsterDev, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(2)
    raise TimeoutError(f"timed out waiting for {what}; runs: {dev.runs()}\n{dev.log_tail()}")


def shard_runs(dev: DagsterDev, shard_id: str) -> list[dict]:
    return [run for run in dev.runs() if {"key": "dagster/partition", "value": shard_id} in run["tags"]]


def done(dev: DagsterDev, shard_id: str) -> bool:
    """The shard's run finished and every shard asset has a materialization for it."""
    finished = [r for r in shard_runs(dev, shard_id) if r["status"] in ("SUCCESS", "FAILURE", "CANCELED")]
    return bool(finished) and all(shard_id in dev.materialized_partitions(a) for a in SHARD_ASSETS)


def catalog_covers(data_root: DataRoot, shards: int) -> bool:
    import duckdb

    path = data_root.path("catalog.duckdb")
    if not data_root.fs.exists(path):
        return False
    try:
        with duckdb.connect(path, read_only=True) as connection:
            [(count,)] = connection.execute("SELECT count(DISTINCT shard) FROM samples").fetchall()
    except duckdb.Error:  # the refresh run holds the write lock
        return False
    return count == shards


def runs_stored_in_postgres(postgres: PostgresServer, job_name: str) -> dict[str, str]:
    """Run id -> status of a job's runs, read from the instance's own tables (not through Dagster)."""
    import psycopg2

    env = postgres.env
    with (
        psycopg2.connect(
            host=env["DAGSTER_POSTGRES_HOST"],
            port=int(env["DAGSTER_POSTGRES_PORT"]),
            user=env["DAGSTER_POSTGRES_USER"],
            dbname=env["DAGSTER_POSTGRES_DB"],
        ) as connection,
        connection.cursor() as cursor,
    ):
        cursor.execute("SELECT run_id, status FROM runs WHERE pipeline_name = %s", [job_name])
        return dict(cursor.fetchall())


def test_landed_shards_are_materialized_by_the_sensor_run_once_each(tmp_path):
    data_root = DataRoot(str(tmp_path / "data"))
    env = {
        "SPEECHDATA_LANDING_SENSOR_INTERVAL_S": "2",
        "SPEECHDATA_CATALOG_SENSOR_INTERVAL_S": "2",
        # A shard alone launches once it has waited 2 s for a batch (a run of its own, as below).
        "SPEECHDATA_LANDING_BATCH_WAIT_S": "2",
        # The country sensor ticks once at start and then sleeps: its hf_dataset runs (a process each,
        # beside the shard runs) prove nothing here; the publishing tests tick it by hand.
        "SPEECHDATA_PUBLISHING_SENSOR_INTERVAL_S": "86400",
    }
    with (
        PostgresServer() as postgres,
        DagsterDev(
            tmp_path / "dagster_home",
            tmp_path / "data",
            {**env, **postgres.env},
            instance_yaml=ROOT / "deploy" / "production" / "dagster.yaml",
        ) as dev,
    ):
        build_sample_shard(data_root, "e2e-0001", 3, seed=1, long_recordings=1, complete=False)
        time.sleep(4)  # two sensor ticks or more over a half-landed shard (the e2e daemon ticks every 2 s)
        assert shard_runs(dev, "e2e-0001") == []

        from speechdata.landing.mark import mark_landed

        mark_landed(data_root, "e2e-0001")
        wait_for(lambda: done(dev, "e2e-0001"), dev, SHARD_TIMEOUT_S, "e2e-0001 materialized")
        [first_run] = shard_runs(dev, "e2e-0001")
        assert first_run["jobName"] == "per_shard_job" and first_run["status"] == "SUCCESS"
        assert {"key": "speechdata/launched_by", "value": "landing_sensor"} in first_run["tags"]

        build_sample_shard(data_root, "e2e-0002", 2, seed=2, long_recordings=0)
        wait_for(lambda: done(dev, "e2e-0002"), dev, SHARD_TIMEOUT_S, "e2e-0002 materialized")
        time.sleep(5)  # more ticks: neither shard may be requested again
        assert len(shard_runs(dev, "e2e-0001")) == 1
        assert len(shard_runs(dev, "e2e-0002")) == 1
        shard_jobs = [run for run in dev.runs() if run["jobName"] == "per_shard_job"]
        assert len(shard_jobs) == 2

        # The fan-in sensor refreshes the catalog after the manifests, without re-running shards.
        wait_for(lambda: catalog_covers(data_root, 2), dev, SHARD_TIMEOUT_S, "the catalog to hold both shards")
        assert not [run for run in dev.runs() if run["status"] in ("FAILURE", "CANCELED")], dev.runs()
        assert len([run for run in dev.runs() if run["jobName"] == "per_shard_job"]) == 2

        # The runs are rows in PostgreSQL, read with psycopg2; no SQLite storage exists in DAGSTER_HOME.
        shard_runs_in_graphql = {run["runId"]: run["status"] for run in shard_jobs}
        assert runs_stored_in_postgres(postgres, "per_shard_job") == shard_runs_in_graphql
        assert not list((tmp_path / "dagster_home").rglob("*.db"))
    assert dev.process.poll() is not None
