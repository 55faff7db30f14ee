"""Which backfill policy is fastest for the CPU shard assets: one run per shard, or k shards per run.

Why: every run is a process that loads the code location (torch, transformers, Dagster: seconds
of imports), and with the multiprocess executor every step of the run is another such process (plus
NeMo's much longer import for ``alignments``). One run per shard pays that per shard and step, though
runs overlap up to the run queue's limit; k shards per run pays it once per step for k shards,
but computes them one after the other.

``--shards`` tiny sample shards (``--utterances`` each) land in a temporary data root and are
registered in a temporary ``DAGSTER_HOME``. The CPU assets (``--assets``) are then materialized
twice, each run in a fresh process through ``dg.execute_job`` with the multiprocess executor, as
the daemon's run launcher would:

* ``per_shard_multiprocess``: ``BackfillPolicy.multi_run(1)``, one run per shard, at most
  ``--concurrent_runs`` at a time (deploy/local/dagster.yaml's run queue), a process per step;
* ``batched_multiprocess``: ``multi_run(k)`` with k = ``CPU_SHARDS_PER_RUN``, one run per k shards;
* ``batched_in_process``: the same runs with the in-process executor (one process per run), the
  code location's executor.

Figures: wall seconds of each and their ratios to ``batched_in_process`` (> 1: it is faster).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

import dagster as dg

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call

RANGE_START, RANGE_END = "dagster/asset_partition_range_start", "dagster/asset_partition_range_end"
DEFAULT_ASSETS = "raw_shards,normalized_audio,alignments,frame_grids,vad_segments,asr_flac"
EXECUTORS = {"multiprocess": dg.multiprocess_executor, "in_process": dg.in_process_executor}


def benchmark_job() -> dg.JobDefinition:
    """The CPU assets named by ``BENCH_ASSETS`` as one job (a module-level function: reconstructable),
    on the executor named by ``BENCH_EXECUTOR``."""
    from assets import ALL_ASSETS
    from dagster_project.definitions import build_resources

    names = os.environ["BENCH_ASSETS"].split(",")
    selected = [a for a in ALL_ASSETS if a.key.to_user_string() in names]
    defs = dg.Definitions(
        assets=selected,
        jobs=[dg.define_asset_job("cpu_backfill", selection=dg.AssetSelection.assets(*selected))],
        resources=build_resources(os.environ["DATA_ROOT"], "tiny"),
        executor=EXECUTORS[os.environ["BENCH_EXECUTOR"]],
    )
    return defs.resolve_job_def("cpu_backfill")


def run_range(start: str, end: str) -> None:
    """One run, in this process, over the shard range ``[start, end]``."""
    with dg.DagsterInstance.get() as instance:
        result = dg.execute_job(
            dg.reconstructable(benchmark_job), instance=instance, tags={RANGE_START: start, RANGE_END: end}
        )
        if not result.success:
            raise SystemExit(f"run over {start}..{end} failed")


def launch(start: str, end: str, env: dict[str, str]) -> None:
    subprocess.run(
        [sys.executable, "-m", "benchmarks.orchestration.bench_backfill_policy", "--run", start, end],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def backfill(chunks: list[list[str]], concurrent_runs: int, env: dict[str, str]) -> float:
    """Wall seconds of launching every chunk as a run, ``concurrent_runs`` at a time."""

    def launch_all() -> None:
        with ThreadPoolExecutor(max_workers=concurrent_runs) as pool:
            list(pool.map(lambda chunk: launch(chunk[0], chunk[-1], env), chunks))

    return timed_call(launch_all)[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--utterances", type=int, default=4)
    parser.add_argument("--assets", default=DEFAULT_ASSETS)
    parser.add_argument("--concurrent_runs", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="2 shards, ingest assets only (smoke run)")
    parser.add_argument("--run", nargs=2, metavar=("START", "END"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        run_range(*args.run)
        return
    if args.quick:
        args.shards, args.utterances, args.assets = 2, 2, "raw_shards,normalized_audio"

    from assets.shard_runs import CPU_SHARDS_PER_RUN
    from speechdata.io.storage import DataRoot
    from speechdata.testing.shards import build_sample_shard

    with stdout_to_stderr(), tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "DAGSTER_HOME": tmp,
            "DATA_ROOT": f"{tmp}/data",
            "BENCH_ASSETS": args.assets,
            "SPEECHDATA_PROFILE": "tiny",
        }
        shards = [f"bench-{i:03d}" for i in range(args.shards)]
        root = DataRoot(f"{tmp}/data")
        for i, shard_id in enumerate(shards):
            build_sample_shard(root, shard_id, args.utterances, seed=i, long_recordings=0)
        with dg.DagsterInstance.from_config(tmp) as instance:
            instance.add_dynamic_partitions("shard", shards)
        k = CPU_SHARDS_PER_RUN
        batched = [shards[i : i + k] for i in range(0, len(shards), k)]
        seconds = {}
        for name, chunks, executor in (
            ("batched_in_process", batched, "in_process"),
            ("batched_multiprocess", batched, "multiprocess"),
            ("per_shard_multiprocess", [[s] for s in shards], "multiprocess"),
        ):
            seconds[name] = backfill(chunks, args.concurrent_runs, {**env, "BENCH_EXECUTOR": executor})
            progress(f"{name}: {len(chunks)} runs, {seconds[name]:.1f} s")
    base = seconds["batched_in_process"]
    emit(
        "backfill_policy",
        {
            "shards": args.shards,
            "utterances_per_shard": args.utterances,
            "assets": args.assets.split(","),
            "cpu_shards_per_run": k,
            "concurrent_runs": args.concurrent_runs,
        },
        {
            **{f"{name}_seconds": round(value, 2) for name, value in seconds.items()},
            "ratio_per_shard_multiprocess_over_batched_in_process": ratio(seconds["per_shard_multiprocess"], base),
            "ratio_batched_multiprocess_over_batched_in_process": ratio(seconds["batched_multiprocess"], base),
        },
    )


if __name__ == "__main__":
    main()
