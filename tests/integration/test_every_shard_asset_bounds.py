"""Structural: every shard asset, including one added later, keeps the memory budget and removes a
killed run's temps. Nothing here names a stage: the assets are enumerated from the code location.

One materialization of every shard-partitioned asset, in a subprocess whose resident high-water mark
(its own and its ingest workers', from the kernel) must stay under a budget, on a shard holding,
beside ordinary utterances, a long-form talk and a 2-hour recording. Its data segment is also capped
(``RLIMIT_DATA``, inherited by the workers) higher up, so a run that leaks is stopped before it takes
the machine: the data segment counts address space reserved and never touched (Arrow's allocator
reserves a 1 GiB arena, the CUDA libraries' writable sections take 0.3 GiB in a CPU-only process:
1.4 GiB before the first asset runs), which is why it is the backstop and not the measure. Long-form landing is on by default: the talk (past a
whole-decode budget lowered to 20 s, so that its windowed paths run in seconds) lands with no
setting and every asset reads it in windows; the 2-hour recording is past a long-form limit lowered
to 1 hour and is refused from its header, never decoded. Before the per-utterance budget, ingest
stored a 2-hour utterance and the stages after it decoded it whole (the alignment inputs alone
asked for 660 MB at once; ``near_duplicates`` reached 6 GB): the run died under the cap. That every
stage's peak stays flat up to 2 hours is measured, not tested here (a 2-hour recording through every
asset takes most of an hour on a small machine): ``benchmarks/accuracy/bench_long_form.py --pipeline``.
The same run leaves, before each asset's sweep, one temp in every folder the asset wrote to, exactly
as a run killed there would leave it (``SPEECHDATA_LEAVE_ORPHAN_TEMPS``), and none may survive.
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
from speechdata.quality.paths import quality_decisions, quality_signals
from speechdata.testing.long_recordings import write_clip_talk
from speechdata.testing.shards import build_sample_shard
from tests.integration.materialize_shard import EVERY_SHARD_ASSET, PEAK_RSS_PREFIX

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARD = "long"
LONG_UTT = "two_hours"
TALK = "talk"
TALK_S = 45.0
BUDGETS = {"SPEECHDATA_MAX_UTTERANCE_SECONDS": "20", "SPEECHDATA_MAX_LONG_FORM_SECONDS": "3600"}
"""The whole-decode budget and the long-form limit of the run (the landed long-form limit is left at
its default, the long-form limit): the talk is long-form, the 2-hour recording past the limit."""
RESIDENT_BUDGET_BYTES = int(2.5 * (1 << 30))
"""The run's resident peak stays under this: the budgeted run peaks near 1.8 GB resident (the talk's
segments through the features and the bridge included), the unbudgeted one passed 6 GB."""
MEMORY_CAP_BYTES = int(4.5 * (1 << 30))
"""The run's data segment (heap and anonymous mappings, reserved or touched) stays under this: the
budgeted run peaks near 3.3 GB of it, the unbudgeted one failed to allocate inside its alignment step
under 3.5 GB."""


def shard_assets_of_the_definitions() -> set[str]:
    return {
        spec.key.to_user_string()
        for spec in defs.resolve_all_asset_specs()
        if getattr(spec.partitions_def, "name", None) == "shard"
    }


def land_shard_with_a_two_hour_recording(root: DataRoot) -> None:
    """Ordinary sample utterances, a long-form talk (English sample clips one after another, with its
    transcript) and one 2-hour, 8 kHz recording as a single utterance (115 MB on disk, written a
    minute at a time)."""
    build_sample_shard(root, SHARD, 2, seed=3, long_recordings=1, complete=False)
    rate = 8_000
    minute = np.sin(np.arange(60 * rate, dtype=np.float32) * np.float32(0.05)) * np.float32(0.3)
    with sf.SoundFile(root.path(f"{layout.landing_audio_dir(SHARD)}/{LONG_UTT}.wav"), "w", rate, 1, "PCM_16") as out:
        for _ in range(120):
            out.write(minute)
    talk = write_clip_talk(root.path(f"{layout.landing_audio_dir(SHARD)}/{TALK}.wav"), TALK_S)
    metadata = pq.read_table(root.path(layout.landing_metadata(SHARD)))
    first = metadata.slice(0, 1).to_pylist()[0]
    rows = []
    for utt_id, text in ((LONG_UTT, "a very long talk " * 1000), (TALK, talk.transcript)):
        row = dict.fromkeys(metadata.schema.names)
        row.update(utt_id=utt_id, audio_path=f"{utt_id}.wav", text=text, language="en", source=first.get("source"))
        rows.append(row)
    pq.write_table(
        pa.concat_tables([metadata, pa.Table.from_pylist(rows, schema=metadata.schema)]),
        root.path(layout.landing_metadata(SHARD)),
    )
    mark_landed(root, SHARD)


def _cap_data_segment() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))


def materialize(root: Path, model_cache_dir: str, assets: str, **env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "SPEECHDATA_PROFILE": "tiny", **BUDGETS, **env}
    environment.pop("SPEECHDATA_MAX_LANDED_LONG_FORM_SECONDS", None)  # long-form landing as deployed: the default
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
    [peak] = [
        int(line[len(PEAK_RSS_PREFIX) :]) for line in done.stdout.splitlines() if line.startswith(PEAK_RSS_PREFIX)
    ]
    assert peak < RESIDENT_BUDGET_BYTES, f"{peak / 2**30:.2f} GiB resident"
    data_root = DataRoot(str(root))
    enumerated = {asset.key.to_user_string() for asset in SHARD_ASSETS + ON_DEMAND_SHARD_ASSETS}
    assert enumerated == shard_assets_of_the_definitions()  # the run covered every shard asset there is
    stored = data_root.read_parquet(layout.normalized_audio(SHARD), columns=["utt_id"])["utt_id"].to_pylist()
    assert LONG_UTT not in stored and TALK in stored and len(stored) >= 4  # the talk landed by default
    # Each stage that reads landed audio rejects the 2-hour recording from its header, the limit named.
    for stage in ("normalized_audio", "vad_segments"):
        rejects = {r["utt_id"]: r for r in data_root.read_parquet(layout.rejects(SHARD, stage)).to_pylist()}
        assert rejects[LONG_UTT]["reason"] == OVER_BUDGET_REASON, stage
        assert "7200.0 s of audio, over the landed long-form limit of 3600 s" in rejects[LONG_UTT]["detail"]
        assert TALK not in rejects, stage
    # The talk went through the windowed paths: measured as one row, aligned word by word.
    quality = {r["utt_id"]: r for r in data_root.read_parquet(quality_signals(SHARD)).to_pylist()}
    assert quality[TALK]["has_audio"] and quality[TALK]["duration_s"] > TALK_S
    spans = data_root.read_parquet(layout.alignments(SHARD), columns=["utt_id", "level"]).to_pylist()
    assert sum(1 for r in spans if r["utt_id"] == TALK and r["level"] == "word") > 50
    # Under the default quality policy the talk, too long to publish whole, is packed as its segments.
    decisions = data_root.read_parquet(quality_decisions(SHARD)).to_pylist()
    assert {(r["product"], r["reason"]) for r in decisions if r["utt_id"] == TALK} >= {("bridge", "too_long")}
    packed = data_root.read_parquet(layout.bridge_index(SHARD), columns=["key"])["key"].to_pylist()
    talk_segments = sum(1 for r in spans if r["utt_id"] == TALK and r["level"] == "segment")
    assert talk_segments >= 2 and TALK not in packed
    assert sorted(k for k in packed if k.startswith(f"{TALK}+")) == [f"{TALK}+{n:04d}" for n in range(talk_segments)]


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
