"""The duty-cycle benchmark's quick mode runs end to end and prints every figure it names."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]
MODELS = ("parakeet-ctc-1.1b", "qwen3-1.7b", "wavlm-large", "metricx-24-hybrid-xl")


@pytest.fixture(scope="module")
def record():
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.capacity.bench_duty_cycle", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout[-2000:]
    return json.loads(lines[0])


def test_quick_mode_prints_one_record_with_every_part(record):
    assert record["benchmark"] == "duty_cycle"
    assert record["params"]["quick"] is True
    for key in ("model_loads", "model_cache_gb", "code_location_import", "run_creation", "step_start"):
        assert key in record
    for key in ("stage_io", "gpu_compute_modelled", "stage_costs", "duty_cycle", "assumptions"):
        assert key in record


def test_every_model_load_is_timed_with_its_throughput(record):
    assert set(record["model_loads"]) == set(MODELS)
    for name, load in record["model_loads"].items():
        assert load["format"] == "safetensors", name
        assert load["parameters"] == load["expected_parameters"], name
        assert load["cold_load_s"] > 0 and load["cold_gb_per_s"] > 0, name
        assert load["peak_rss_gb"] > 0, name


def test_every_orchestration_cost_is_measured(record):
    assert record["code_location_import"]["import_s"] > 0
    assert record["code_location_import"]["peak_rss_gb"] > 0
    assert record["run_creation"]["runs"] >= 1 and record["run_creation"]["per_run_s"] > 0
    for executor in ("in_process", "multiprocess"):
        assert record["step_start"][executor]["run_start_to_first_line_s"] > 0
    # A fresh step process imports the code location first: slower than a step in the run's process.
    assert (
        record["step_start"]["multiprocess"]["run_start_to_first_line_s"]
        > record["step_start"]["in_process"]["run_start_to_first_line_s"]
    )
    for stage in ("qwen_hidden_states", "wavlm_features"):
        assert record["stage_io"][stage]["read_s_per_audio_hour"] > 0
        assert record["stage_io"][stage]["write_s_per_audio_hour"] > 0


def test_duty_cycles_for_both_modes_and_architectures(record):
    compute = record["gpu_compute_modelled"]
    assert compute["per_shard_s"] == pytest.approx(
        compute["shard_audio_hours"] * 3600 / record["params"]["audio_hours_per_gpu_hour"], rel=1e-3
    )
    for mode in ("backfill", "landing"):
        figures = record["duty_cycle"][mode]
        for architecture in ("baseline", "baseline_multiprocess", "resident"):
            assert 0 < figures[architecture]["duty_cycle"] <= 1.0
        # Measured fixed costs are never zero, so the baseline pays them and the resident worker pays less.
        assert figures["baseline"]["duty_cycle"] < figures["resident"]["duty_cycle"]
        assert figures["resident_over_baseline"] > 1.0
