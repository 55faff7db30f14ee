"""One step over a range of shards (a backfill run) reports each shard on its own, checks included."""

import dagster as dg
import pytest

from assets import ON_DEMAND_SHARD_ASSETS, SHARD_ASSETS
from assets.alignment import frame_grids
from assets.features import qwen_hidden_states
from assets.ingest import normalized_audio, raw_shards
from assets.partitions import shard_partitions
from assets.shard_runs import GPU_SHARDS_PER_RUN
from resources.model_pins import QWEN, model_that_runs
from speechdata.bridge.frame_grid import GRID_RULE_VERSION
from speechdata.testing.shards import build_sample_shard
from tests.tiny_resources import tiny_resources_for

RANGE = {"dagster/asset_partition_range_start": "r0", "dagster/asset_partition_range_end": "r2"}


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def test_a_range_run_records_each_shard_once_with_its_own_metadata_and_checks(instance, data_root):
    shards = ["r0", "r1", "r2"]
    landed = {
        s: build_sample_shard(data_root, s, n, seed=n, long_recordings=0).num_rows for s, n in zip(shards, (1, 2, 3))
    }
    instance.add_dynamic_partitions(shard_partitions.name, [*shards, "other"])
    result = dg.materialize(
        [raw_shards, normalized_audio],
        instance=instance,
        tags=RANGE,
        resources=tiny_resources_for(data_root.url),
    )
    assert result.success
    by_key = {}
    for key in ("raw_shards", "normalized_audio"):
        events = result.asset_materializations_for_node(key)
        # One materialization per shard of the range; the shard outside it is untouched.
        assert sorted(e.partition for e in events) == shards
        assert all(e.metadata["shards_in_step"].value == 3 for e in events)
        by_key[key] = {e.partition: e.metadata for e in events}
    # Each shard's own figures, not the step's: landed rows in, indexed rows on to the audio.
    assert {s: m["utterances_in"].value for s, m in by_key["raw_shards"].items()} == landed
    assert {s: m["utterances_in"].value for s, m in by_key["normalized_audio"].items()} == {
        s: m["dagster/row_count"].value for s, m in by_key["raw_shards"].items()
    }
    checks = result.get_asset_check_evaluations()
    assert sorted((c.asset_key.to_user_string(), c.partition) for c in checks) == sorted(
        (key, s) for key in ("raw_shards", "normalized_audio") for s in shards
    )
    assert all(c.passed and c.target_materialization_data is not None for c in checks)
    schema = result.asset_materializations_for_node("raw_shards")[0].metadata["dagster/column_schema"].value
    assert {"utt_id", "duration_s"} <= {column.name for column in schema.columns}


def test_every_shard_asset_has_a_multi_run_policy_and_gpu_assets_batch_k_shards():
    for asset in [*SHARD_ASSETS, *ON_DEMAND_SHARD_ASSETS]:
        policy = asset.backfill_policy
        assert policy is not None and policy.max_partitions_per_run is not None, asset.key
    assert qwen_hidden_states.backfill_policy.max_partitions_per_run == GPU_SHARDS_PER_RUN > 1


def test_code_versions_carry_the_grid_rule_and_the_qwen_pin():
    [grid_version] = frame_grids.code_versions_by_key.values()
    [qwen_version] = qwen_hidden_states.code_versions_by_key.values()
    # The tests run the tiny profile: the versions name the model that runs, never the production pin.
    ran = model_that_runs(QWEN)
    assert ran.model_id == "tiny-qwen3" and model_that_runs(QWEN, "full") == QWEN
    assert f"grid-{GRID_RULE_VERSION}" in grid_version and ran.identity in grid_version
    assert ran.identity in qwen_version and QWEN.identity not in qwen_version
