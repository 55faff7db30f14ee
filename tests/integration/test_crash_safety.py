"""kill -9 at any point, then a re-run, gives exactly the clean result (byte for byte)."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from speechdata.faults import KILL_AT_ENV
from speechdata.io.storage import TEMP_PREFIX, DataRoot
from speechdata.testing.sample_shards import build_sample_shard

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARD = "crashy"


def materialize(root: Path, model_cache_dir: str, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPEECHDATA_PROFILE": "tiny"}
    env.pop(KILL_AT_ENV, None)
    if kill_at:
        env[KILL_AT_ENV] = kill_at
    return subprocess.run(
        [sys.executable, "-m", "tests.integration.materialize_shard", str(root), SHARD, model_cache_dir],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


def outputs(root: Path) -> dict[str, str]:
    """sha256 of every file the pipeline wrote (everything but the landing zone)."""
    found = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and not relative.startswith("landing/"):
            found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def test_sigkill_during_ingest_features_and_packing_then_rerun_is_byte_identical(tmp_path, model_cache_dir):
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    build_sample_shard(DataRoot(str(clean)), SHARD, 3, seed=21, long_recordings=1, with_faults=True)
    shutil.copytree(clean / "landing", crashed / "landing")

    done = materialize(clean, model_cache_dir)
    assert done.returncode == 0, done.stderr[-3000:]

    for point in ("ingest", "features", "packing", "commit"):
        killed = materialize(crashed, model_cache_dir, kill_at=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.returncode, killed.stderr[-3000:])
    # What the kills left behind: temp files and a half-swapped bridge.
    assert any(TEMP_PREFIX in p for p in map(str, crashed.rglob("*")))

    rerun = materialize(crashed, model_cache_dir)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert outputs(crashed) == outputs(clean)
    assert not [p for p in crashed.rglob("*") if p.name.startswith(TEMP_PREFIX)]
