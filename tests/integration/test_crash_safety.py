"""kill -9 at any point, then a re-run, gives exactly the clean result (byte for byte)."""

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from speechdata.io.faults import KILL_AT_ENV
from speechdata.io.storage import TEMP_PREFIX, DataRoot
from speechdata.testing.shards import build_sample_shard
from tests.index_journal import is_order_record, read_state

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARD = "crashy"


class Materializer:
    """One interpreter (``tests.integration.materialize_shard``) that imports torch and the code
    location once and forks a fresh process for each materialization, so each kill is a real SIGKILL
    of its own process without paying the imports four times."""

    def __init__(self, root: Path, model_cache_dir: str, logs: Path):
        env = {**os.environ, "SPEECHDATA_PROFILE": "tiny"}
        env.pop(KILL_AT_ENV, None)
        self.logs = logs
        self.runs = 0
        self.server = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.materialize_shard", str(root), SHARD, model_cache_dir],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def __call__(self, kill_at: str | None = None) -> subprocess.CompletedProcess:
        """Materialize the shard in a new process (SIGKILLed at ``kill_at``): its exit status and output."""
        self.runs += 1
        log = self.logs / f"run-{self.runs}-{kill_at or 'clean'}.log"
        self.server.stdin.write(f"{kill_at or '-'} {log}\n")
        self.server.stdin.flush()
        answer = self.server.stdout.readline()
        output = log.read_text() if log.exists() else ""
        if not answer:
            raise RuntimeError(f"the materializing process exited ({self.server.wait()}): {output[-3000:]}")
        return subprocess.CompletedProcess(self.server.args, int(answer), "", output)

    def close(self) -> None:
        self.server.stdin.close()
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.server.kill()
            self.server.wait()


@pytest.fixture
def materialize(tmp_path, model_cache_dir):
    logs = tmp_path / "logs"
    logs.mkdir()
    materializer = Materializer(tmp_path / "data", model_cache_dir, logs)
    yield materializer
    materializer.close()


def outputs(root: Path) -> dict[str, str]:
    """sha256 of every file the pipeline wrote (everything but the landing zone and the shard list's
    journal records, compared by what they fold to: tests/index_journal.py)."""
    found = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and not relative.startswith("landing/") and not is_order_record(relative):
            found[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.mark.timeout(2400)  # four materializations, each a process of its own
def test_sigkill_during_ingest_and_packing_then_rerun_is_byte_identical(tmp_path, materialize):
    # One root for both runs: stored URLs name the root, so the clean result is taken there first.
    root = tmp_path / "data"
    build_sample_shard(DataRoot(str(root)), SHARD, 2, seed=21, long_recordings=1, with_faults=True)
    done = materialize()
    assert done.returncode == 0, done.stderr[-3000:]
    clean, clean_order = outputs(root), read_state(DataRoot(str(root)))
    for entry in root.iterdir():
        if entry.name != "landing":
            shutil.rmtree(entry)

    # Each run is killed at the next point, on top of what the previous kills left behind: one point
    # per way a stage writes. A half-written Parquet temp (ingest; the feature stages write through the
    # same DataRoot.parquet_writer) and a staged tar never marked ready (packing).
    left_behind = {
        "ingest": "shards/crashy/._tmp-*-audio_24k.parquet",
        "packing": "shards/crashy/bridge_staged/crashy-000000.tar",
    }
    for point, pattern in left_behind.items():
        killed = materialize(kill_at=point)
        assert killed.returncode == -signal.SIGKILL, (point, killed.returncode, killed.stderr[-3000:])
        assert list(root.glob(pattern)), (point, sorted(str(p.relative_to(root)) for p in root.rglob("*")))
    assert not (root / "shards/crashy/bridge_staged/bridge_index.parquet").exists()

    rerun = materialize()
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert outputs(root) == clean and read_state(DataRoot(str(root))) == clean_order
    assert not [p for p in root.rglob("*") if p.name.startswith(TEMP_PREFIX)]
