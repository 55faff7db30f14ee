"""The real daemon: a shard that lands is registered by the sensor and materialized, once."""

import time

import pytest

from speechdata.sample_shards import build_sample_shard
from speechdata.storage import DataRoot
from tests.e2e.dagster_dev import DagsterDev

pytestmark = pytest.mark.e2e

SHARD_ASSETS = ("raw_shards", "normalized_audio", "alignments", "frame_grids")


def wait_for(predicate, dev: DagsterDev, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(2)
    raise TimeoutError(f"timed out waiting for {what}; runs: {dev.runs()}\n{dev.log_tail()}")


def shard_runs(dev: DagsterDev, shard_id: str) -> list[dict]:
    return [
        run for run in dev.runs()
        if {"key": "dagster/partition", "value": shard_id} in run["tags"]
    ]


def done(dev: DagsterDev, shard_id: str) -> bool:
    """The shard's run finished and every shard asset has a materialization for it."""
    finished = [r for r in shard_runs(dev, shard_id) if r["status"] in ("SUCCESS", "FAILURE", "CANCELED")]
    return bool(finished) and all(shard_id in dev.materialized_partitions(a) for a in SHARD_ASSETS)


def test_landed_shards_are_materialized_by_the_sensor_run_once_each(tmp_path):
    data_root = DataRoot(str(tmp_path / "data"))
    env = {"SPEECHDATA_LANDING_SENSOR_INTERVAL_S": "2"}
    with DagsterDev(tmp_path / "dagster_home", tmp_path / "data", env) as dev:
        build_sample_shard(data_root, "e2e-0001", 3, seed=1, long_recordings=1, complete=False)
        time.sleep(6)  # a few sensor ticks over a half-landed shard
        assert shard_runs(dev, "e2e-0001") == []

        from speechdata.sample_shards import mark_landed

        mark_landed(data_root, "e2e-0001")
        wait_for(lambda: done(dev, "e2e-0001"), dev, 240, "e2e-0001 materialized")
        [first_run] = shard_runs(dev, "e2e-0001")
        assert first_run["jobName"] == "per_shard_job" and first_run["status"] == "SUCCESS"
        assert {"key": "speechdata/launched_by", "value": "landing_sensor"} in first_run["tags"]

        build_sample_shard(data_root, "e2e-0002", 2, seed=2, long_recordings=0)
        wait_for(lambda: done(dev, "e2e-0002"), dev, 240, "e2e-0002 materialized")
        time.sleep(5)  # more ticks: neither shard may be requested again
        assert len(shard_runs(dev, "e2e-0001")) == 1
        assert len(shard_runs(dev, "e2e-0002")) == 1
        assert len(dev.runs()) == 2
        assert all(run["status"] == "SUCCESS" for run in dev.runs())
    assert dev.process.poll() is not None
