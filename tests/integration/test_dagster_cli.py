"""Dagster's own CLI materializes this code location: `dagster asset materialize --select ...`.

The selection string goes through Dagster's antlr4 grammar, which needs the 4.13 runtime; NeMo's
hydra-core / omegaconf pinned 4.9 and made every `--select` fail with ``TypeError: ord() expected
string of length 1, but int found``. Each test runs the installed ``dagster`` command in a fresh
DAGSTER_HOME against a data root holding one landed demo shard, then reads the instance.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.partitions import shard_partitions
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.shards import build_sample_shard
from tests.dagster_home import instance_at

REPO_ROOT = Path(__file__).resolve().parents[2]
DAGSTER = Path(sys.executable).parent / "dagster"
SHARD = "demo-0001"


@pytest.fixture
def landed_instance(tmp_path):
    """(DAGSTER_HOME, data root): the local instance settings, one landed shard, its partition registered."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO_ROOT / "deploy" / "local" / "dagster.yaml", home / "dagster.yaml")
    data_root = DataRoot(str(tmp_path / "data"))
    build_sample_shard(data_root, SHARD, 4, seed=1)
    with instance_at(home) as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [SHARD])
    return home, data_root


def dagster_materialize(home: Path, data_root: DataRoot, selection: str) -> subprocess.CompletedProcess:
    command = [str(DAGSTER), "asset", "materialize", "-m", "dagster_project.definitions"]
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "DATA_ROOT": data_root.url,
        "SPEECHDATA_PROFILE": "tiny",
        "PYTHONPATH": str(REPO_ROOT),
    }
    return subprocess.run(
        [*command, "--select", selection, "--partition", SHARD],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def materialized_partitions(home: Path, asset: str) -> set[str]:
    with instance_at(home) as instance:
        return instance.get_materialized_partitions(dg.AssetKey(asset))


@pytest.mark.slow
def test_dagster_asset_materialize_runs_one_asset_partition(landed_instance):
    home, data_root = landed_instance
    done = dagster_materialize(home, data_root, "raw_shards")
    assert done.returncode == 0, done.stderr[-6000:]
    assert "ord() expected string of length 1" not in done.stderr
    assert materialized_partitions(home, "raw_shards") == {SHARD}
    assert data_root.exists(layout.utterance_index(SHARD))
    assert not data_root.exists(layout.normalized_audio(SHARD))  # only what was selected ran


@pytest.mark.slow
def test_dagster_asset_materialize_parses_a_multi_asset_selection(landed_instance):
    home, data_root = landed_instance
    # Upstream of normalized_audio, one level: raw_shards and normalized_audio, in dependency order.
    done = dagster_materialize(home, data_root, "+normalized_audio")
    assert done.returncode == 0, done.stderr[-6000:]
    assert materialized_partitions(home, "raw_shards") == {SHARD}
    assert materialized_partitions(home, "normalized_audio") == {SHARD}
    assert data_root.exists(layout.normalized_audio(SHARD))
