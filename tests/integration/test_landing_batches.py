"""The landing sensor batches shards into runs: by count, by waiting time, across restarts, once each."""

import shlex
from pathlib import Path

import dagster as dg
import pytest

from assets import SHARD_ASSETS
from assets.near_duplicates import near_duplicates_batch_job
from dagster_project.webserver_launch import AssetNode, select_assets
from resources.storage import DataRootResource
from sensors.landing import (
    BATCH_SHARDS_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    RELANDED_TAG,
    build_landing_sensor,
)
from speechdata.bridge.manifest import manifest_path
from speechdata.cli import build_parser
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.fingerprint import FINGERPRINT_STATE
from speechdata.landing.scan import landing_fingerprint
from speechdata.quality import near_dup_index_order
from speechdata.testing.shards import build_sample_shard
from tests import spec_snapshot
from tests.integration.test_attacks_relanding import touch_later
from tests.integration.test_landing_sensor import tick
from tests.tiny_resources import tiny_resources_for

FIRST_IMPORT_HEADING = "### A first import with the batch pass"


class Clock:
    """Seconds the sensor reads as now, moved by the test."""

    def __init__(self):
        self.now_s = 1_000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def land(data_root, *shards):
    for shard_id in shards:
        build_sample_shard(data_root, shard_id, 1, seed=len(shard_id), long_recordings=0, formats=("wav",))


def shards_of(request: dg.RunRequest, instance) -> list[str]:
    """The shards a run request covers, resolved against the registered partition order."""
    if request.partition_key is not None:
        return [request.partition_key]
    order = instance.get_dynamic_partitions("shard")
    start, end = order.index(request.tags[RANGE_START_TAG]), order.index(request.tags[RANGE_END_TAG])
    return order[start : end + 1]


def test_a_full_batch_launches_at_once_as_one_range_run(instance, data_root):
    sensor = build_landing_sensor(batch_shards=3, batch_wait_s=3_600, clock=Clock())
    land(data_root, "a0", "a1", "a2", "a3")
    result = tick(sensor, instance, data_root)
    # All four are registered in the tick; three make a batch, the fourth waits for more.
    assert instance.get_dynamic_partitions("shard") == ["a0", "a1", "a2", "a3"]
    [request] = result.run_requests
    assert request.partition_key is None
    assert (request.tags[RANGE_START_TAG], request.tags[RANGE_END_TAG]) == ("a0", "a2")
    assert request.tags[BATCH_SHARDS_TAG] == "3" and RELANDED_TAG not in request.tags
    assert request.run_key.startswith("a0..a2#3:")
    assert shards_of(request, instance) == ["a0", "a1", "a2"]
    assert tick(sensor, instance, data_root, result.cursor).run_requests == []


def test_a_partial_batch_waits_then_launches_once_its_oldest_shard_waited_long_enough(instance, data_root):
    clock = Clock()
    sensor = build_landing_sensor(batch_shards=4, batch_wait_s=60, clock=clock)
    land(data_root, "b0")
    first = tick(sensor, instance, data_root)
    assert first.run_requests == [] and instance.get_dynamic_partitions("shard") == ["b0"]
    clock.now_s += 40
    land(data_root, "b1")
    second = tick(sensor, instance, data_root, first.cursor)
    assert second.run_requests == [] and instance.get_dynamic_partitions("shard") == ["b0", "b1"]
    clock.now_s += 20  # b0 has now waited 60 s, b1 20 s: the batch goes with both
    third = tick(sensor, instance, data_root, second.cursor)
    [request] = third.run_requests
    assert shards_of(request, instance) == ["b0", "b1"]
    clock.now_s += 3_600
    assert tick(sensor, instance, data_root, third.cursor).run_requests == []


def test_a_restarted_sensor_launches_the_batch_its_cursor_left_waiting(instance, data_root):
    clock = Clock()
    land(data_root, "c0", "c1")
    before = tick(build_landing_sensor(batch_shards=3, batch_wait_s=60, clock=clock), instance, data_root)
    assert before.run_requests == []
    # A new process: the only memory is the stored cursor (and the registered partitions).
    restarted = build_landing_sensor(batch_shards=3, batch_wait_s=60, clock=clock)
    land(data_root, "c2")
    after = tick(restarted, instance, data_root, before.cursor)
    [request] = after.run_requests
    assert shards_of(request, instance) == ["c0", "c1", "c2"]
    # A restart that lost the cursor would have requested nothing: the shards were registered already.
    assert tick(restarted, instance, data_root, None).run_requests == []


