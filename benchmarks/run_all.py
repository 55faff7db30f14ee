"""Run every ``benchmarks/<kind>/bench_*.py`` in its own process and collect their JSON lines.

Each benchmark prints exactly one JSON line on stdout; this writes them, in name order, to
``benchmarks/results/latest.jsonl`` (git-ignored) and prints them. A benchmark that fails or prints
anything else is recorded as ``{"benchmark", "error", ...}`` and makes the exit status 1.

    python -m benchmarks.run_all [--quick] [bench_resample | stages.bench_resample ...]

A benchmark is named by its file's stem (unique across the kinds) or by its module under
``benchmarks``; the other modules in the folders (models, probes, references) are not benchmarks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

BENCHMARKS_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCHMARKS_DIR.parent
RESULTS = BENCHMARKS_DIR / "results" / "latest.jsonl"
TIMEOUT_S = 1800  # bench_backfill_policy launches ~20 runs of fresh processes: ~15 min on 2 busy cores
# bench_duty_cycle writes 16 GB of models on its first run and loads each twice in fresh interpreters.
TIMEOUT_S_OF = {"bench_duty_cycle": 3600}


def available() -> dict[str, str]:
    """Each benchmark's name (its file's stem) -> its module, ``benchmarks.<kind>.<stem>``."""
    modules = {path.stem: f"benchmarks.{path.parent.name}.{path.stem}" for path in BENCHMARKS_DIR.glob("*/bench_*.py")}
    return dict(sorted(modules.items()))


def module_of(name: str) -> str | None:
    """``bench_resample``, ``stages.bench_resample`` or ``benchmarks.stages.bench_resample`` -> the
    module; None for no benchmark of that name."""
    modules = available()
    module = "benchmarks." + name.removeprefix("benchmarks.")
    return modules.get(name) or (module if module in modules.values() else None)


def run_one(name: str, quick: bool) -> dict:
    """Run ``python -m benchmarks.<kind>.<name>`` and return its JSON record, or an error record."""
    module = module_of(name)
    command = [sys.executable, "-m", module, *(["--quick"] if quick else [])]
    timeout_s = TIMEOUT_S_OF.get(module.rpartition(".")[2], TIMEOUT_S)
    started = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"benchmark": name, "error": f"timed out after {timeout_s} s"}
    elapsed = time.perf_counter() - started
    print(f"{name}: exit {proc.returncode} in {elapsed:.1f} s", file=sys.stderr, flush=True)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    if proc.returncode == 0 and len(lines) == 1:
        try:
            return json.loads(lines[0])
        except json.JSONDecodeError:
            pass
    return {
        "benchmark": name,
        "error": f"exit status {proc.returncode}, {len(lines)} stdout lines (want one JSON line)",
        "stdout_tail": proc.stdout[-2000:],
        "stderr_tail": proc.stderr[-2000:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (smoke run)")
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: every benchmarks/<kind>/bench_* module)")
    args = parser.parse_args(argv)
    names = args.names or list(available())
    unknown = sorted(name for name in names if module_of(name) is None)
    if unknown:
        parser.error(f"no such benchmark: {', '.join(unknown)} (have: {', '.join(available())})")

    records = [run_one(name, args.quick) for name in names]
    lines = [json.dumps(record) for record in records]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("".join(line + "\n" for line in lines))
    for line in lines:
        print(line)
    return 1 if any("error" in record for record in records) else 0


if __name__ == "__main__":
    sys.exit(main())
