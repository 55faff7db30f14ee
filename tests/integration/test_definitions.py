"""The code location loads, and its asset keys, groups and partitions stay what the contracts fix (docs/)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.partitions import PER_SHARD_TAGS
from dagster_project.definitions import defs
from tests import spec_snapshot

ROOT = Path(__file__).resolve().parents[2]
[PER_SHARD_TAG] = PER_SHARD_TAGS


def test_definitions_match_the_spec_snapshot(update_spec_snapshot):
    """Every asset's key, group, partitions, deps, checks, tags, kinds, owners, code version, pool and
    backfill policy, and every job, sensor and resource key, are what tests/definitions_snapshot.json
    holds (for the tiny profile, whatever the caller's environment).

    After a deliberate change, regenerate it and review the diff like code::

        PYTHONPATH=$PWD .venv/bin/python -m pytest tests/integration/test_definitions.py --update-spec-snapshot
    """
    current = spec_snapshot.current_snapshot()
    if update_spec_snapshot:
        spec_snapshot.SNAPSHOT_PATH.write_text(current)
    stored = spec_snapshot.stored_snapshot()
    if current != stored:
        pytest.fail(
            "the definitions differ from the spec snapshot; if the change is deliberate, rerun with "
            f"--update-spec-snapshot and commit the file:\n{spec_snapshot.readable_diff(stored, current)}",
            pytrace=False,
        )


def test_spec_snapshot_is_independent_of_the_machine_and_the_profile(monkeypatch):
    """No absolute path in the file, and a caller on the full profile with its own model revisions and
    sensor intervals gets the same snapshot."""
    stored = spec_snapshot.stored_snapshot()
    assert str(ROOT) not in stored and "/tmp" not in stored and str(Path.home()) not in stored
    assert json.loads(stored) == spec_snapshot.stored_spec()
    monkeypatch.setenv("SPEECHDATA_PROFILE", "full")
    monkeypatch.setenv("SPEECHDATA_QWEN_REVISION", "0123abcd")
    monkeypatch.setenv("SPEECHDATA_LANDING_SENSOR_INTERVAL_S", "5")
    assert spec_snapshot.current_snapshot() == stored


def test_spec_snapshot_shows_a_changed_spec_in_its_diff():
    stored = spec_snapshot.stored_snapshot()
    spec = json.loads(stored)
    spec["assets"]["frame_grids"]["group"] = "moved"
    diff = spec_snapshot.readable_diff(stored, spec_snapshot.render(spec))
    assert '-      "group": "alignment",' in diff and '+      "group": "moved",' in diff


def test_the_running_definitions_are_the_ones_the_snapshot_describes():
    """The in-process code location (tiny profile) agrees with the snapshot's asset keys and groups."""
    specs = {spec.key.to_user_string(): spec.group_name for spec in defs.resolve_all_asset_specs()}
    assert specs == {key: asset["group"] for key, asset in spec_snapshot.stored_spec()["assets"].items()}


def test_every_asset_has_a_description_owner_and_kind():
    for spec in defs.resolve_all_asset_specs():
        assert spec.description and len(spec.description) > 80, spec.key
        assert spec.owners, spec.key
        assert spec.kinds, spec.key


def test_sensor_targets_the_per_shard_job_covering_every_shard_asset():
    job = defs.resolve_job_def("per_shard_job")
    shard_assets = {
        spec.key
        for spec in defs.resolve_all_asset_specs()
        if isinstance(spec.partitions_def, dg.DynamicPartitionsDefinition) and spec.partitions_def.name == "shard"
    }
    # Shard assets without the per-shard tag wait for the LLM segmentation; the translation job runs them.
    on_demand = {
        spec.key
        for spec in defs.resolve_all_asset_specs()
        if spec.key in shard_assets and PER_SHARD_TAG not in spec.tags
    }
    assert on_demand and on_demand < shard_assets
    assert set(job.asset_layer.executable_asset_keys) == shard_assets - on_demand
    assert set(defs.resolve_job_def("translation_job").asset_layer.executable_asset_keys) == on_demand
    assert defs.resolve_sensor_def("landing_sensor").job_name == "per_shard_job"


def test_country_runs_queue_one_at_a_time_per_country():
    import yaml

    sensor = defs.resolve_sensor_def("country_dataset_sensor")
    assert {job.name for job in sensor.jobs} == {"hf_dataset_job", "hf_publish_job"}
    publish = defs.resolve_job_def("hf_publish_job")
    assert {k.to_user_string() for k in publish.asset_layer.executable_asset_keys} == {
        "hf_split_assignments",
        "hf_dataset",
        "hf_hub_upload",
    }
    limits = yaml.safe_load((ROOT / "deploy/local/dagster.yaml").read_text())["concurrency"]["runs"][
        "tag_concurrency_limits"
    ]
    assert {"key": "speechdata/hf_country", "value": {"applyLimitPerUniqueValue": True}, "limit": 1} in limits


def test_dagster_cli_validates_the_workspace(tmp_path):
    dagster = Path(sys.executable).parent / "dagster"
    # An inherited DAGSTER_HOME (make exports one) may not exist yet in a fresh clone.
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path)}
    result = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Validation successful" in result.stderr + result.stdout


def test_gpu_assets_use_the_gpu_pool_and_request_a_gpu_on_kubernetes():
    gpu_assets = spec_snapshot.gpu_asset_keys()
    assert gpu_assets
    for key in gpu_assets:
        assets_def = defs.resolve_assets_def(key)
        [op] = [assets_def.op]
        assert op.pool == "gpu"
        # Dagster stores structured op tags as JSON strings.
        limits = json.loads(op.tags["dagster-k8s/config"])["container_config"]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"


def test_a_resource_an_asset_needs_must_be_bound():
    import types

    import pytest

    from dagster_project.loader import RESOURCE_FACTORIES, resource_factories

    @dg.asset(required_resource_keys={"data_root", "my_model"})
    def needs_a_model():
        """An asset of a new group that needs a resource nobody bound yet."""

    group = types.SimpleNamespace(__name__="assets.example", defs=dg.Definitions(assets=[needs_a_model]))
    with pytest.raises(ValueError, match=r"assets\.example: .*\['my_model'\]"):
        resource_factories([group])
    bound = {**RESOURCE_FACTORIES, "my_model": lambda settings: "a model"}
    assert set(resource_factories([group], bound)) == set(RESOURCE_FACTORIES) | {"my_model"}


def test_every_group_is_registered_and_owns_its_assets():
    import assets

    for module in assets.GROUP_MODULES:
        groups = {spec.group_name for asset in module.defs.assets for spec in asset.specs}
        assert groups == {module.__name__.removeprefix("assets.")}, module.__name__


def test_tests_build_every_resource_the_code_location_binds_with_models_on_the_cpu(tmp_path):
    from tests.tiny_resources import tiny_resources_for

    resources = tiny_resources_for(str(tmp_path / "data"), str(tmp_path / "models"))
    assert sorted(resources) == spec_snapshot.stored_spec()["resources"]
    assert resources["torch_device"].device == "cpu"
    assert resources["aligner"].model_cache_dir == resources["qe"].model_cache_dir == str(tmp_path / "models")
    replaced = tiny_resources_for(str(tmp_path / "data"), vad="a stand-in")
    assert replaced["vad"] == "a stand-in"
    with pytest.raises(KeyError, match="no resource is bound under \\['vadd'\\]"):
        tiny_resources_for(str(tmp_path / "data"), vadd="a typo")
