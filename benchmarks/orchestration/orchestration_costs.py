"""What a GPU stage pays around its model: code-location import, run creation, step start, shard I/O.

* ``code_location_import``: a fresh interpreter running ``from dagster_project.definitions import
  defs``: the interpreter's whole wall time, the import's own, and the process's peak RSS (what a
  run worker, or a step process under the multiprocess executor, pays before anything else);
* ``run_creation``: ``benchmarks.orchestration.bench_backfill_launch`` (SQLite, runs queued and never started)
  in its own process; its ``per_run_ms`` is the backfill daemon's cost of creating one run;
* ``step_start``: the trivial asset of :mod:`benchmarks.orchestration.step_start_probe` run through
  ``dg.materialize`` (in-process executor) and ``dg.execute_job`` with the multiprocess executor on
  a temporary persistent instance; from the ``RUN_START`` event's timestamp to the asset's first
  line (``time.time()`` recorded as metadata, the event log's clock), median over the repeats;
* ``stage_io``: :mod:`benchmarks.capacity.stage_io_costs`.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import progress

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL_LIBRARIES = (
    "torch",
    "transformers",
    "torchaudio",
    "nemo",
    "datasets",
    "ray",
    "numba",
    "scipy",
    "pandas",
    "sklearn",
    "librosa",
    "datasketch",
    "jiwer",
)
"""Libraries a code-location import should not load (a step that runs a model loads them itself)."""
IMPORT_PROBE = """
import json, resource, sys, time
started = time.perf_counter()
{preload}
from dagster_project.definitions import defs
import_s = time.perf_counter() - started
rss_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
loaded = [name for name in {libraries!r} if name in sys.modules]
print(json.dumps({{"import_s": import_s, "peak_rss_gb": rss_gb, "torch_imported": "torch" in sys.modules,
                  "model_libraries_loaded": loaded}}))
"""


def _last_json_line(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.strip().startswith("{")][-1])


def code_location_import_once(preload: str = "") -> dict:
    """One fresh interpreter importing the code location, after running ``preload`` inside the timed
    span (``"import torch"`` puts back the cost of a code location that imported torch itself)."""
    probe = IMPORT_PROBE.format(preload=preload, libraries=MODEL_LIBRARIES)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"importing dagster_project.definitions failed: {proc.stderr[-3000:]}")
    return {"interpreter_wall_s": wall, **_last_json_line(proc.stdout)}


def median_import(samples: list[dict]) -> dict:
    """The sample of median interpreter wall time, rounded, with every sample's wall time."""
    samples = sorted(samples, key=lambda s: s["interpreter_wall_s"])
    middle = samples[(len(samples) - 1) // 2]
    return {
        "interpreter_wall_s": round(middle["interpreter_wall_s"], 3),
        "import_s": round(middle["import_s"], 3),
        "peak_rss_gb": round(middle["peak_rss_gb"], 3),
        "torch_imported": middle["torch_imported"],
        "model_libraries_loaded": middle["model_libraries_loaded"],
        "all_interpreter_wall_s": [round(s["interpreter_wall_s"], 3) for s in samples],
    }


def code_location_import(repeats: int) -> dict:
    """Median over ``repeats`` fresh interpreters importing the code location."""
    return median_import([code_location_import_once() for _ in range(repeats)])


def run_creation(registered: int, backfill: int) -> dict:
    """Per-run creation cost from ``bench_backfill_launch`` (SQLite) at ``registered`` shards."""
    command = [
        sys.executable, "-m", "benchmarks.orchestration.bench_backfill_launch",
        "--storage", "sqlite", "--registered", str(registered), "--backfill", str(backfill),
    ]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command[1:])} failed: {proc.stderr[-3000:]}")
    record = _last_json_line(proc.stdout)
    return {
        "registered": registered,
        "backfill_shards": backfill,
        "runs": record["runs"],
        "per_run_s": round(record["per_run_ms"] / 1000, 4),
        "runs_created_seconds": record["runs_created_seconds"],
    }


def _step_start_once(executor: str, instance) -> dict:
    import dagster as dg

    from benchmarks.orchestration import step_start_probe

    if executor == "in_process":
        result = dg.materialize([step_start_probe.step_start_probe], instance=instance)
    else:
        result = dg.execute_job(dg.reconstructable(step_start_probe.multiprocess_probe_job), instance=instance)
    if not result.success:
        raise RuntimeError(f"the step-start probe failed under the {executor} executor")
    run_id = result.run_id
    records = instance.all_logs(run_id)
    by_type = {}
    first_line = None
    for record in records:
        event = record.dagster_event
        if event is None:
            continue
        by_type.setdefault(event.event_type_value, record.timestamp)
        if event.event_type_value == "ASSET_MATERIALIZATION":
            first_line = event.event_specific_data.materialization.metadata["first_line_unix_s"].value
    run_start = by_type["PIPELINE_START"] if "PIPELINE_START" in by_type else by_type["RUN_START"]
    return {
        "run_start_to_first_line_s": first_line - run_start,
        "run_start_to_step_start_event_s": by_type["STEP_START"] - run_start,
    }


def step_start(repeats: int) -> dict:
    """Run start to the step's first user line, in-process and multiprocess (medians of ``repeats``)."""
    import dagster as dg

    figures = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-step-start-") as home,
        dg.DagsterInstance.local_temp(home) as instance,
    ):
        for executor in ("in_process", "multiprocess"):
            samples = [_step_start_once(executor, instance) for _ in range(repeats)]
            firsts = [s["run_start_to_first_line_s"] for s in samples]
            figures[executor] = {
                "run_start_to_first_line_s": round(statistics.median(firsts), 3),
                "run_start_to_step_start_event_s": round(
                    statistics.median(s["run_start_to_step_start_event_s"] for s in samples), 3
                ),
                "all_run_start_to_first_line_s": [round(f, 3) for f in firsts],
            }
            progress(f"step start, {executor}: {figures[executor]}")
    return figures
