"""Structural: every shard asset, including one added later, keeps the memory budget and removes a
killed run's temps. Nothing here names a stage: the assets are enumerated from the code location.

One materialization of every shard-partitioned asset, in a subprocess whose data segment is capped
(``RLIMIT_DATA``, inherited by the ingest workers), on a shard holding a 2-hour recording beside
ordinary ones. Before the per-utterance budget, ingest stored the 2-hour utterance and the stages
after it decoded it whole (the alignment inputs alone asked for 660 MB at once; ``near_duplicates``
reached 6 GB): the run died under the cap. The same run leaves, before each asset's sweep, one temp
in every folder the asset wrote to, exactly as a run killed there would leave it
(``SPEECHDATA_LEAVE_ORPHAN_TEMPS``), and none may survive.
"""

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from assets import ON_DEMAND_SHARD_ASSETS, SHARD_ASSETS
from dagster_project.definitions import defs
from speechdata.audio.budget import OVER_BUDGET_REASON
from speechdata.io import layout
from speechdata.io.faults import KILL_AT_ENV
from speechdata.io.storage import LEAVE_ORPHAN_TEMPS_ENV, TEMP_PREFIX, DataRoot
from speechdata.landing.mark import mark_landed
from speechdata.testing.shards import build_sample_shard
from tests.integration.materialize_shard import EVERY_SHARD_ASSET

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARD = "long"
LONG_UTT = "two_hours"
MEMORY_CAP_BYTES = 3 << 30
"""The run's data segment (heap and anonymous mappings) stays under this: the budgeted run peaks near
1.6 GB resident, the unbudgeted one failed to allocate inside its alignment step under 3.5 GB."""


def shard_assets_of_the_definitions() -> set[str]:
    return {
        spec.key.to_user_string()
        for spec in defs.resolve_all_asset_specs()
        if getattr(spec.partitions_def, "name", None) == "shard"
    }


def land_shard_with_a_two_hour_recording(root: DataRoot) -> None:
    """Ordinary sample utterances plus one 2-hour, 8 kHz recording as a single utterance (115 MB on
    disk, written a minute at a time)."""
    build_sample_shard(root, SHARD, 2, seed=3, long_recordings=1, complete=False)
    rate = 8_000
    minute = np.sin(np.arange(60 * rate, dtype=np.float32) * np.float32(0.05)) * np.float32(0.3)
    with sf.SoundFile(root.path(f"{layout.landing_audio_dir(SHARD)}/{LONG_UTT}.wav"), "w", rate, 1, "PCM_16") as out:
        for _ in range(120):
            out.write(minute)
    metadata = pq.read_table(root.path(layout.landing_metadata(SHARD)))
    row = dict.fromkeys(metadata.schema.names)
    first = metadata.slice(0, 1).to_pylist()[0]
    row.update(
        utt_id=LONG_UTT,
        audio_path=f"{LONG_UTT}.wav",
        text="a very long talk " * 1000,
        language=first["language"],
        source=first.get("source"),
    )
    pq.write_table(
        pa.concat_tables([metadata, pa.Table.from_pylist([row], schema=metadata.schema)]),
        root.path(layout.landing_metadata(SHARD)),
    )
    mark_landed(root, SHARD)


def _cap_data_segment() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def materialize(root: Path, model_cache_dir: str, assets: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "SPEECHDATA_PROFILE": "tiny", **env}
    if KILL_AT_ENV not in env:
        environment.pop(KILL_AT_ENV, None)
    return subprocess.run(
        [sys.executable, "-m", "tests.integration.materialize_shard", str(root), SHARD, model_cache_dir, assets],
        cwd=REPO_ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1200,
        preexec_fn=_cap_data_segment,
    )


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory, model_cache_dir):
    base = tmp_path_factory.mktemp("bounds")
    root = base / "data"
    land_shard_with_a_two_hour_recording(DataRoot(str(root)))
    orphans = base / "orphans.log"
    done = materialize(root, model_cache_dir, EVERY_SHARD_ASSET, **{LEAVE_ORPHAN_TEMPS_ENV: str(orphans)})
    left = [line.split(" ", 1) for line in orphans.read_text().splitlines()] if orphans.exists() else []
    return root, done, left


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_shard_asset_runs_a_two_hour_recording_under_a_memory_cap(capped_run):
    root, done, _ = capped_run
    assert done.returncode == 0, done.stderr[-4000:]
    data_root = DataRoot(str(root))
    enumerated = {asset.key.to_user_string() for asset in SHARD_ASSETS + ON_DEMAND_SHARD_ASSETS}
    assert enumerated == shard_assets_of_the_definitions()  # the run covered every shard asset there is
    stored = data_root.read_parquet(layout.normalized_audio(SHARD), columns=["utt_id"])["utt_id"].to_pylist()
    assert LONG_UTT not in stored and len(stored) >= 2  # the ordinary utterances went through
    # Each stage that reads landed audio rejects it from the header, with the budget named.
    for stage in ("normalized_audio", "asr_flac", "vad_segments"):
        rejects = {r["utt_id"]: r for r in data_root.read_parquet(layout.rejects(SHARD, stage)).to_pylist()}
        assert rejects[LONG_UTT]["reason"] == OVER_BUDGET_REASON, stage
        assert (
            "7200.0 s of audio, over the" in rejects[LONG_UTT]["detail"] and "of 1800 s" in rejects[LONG_UTT]["detail"]
        )


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_every_shard_asset_removes_the_temps_a_killed_run_left_in_its_folders(capped_run):
    root, done, left = capped_run
    assert done.returncode == 0, done.stderr[-4000:]
    owners = {owner.split("/", 1)[1] for owner, _ in left}
    assert owners == shard_assets_of_the_definitions()  # every asset wrote through an owned temp
    assert {path for _, path in left if Path(path).exists()} == set()
    assert not [p for p in root.rglob(f"{TEMP_PREFIX}*")]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_vad_killed_while_staging_leaves_a_temp_the_rerun_removes(tmp_path, model_cache_dir):
    root = tmp_path / "data"
    build_sample_shard(DataRoot(str(root)), SHARD, 2, seed=5, long_recordings=1)
    assets = "raw_shards,vad_segments"
    killed = materialize(root, model_cache_dir, assets, **{KILL_AT_ENV: "vad-staging"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    [staged] = root.glob(f"shards/{SHARD}/{TEMP_PREFIX}*-audio-staged.tar")  # a copy of the shard's audio
    rerun = materialize(root, model_cache_dir, assets)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert not staged.exists()
    assert not [p for p in root.rglob(f"{TEMP_PREFIX}*")]
