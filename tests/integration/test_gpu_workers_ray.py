"""The Ray engine of the GPU worker pool, for real: a local two-node Ray cluster, the tiny WavLM.

A custom resource (``test_gpu``) stands in for the GPU, one per node, so the pool has two
workers: the one killed mid-shard and the one that takes the shard over. The tests materialize ``wavlm_features`` through the pool and compare it with the local
engine's output for the same shards.
"""

import os
import signal
import threading
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.alignment import alignments, frame_grids
from assets.features import wavlm_features
from assets.ingest import normalized_audio, raw_shards
from assets.partitions import shard_partitions
from resources.feature_jobs import feature_shard_job
from resources.gpu_worker import HOLD_FLAG_ENV
from resources.gpu_workers import GpuWorkersResource, RayWorkerPool
from speechdata.features.array_store import iter_arrays
from speechdata.io import layout
from speechdata.io.shard_lock import ShardLockLost, held_fence, shard_write_lock
from speechdata.io.storage import TEMP_PREFIX, DataRoot
from speechdata.testing.shards import build_sample_shard
from tests.ray_cluster import start_cluster
from tests.tiny_resources import tiny_resources_for

pytestmark = pytest.mark.slow

SHARDS = ["g0", "g1", "g2"]
RANGE = {"dagster/asset_partition_range_start": SHARDS[0], "dagster/asset_partition_range_end": SHARDS[-1]}


@pytest.fixture(scope="module")
def hold_flag(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("hold") / "hold-shard"


@pytest.fixture(scope="module")
def ray_cluster(hold_flag):
    import ray

    # Worker processes inherit the environment of the node processes, started here.
    os.environ[HOLD_FLAG_ENV] = str(hold_flag)
    node = {"num_cpus": 1, "resources": {"test_gpu": 1}, "object_store_memory": 100 * 1024 * 1024}
    cluster = start_cluster(node)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    os.environ.pop(HOLD_FLAG_ENV, None)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, model_cache_dir):
    """Three small shards with their frame grids and audio, materialized by the local engine."""
    root = DataRoot(str(tmp_path_factory.mktemp("gpu-workers") / "data"))
    for n, shard_id in enumerate(SHARDS, 2):
        build_sample_shard(root, shard_id, n, seed=n, long_recordings=0)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(shard_partitions.name, SHARDS)
    resources = tiny_resources_for(root.url, model_cache_dir)
    upstream = dg.materialize(
        [raw_shards, normalized_audio, alignments, frame_grids], instance=instance, tags=RANGE, resources=resources
    )
    assert upstream.success
    return root, instance, resources


def _ray_pool(cluster, pool_name: str, **settings) -> GpuWorkersResource:
    return GpuWorkersResource(
        engine="ray",
        ray_address=cluster.address,
        namespace="speechdata-test",
        pool_name=pool_name,
        accelerator="test_gpu",
        startup_timeout_s=240,
        **settings,
    )


def _stored_features(root: DataRoot) -> dict[str, dict[str, np.ndarray]]:
    return {shard_id: dict(iter_arrays(root, layout.wavlm_features(shard_id))) for shard_id in SHARDS}


def _kill_pool(pool: GpuWorkersResource) -> None:
    import ray

    workers = RayWorkerPool(pool)
    for index in range(workers.size):
        ray.kill(workers.actor(index), no_restart=True)


def _kill_the_holder(flag: Path, killed: list[int], timeout_s: float = 400.0) -> None:
    pid_file = Path(f"{flag}.pid")
    deadline = time.monotonic() + timeout_s
    while not pid_file.exists():
        if time.monotonic() > deadline:
            return
        time.sleep(0.2)
    pid = int(pid_file.read_text())
    os.kill(pid, signal.SIGKILL)
    killed.append(pid)