def test_no_shard_is_requested_twice_however_landings_and_ticks_interleave(instance, data_root):
    clock = Clock()
    sensor = build_landing_sensor(max_shards_per_tick=3, batch_shards=4, batch_wait_s=50, clock=clock)
    landed, requested, run_keys, cursor = [], [], [], None
    for step in range(12):
        if step < 7:
            new = [f"d{step}x{i}" for i in range(step % 3 + 1)]
            land(data_root, *new)
            landed += new
        result = tick(sensor, instance, data_root, cursor)
        cursor = result.cursor
        for request in result.run_requests:
            run_keys.append(request.run_key)
            requested += shards_of(request, instance)
        clock.now_s += 20
    assert sorted(requested) == sorted(landed) and len(set(run_keys)) == len(run_keys)
    assert any(".." in key for key in run_keys), run_keys  # some runs carried a batch, not one shard


def test_a_relanded_shard_joins_a_batch_under_its_new_fingerprint(instance, data_root):
    clock = Clock()
    sensor = build_landing_sensor(batch_shards=2, batch_wait_s=60, clock=clock)
    land(data_root, "e0", "e1")
    first = tick(sensor, instance, data_root)
    assert [shards_of(r, instance) for r in first.run_requests] == [["e0", "e1"]]

    build_sample_shard(data_root, "e0", 2, seed=7, long_recordings=0, formats=("wav",))
    touch_later(data_root, layout.landing_success_marker("e0"))
    again = tick(sensor, instance, data_root, first.cursor)
    assert again.run_requests == []  # one shard waits for a second one, or for 60 s
    clock.now_s += 61
    [request] = tick(sensor, instance, data_root, again.cursor).run_requests
    assert request.partition_key == "e0" and request.tags[RELANDED_TAG] == "true"
    assert request.run_key == f"e0@{landing_fingerprint(data_root, 'e0')}"


def files_under(root) -> dict[str, bytes]:
    """Every file the runs wrote, by path under the root. Left out: what was landed (and the landed
    files' identities, which name their modification times), and the records of how the index order
    got where it is (one shard after another, or a pass's reservations then commits)."""
    base = Path(root.root)
    return {
        path.relative_to(base).as_posix(): path.read_bytes()
        for path in sorted(base.rglob("*"))
        if path.is_file()
        and path.relative_to(base).parts[0] != "landing"
        and path.relative_to(base).as_posix() != FINGERPRINT_STATE
        and f"/{near_dup_index_order.ORDER_LOG}/" not in path.as_posix()
    }


def first_import_commands() -> list:
    """The ``speechdata shard`` command lines of docs/deploying.md's first-import recipe, parsed."""
    docs = (Path(__file__).resolve().parents[2] / "docs" / "deploying.md").read_text()
    recipe = docs[docs.index(FIRST_IMPORT_HEADING) :]
    recipe = recipe[: recipe.index("\n## ", 1) if "\n## " in recipe else None]
    recipe = recipe[: recipe.index("\n### ", 1) if "\n### " in recipe else None]
    lines = [line.strip() for line in recipe.splitlines() if line.strip().startswith("speechdata shard ")]
    return [build_parser().parse_args(shlex.split(line, comments=True)[1:]) for line in lines]


def asset_nodes_of_the_snapshot() -> dict[str, AssetNode]:
    """The asset nodes the webserver lists (dagster_project.webserver_launch.asset_nodes), from the
    reviewed definitions snapshot: group, by shard or not, upstream assets and jobs."""
    spec = spec_snapshot.stored_spec()
    return {
        name: AssetNode(
            name,
            asset["group"],
            (asset["partitions"] or {}).get("name") == "shard",
            "speech_data_platform",
            "__repository__",
            deps=tuple(asset["deps"]),
            jobs=tuple(job for job, entry in spec["jobs"].items() if name in entry["assets"]),
        )
        for name, asset in spec["assets"].items()
    }


