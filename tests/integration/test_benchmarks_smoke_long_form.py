"""The long-form alignment benchmark still runs (quick sizes) and prints one JSON record with its baseline."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


def test_long_form_benchmark_prints_one_record_with_the_whole_matrix_baseline():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.accuracy.bench_long_form", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = result.stdout.strip().splitlines()
    record = json.loads(line)
    assert record["benchmark"] == "long_form"
    [point] = record["points"]
    assert point["same_words"] is True  # the checkpointed kernel gives the whole-matrix words
    assert point["checkpointed"]["max_boundary_error_ms"] == 0
    assert point["stage"]["aligned"] is True and point["stage"]["peak_rss_mb"] > 0
    music = record["music_20s"]
    assert music["wildcard_max_boundary_error_ms"] <= 80 < music["forced_max_boundary_error_ms"]
    assert len(music["wildcard_untranscribed_ms"]) == 1
