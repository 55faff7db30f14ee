"""The backfill launch benchmark still runs at its quick sizes: its plain record, and both comparisons
creating every run of the backfill (split from ``test_benchmarks_smoke.py``: the longest of the smoke runs)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run_all import module_of

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


def run_benchmark(name: str, *args: str, timeout_s: float = 600) -> dict:
    """``python -m benchmarks.<kind>.<name> *args``: asserts it exits 0 and prints exactly one line, the record."""
    result = subprocess.run(
        [sys.executable, "-m", module_of(name), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout[-2000:]
    return json.loads(lines[0])


def test_backfill_launch_prints_one_json_record():
    record = run_benchmark("bench_backfill_launch", "--quick")
    assert record["benchmark"] == "backfill_launch"
    assert {"launch_seconds", "runs_created_seconds", "runs", "expected_runs"} <= set(record)


def test_backfill_launch_compares_the_run_shapes_and_creates_every_run():
    record = run_benchmark("bench_backfill_launch", "--quick", "--compare", timeout_s=900)
    assert {"per_shape", "growth", "new_over_old_per_shard"} <= set(record)
    shapes = record["params"]["shards_per_run"]
    assert shapes["old"] < shapes["new"]
    for shape, sizes in record["per_shape"].items():
        for figures in sizes.values():
            # Every run of the backfill exists, in the shape's size: none missing, none extra.
            assert figures["runs"] == figures["expected_runs"] == -(-record["params"]["backfill"] // shapes[shape])
            assert figures["shards_per_run"] == shapes[shape]


def test_backfill_launch_compares_plain_and_caching_storage_and_creates_every_run():
    record = run_benchmark("bench_backfill_launch", "--quick", "--compare", "--storage-cache", timeout_s=900)
    assert {"per_storage", "growth", "cached_over_plain_per_run", "batched_over_plain_per_run"} <= set(record)
    assert set(record["per_storage"]) == {"plain", "cached", "batched"}
    expected_runs = -(-record["params"]["backfill"] // record["params"]["shards_per_run"])
    for storage, sizes in record["per_storage"].items():
        for figures in sizes.values():
            assert figures["runs"] == figures["expected_runs"] == expected_runs
            assert figures["storage_cache"] == (storage != "plain")
    # The caching storage reads the key list a few times for the whole backfill, not per asset and
    # check of each run, and as often at either size; the plain storage is not instrumented.
    for storage in ("cached", "batched"):
        reads = [figures["full_key_list_reads"] for figures in record["per_storage"][storage].values()]
        assert len(set(reads)) == 1 and 1 <= reads[0] < 13 * expected_runs
    assert all(figures["full_key_list_reads"] is None for figures in record["per_storage"]["plain"].values())
    # As deployed, each run's planned events are one transaction; with Dagster's batching off, none is.
    for figures in record["per_storage"]["batched"].values():
        assert figures["event_batches_in_one_transaction"] == expected_runs
    assert all(figures["event_batches_in_one_transaction"] == 0 for figures in record["per_storage"]["cached"].values())