def test_a_worker_killed_mid_shard_leaves_every_shard_materialized_once_with_the_local_engines_output(
    ray_cluster, prepared, hold_flag
):
    root, instance, resources = prepared
    pool = _ray_pool(ray_cluster, "exactly-once", max_restarts=1)
    hold_flag.write_text("g1")  # the worker that reaches g1 writes its first batch, then waits to be killed
    killed: list[int] = []
    killer = threading.Thread(target=_kill_the_holder, args=(hold_flag, killed), daemon=True)
    killer.start()
    try:
        on_ray = dg.materialize(
            [wavlm_features], instance=instance, tags=RANGE, resources={**resources, "gpu_workers": pool}
        )
        killer.join(timeout=5)
        from_ray = _stored_features(root)
    finally:
        _kill_pool(pool)

    assert on_ray.success
    assert len(killed) == 1 and Path(f"{hold_flag}.held").exists(), "no worker was killed inside g1"
    events = on_ray.asset_materializations_for_node("wavlm_features")
    assert sorted(e.partition for e in events) == SHARDS  # each shard recorded once, the killed one too
    by_shard = {e.partition: e.metadata for e in events}
    assert all(m["gpu_engine"].value == "ray" for m in by_shard.values())
    assert f"pid {killed[0]} " not in by_shard["g1"]["gpu_worker"].value
    checks = [c for c in on_ray.get_asset_check_evaluations() if c.asset_key.path == ["wavlm_features"]]
    assert sorted(c.partition for c in checks) == sorted(SHARDS * 3) and all(c.passed for c in checks)
    # The killed attempt's temp file is gone: the files are exactly those of one clean run.
    leftovers = [p for p in Path(root.path("")).rglob("*") if p.name.startswith(TEMP_PREFIX)]
    assert leftovers == []

    local = dg.materialize([wavlm_features], instance=instance, tags=RANGE, resources=resources)
    assert local.success
    from_local = _stored_features(root)
    for shard_id in SHARDS:
        assert from_ray[shard_id].keys() == from_local[shard_id].keys() and from_local[shard_id]
        for utt_id, matrix in from_local[shard_id].items():
            assert from_ray[shard_id][utt_id].shape == matrix.shape
            np.testing.assert_allclose(from_ray[shard_id][utt_id], matrix, rtol=1e-2, atol=1e-2)


def test_two_runs_through_the_pool_load_the_model_once(ray_cluster, prepared):
    import ray

    root, instance, resources = prepared
    pool = _ray_pool(ray_cluster, "resident", max_workers=1)
    try:
        first = dg.materialize(
            [wavlm_features], instance=instance, partition_key="g0", resources={**resources, "gpu_workers": pool}
        )
        # A new driver, as a later Dagster run in another process would be: the detached worker stays.
        ray.shutdown()
        second = dg.materialize(
            [wavlm_features], instance=instance, partition_key="g2", resources={**resources, "gpu_workers": pool}
        )
        [state] = RayWorkerPool(pool).describe()
    finally:
        _kill_pool(pool)

    assert first.success and second.success
    [first_event] = first.asset_materializations_for_node("wavlm_features")
    [second_event] = second.asset_materializations_for_node("wavlm_features")
    assert first_event.metadata["model_load_seconds"].value > 0
    assert second_event.metadata["model_load_seconds"].value == 0
    assert first_event.metadata["gpu_worker"].value == second_event.metadata["gpu_worker"].value
    assert list(state["model_loads"].values()) == [1] and state["shards_done"] == 2


def test_a_call_that_outlived_its_step_changes_no_file_of_the_run_that_took_its_shard(ray_cluster, prepared):
    """The step was killed with its call queued on the worker: the call reaches the worker after a
    later run took the shard's lock, and is refused there, with the shard's files untouched."""
    import ray

    root, _, resources = prepared
    pool = _ray_pool(ray_cluster, "fenced", max_workers=1)
    job = feature_shard_job("wavlm", root, resources["wavlm"], resources["torch_device"])
    with shard_write_lock(root, "g0", "wavlm_features", run_id="run-killed"):
        fence = held_fence("g0")
    shard_files = Path(root.path(layout.shard_dir("g0")))
    before = {path: path.read_bytes() for path in shard_files.rglob("*") if path.is_file()}
    try:
        with shard_write_lock(root, "g0", "wavlm_features", run_id="run-later"):
            actor = RayWorkerPool(pool).actor(0)
            with pytest.raises(Exception) as refused:
                ray.get(actor.run_shard.remote(job, "g0", None, None, fence))
            [state] = RayWorkerPool(pool).describe()
    finally:
        _kill_pool(pool)

    lost = refused.value if isinstance(refused.value, ShardLockLost) else getattr(refused.value, "cause", None)
    assert isinstance(lost, ShardLockLost) and "run run-later" in str(lost)
    assert state["shards_done"] == 0 and state["model_loads"] == {}  # refused before any work
    assert {path: path.read_bytes() for path in shard_files.rglob("*") if path.is_file()} == before