@pytest.mark.slow  # both flows over two one-utterance shards, every per-shard asset: about 17 s here
def test_a_first_import_around_the_batch_pass_builds_what_the_landing_runs_build_deciding_each_shard_once(
    instance, tmp_path, model_cache_dir
):
    # The landing flow: one run over the batch's range, every per-shard asset once per shard.
    landed = DataRoot(str(tmp_path / "landed"))
    sensor = build_landing_sensor(batch_shards=2, batch_wait_s=3_600, clock=Clock())
    land(landed, "f0", "f1")  # the same recording twice: f1's is an exact copy of f0's
    [request] = tick(sensor, instance, landed).run_requests
    result = dg.materialize(
        SHARD_ASSETS, instance=instance, tags=request.tags, resources=tiny_resources_for(landed.url, model_cache_dir)
    )
    assert result.success
    for asset in SHARD_ASSETS:
        events = result.asset_materializations_for_node(asset.key.to_python_identifier())
        assert sorted(e.partition for e in events) == ["f0", "f1"], asset.key
    for shard_id in ("f0", "f1"):
        assert landed.exists(manifest_path(shard_id)), shard_id

    # The first import (docs/deploying.md): registered without a run, the assets before
    # near_duplicates, the batch pass, then the rest, as the recipe's command lines select them.
    with dg.instance_for_test() as imported:
        root = DataRoot(str(tmp_path / "imported"))
        register_only = build_landing_sensor(batch_shards=1, batch_wait_s=0, clock=Clock(), register_only=True)
        land(root, "f0", "f1")
        registered = tick(register_only, imported, root)
        assert registered.run_requests == [] and imported.get_dynamic_partitions("shard") == ["f0", "f1"]
        # Turned off again, the sensor launches nothing for the shards it registered meanwhile.
        assert (
            tick(build_landing_sensor(batch_shards=1, batch_wait_s=0), imported, root, registered.cursor).run_requests
            == []
        )
        before, after = first_import_commands()
        nodes = asset_nodes_of_the_snapshot()
        resources = tiny_resources_for(root.url, model_cache_dir)  # the models the landing run built, reused
        everything = {RANGE_START_TAG: "f0", RANGE_END_TAG: "f1"}  # what a backfill run over both carries
        for command in (before, "batch", after):
            if command == "batch":
                ran = near_duplicates_batch_job.execute_in_process(
                    run_config={"ops": {"near_duplicates_batch": {"config": {"ray_address": "in-process"}}}},
                    instance=imported,
                    resources={"data_root": DataRootResource(url=root.url)},
                )
            else:
                assert command.all and not command.select and not command.group
                selected = select_assets(nodes, before=command.before, after=command.after)
                ran = dg.materialize(
                    SHARD_ASSETS, selection=selected, instance=imported, tags=everything, resources=resources
                )
            assert ran.success
        decided = imported.fetch_materializations(dg.AssetKey("near_duplicates"), limit=100).records
        assert sorted(record.partition_key for record in decided) == ["f0", "f1"]
        for asset in SHARD_ASSETS:
            assert imported.get_materialized_partitions(asset.key) == {"f0", "f1"}, asset.key
        assert root.read_parquet(layout.near_duplicates("f1")).column("kind").to_pylist() == ["exact_audio"]
        assert files_under(root) == files_under(landed)


def test_the_sensor_daemon_queues_one_per_shard_job_run_over_the_batchs_range(tmp_path, monkeypatch):
    import logging

    from dagster._core.events import DagsterEventType
    from dagster._daemon.sensor import execute_sensor_iteration

    from benchmarks.orchestration.bench_backfill_launch import QUEUE_ONLY
    from benchmarks.orchestration.bench_orchestration_scale import code_location_workspace
    from speechdata.io.storage import DataRoot

    # The code server the daemon loads reads these when it starts.
    monkeypatch.setenv("DATA_ROOT", str(tmp_path / "data"))
    monkeypatch.setenv("SPEECHDATA_LANDING_BATCH_SHARDS", "3")
    monkeypatch.setenv("SPEECHDATA_LANDING_SENSOR_INTERVAL_S", "1")
    land(DataRoot(str(tmp_path / "data")), "g0", "g1", "g2")
    (tmp_path / "home").mkdir()
    with (
        dg.instance_for_test(temp_dir=str(tmp_path / "home"), overrides=QUEUE_ONLY) as instance,
        code_location_workspace(instance) as workspace,
    ):
        for _ in range(2):
            list(execute_sensor_iteration(workspace, logging.getLogger("landing_sensor"), None, None))
        [run] = instance.get_runs()
        assert run.job_name == "per_shard_job" and run.status == dg.DagsterRunStatus.QUEUED
        assert (run.tags[RANGE_START_TAG], run.tags[RANGE_END_TAG]) == ("g0", "g2")
        planned = instance.get_records_for_run(
            run.run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION_PLANNED
        ).records
        # Dagster plans each shard of the range for each asset of the job: per-shard lineage.
        by_asset = {}
        for record in planned:
            event = record.event_log_entry.dagster_event
            by_asset.setdefault(event.asset_key.to_user_string(), []).append(event.event_specific_data.partition)
        assert len(by_asset) == len(SHARD_ASSETS)
        assert all(sorted(shards) == ["g0", "g1", "g2"] for shards in by_asset.values()), by_asset
