"""The code location loads, and its asset keys, groups and partitions stay what the contracts fix (docs/)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

from dagster_project.definitions import defs

ROOT = Path(__file__).resolve().parents[2]

EXPECTED_ASSETS = {
    # asset key: (group, partitions)
    "raw_shards": ("ingest", "shard"),
    "normalized_audio": ("ingest", "shard"),
    "alignments": ("alignment", "shard"),
    "frame_grids": ("alignment", "shard"),
    "qwen_hidden_states": ("features", "shard"),
    "wavlm_features": ("features", "shard"),
    "bridge_tars": ("packaging", "shard"),
    "shard_manifest": ("packaging", "shard"),
    "manifest_catalog": ("catalog", None),
    "hf_split_assignments": ("publishing", "country"),
    "hf_dataset": ("publishing", "country"),
    "hf_hub_upload": ("publishing", "country"),
    "streaming_segments": ("translation", "shard"),
    "qe_scores": ("translation", "shard"),
    "streaming_pairs": ("translation", "shard"),
    "asr_flac": ("asr_training", "shard"),
    "asr_manifest": ("asr_training", None),
    "vad_segments": ("vad", "shard"),
    "language_shard_index": ("vad", "language"),
}
ON_DEMAND = {"streaming_segments", "qe_scores", "streaming_pairs"}
"""Shard assets the per-shard job leaves out: they wait for the LLM segmentation (translation_job runs them)."""


def test_asset_specs_snapshot():
    specs = {
        spec.key.to_user_string(): (
            spec.group_name,
            spec.partitions_def.name if isinstance(spec.partitions_def, dg.DynamicPartitionsDefinition) else None,
        )
        for spec in defs.resolve_all_asset_specs()
    }
    assert specs == EXPECTED_ASSETS


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
    on_demand = {dg.AssetKey(key) for key in ON_DEMAND}
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
    for key in ("alignments", "qwen_hidden_states", "wavlm_features", "qe_scores"):
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
