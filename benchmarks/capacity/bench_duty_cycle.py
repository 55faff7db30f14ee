"""The GPU's duty cycle for a backfill and for steady landing: today's orchestration against resident workers.

Why: at the 1 000 audio-hours-per-GPU-hour target a 1 000-utterance shard of 8 s utterances
(2.2 audio hours) needs about 8 s of GPU, and everything around those 8 s (importing the code
location, creating the run, starting the step, loading each model, reading inputs and writing
outputs) costs more. This measures each of those fixed costs here, side by side in one run, and
composes them in a simulation of one GPU worker's timeline (:mod:`benchmarks.capacity.duty_cycle_simulation`)
under two architectures: the baseline (today: a model load per GPU asset per run of k shards,
everything serial) and resident GPU workers (each model loaded once per worker; the next item's
inputs read and the previous item's outputs written while the current one is on the GPU; run
creation and step starts ahead of the GPU).

Measured (CPU, this machine):

1. model loads (:mod:`benchmarks.capacity.model_load_costs`): the four models written once from random
   weights at their real configs and real on-disk format, each load timed cold and warm in a
   fresh interpreter through the resource's own call; seconds, GB/s, peak RSS;
2. orchestration (:mod:`benchmarks.orchestration.orchestration_costs`): code-location import (fresh
   interpreter: wall, RSS), run creation per run (``bench_backfill_launch``, SQLite, ``--registered``
   shards), step start in-process and multiprocess (event log timestamps), and the feature stages'
   input reads and output writes for a real shard of ``--utterances`` utterances, scaled per audio hour
   (:mod:`benchmarks.capacity.stage_io_costs`).

Modelled: GPU compute per shard and stage, from the capacity model's FLOPs per audio second
(:mod:`benchmarks.capacity.capacity_model`) at ``--audio-hours-per-gpu-hour`` end to end; the copy of the
weights to the GPU at ``--h2d-gb-per-s``. Every assumption of the composition is listed in the
record's ``assumptions``.

``--quick``: the tiny profile's model sizes instead of the full ones and small counts (a smoke run:
its figures mean nothing).

    python -m benchmarks.capacity.bench_duty_cycle [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from benchmarks.capacity.capacity_model import GPU_FLOPS_PER_AUDIO_S, MEASURED_CPU_STAGES, capacity, gpu_stages
from benchmarks.capacity.duty_cycle_simulation import RunCosts, StageCosts, duty_cycle
from benchmarks.capacity.model_load_costs import MODEL_CACHE_DIR, MODELS, folder_bytes, measure_model_loads
from benchmarks.capacity.stage_io_costs import measure_stage_io
from benchmarks.orchestration.orchestration_costs import code_location_import, run_creation, step_start
from benchmarks.report import Stopwatch, emit, progress, ratio, stdout_to_stderr

BENCHMARK = "duty_cycle"
SECONDS_PER_HOUR = 3600.0
BYTES_PER_PARAMETER = {"bfloat16": 2, "float16": 2, "float32": 4}
# The capacity model's GPU stages, by the per-shard asset that runs each, in the order a shard meets them.
STAGE_OF_CAPACITY_ENTRY = {
    "alignments (parakeet-ctc-1.1b forward)": "alignments",
    "qwen_hidden_states (Qwen3-1.7B)": "qwen_hidden_states",
    "wavlm_features (WavLM-Large)": "wavlm_features",
}
MODEL_OF_STAGE = {spec.stage: spec.name for spec in MODELS if spec.stage}
VITERBI_AUDIO_S_PER_S = next(s.audio_s_per_s for s in MEASURED_CPU_STAGES if s.name.startswith("alignments"))
TARGET_GOAL = 0.95

ASSUMPTIONS = (
    "GPU compute per shard is modelled, not measured: the capacity model's FLOPs per audio second per "
    "stage, all at one model FLOP utilisation chosen so the three stages together run at "
    "--audio-hours-per-gpu-hour.",
    "A model load on a GPU worker = the measured load into host memory + its weights at the load dtype "
    "copied to the GPU at --h2d-gb-per-s (assumed, not measured). The baseline pays a warm load (files "
    "in the node's page cache) per GPU step per run; a resident worker pays a cold load once.",
    "Baseline per run: run creation (the backfill daemon, measured per run), then the run worker's start "
    "(a fresh interpreter importing the code location, plus torch and transformers if that import did not "
    "bring them), then per GPU step its start (in-process executor, the default; the multiprocess variant "
    "uses the multiprocess step start, which re-imports the code location, plus torch and transformers), "
    "its model load, and per shard read, compute, write: all serial, nothing overlaps.",
    "Resident: runs are created one after another (the backfill daemon); up to --concurrent-runs run "
    "workers start (interpreter + code location) and start their steps (in-process) at once; all of it "
    "ahead of the GPU, overlapping earlier shards' compute; reads run on a prefetch thread at most one item ahead of the GPU; "
    "writes on a writer thread after their compute; the GPU does model loads (once, at the worker's start) "
    "and compute only.",
    "Only the per-shard GPU stages (alignments, qwen_hidden_states, wavlm_features) are in the timeline. "
    "MetricX-24 (qe_scores) is in the translation job, not the per-shard job, and its compute is not in "
    "the capacity model: its load is measured and reported, not simulated.",
    "The CPU stages between GPU stages of one shard (Viterbi's rest, frame grids) are taken to overlap "
    "other shards' GPU work (other runs in flight on the CPU pool), so the GPU stages' items are "
    "independent in the timeline.",
    "I/O per stage: qwen_hidden_states and wavlm_features measured with the real stage code (model call "
    "replaced, full-size outputs), scaled by audio hours. alignments: input read taken equal to "
    "wavlm_features' (both decode the shard's audio container); its output side is the CPU Viterbi inside "
    "the step, at bench_viterbi's rate from the capacity model; its per-utterance CTM file writes are not "
    "measured.",
    "Backfill: all shards ready at once, runs of --shards-per-run shards; duty cycle = GPU compute / "
    "makespan (the GPU is reserved for the backfill). Landing: one shard per --landing-interval-s, one run "
    "per shard (the sensor's one RunRequest per new partition); duty cycle = GPU compute / time the GPU "
    "is held (baseline: a GPU step from its start to its end; resident: model loads and compute); time "
    "with no shard landed is not charged, since the GPU is free for other work then. The resident worker "
    "lives for the whole landing window (--landing-shards x --landing-interval-s).",
)


def modelled_compute_s(shard_audio_s: float, audio_hours_per_gpu_hour: float) -> dict[str, float]:
    """GPU seconds per shard and stage: the end-to-end target split by the stages' FLOPs."""
    total_flops = sum(GPU_FLOPS_PER_AUDIO_S.values())
    gpu_s = shard_audio_s / audio_hours_per_gpu_hour
    return {
        STAGE_OF_CAPACITY_ENTRY[entry]: gpu_s * flops / total_flops for entry, flops in GPU_FLOPS_PER_AUDIO_S.items()
    }


def implied_mfu(audio_hours_per_gpu_hour: float) -> float:
    """The model FLOP utilisation at which the capacity model's GPU stages give the target rate."""
    reference_mfu = 0.15
    reference = capacity(gpu_stages(reference_mfu), cpus=0, gpus=1)["gpu_hours_per_day"] / 24.0
    return reference_mfu * audio_hours_per_gpu_hour / reference


def model_load_on_gpu_s(load: dict, h2d_gb_per_s: float, warm: bool) -> float:
    weights_gb = load["parameters"] * BYTES_PER_PARAMETER[load["load_dtype"]] / 1e9
    host_s = load["warm_load_s"] if warm and load["warm_load_s"] is not None else load["cold_load_s"]
    return host_s + weights_gb / h2d_gb_per_s


def stage_costs(
    loads: dict, io: dict, compute: dict[str, float], shard_audio_h: float, h2d_gb_per_s: float, warm: bool
) -> list[StageCosts]:
    audio_read = io["wavlm_features"]["read_s_per_audio_hour"] * shard_audio_h
    viterbi_s = shard_audio_h * SECONDS_PER_HOUR / VITERBI_AUDIO_S_PER_S
    per_stage_io = {
        "alignments": (audio_read, viterbi_s),
        "qwen_hidden_states": tuple(
            io["qwen_hidden_states"][f"{k}_s_per_audio_hour"] * shard_audio_h for k in ("read", "write")
        ),
        "wavlm_features": tuple(
            io["wavlm_features"][f"{k}_s_per_audio_hour"] * shard_audio_h for k in ("read", "write")
        ),
    }
    return [
        StageCosts(
            stage,
            compute[stage],
            per_stage_io[stage][0],
            per_stage_io[stage][1],
            model_load_on_gpu_s(loads[MODEL_OF_STAGE[stage]], h2d_gb_per_s, warm),
        )
        for stage in STAGE_OF_CAPACITY_ENTRY.values()
    ]


def rounded_stages(stages: list[StageCosts]) -> dict:
    return {
        s.name: {
            "compute_s": round(s.compute_s, 3),
            "read_s": round(s.read_s, 3),
            "write_s": round(s.write_s, 3),
            "model_load_s": round(s.model_load_s, 3),
        }
        for s in stages
    }


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models and small counts (smoke run)")
    parser.add_argument("--backfill-shards", type=int, default=10_000)
    parser.add_argument("--landing-shards", type=int, default=1_440, help="shards landed (one per interval)")
    parser.add_argument("--landing-interval-s", type=float, default=60.0)
    parser.add_argument("--shards-per-run", type=int, default=4, help="k: shards per backfill run")
    parser.add_argument("--concurrent-runs", type=int, default=4, help="run workers starting at once (resident)")
    parser.add_argument("--utterances", type=int, default=1_000, help="utterances per shard")
    parser.add_argument("--utterance-s", type=float, default=8.0)
    parser.add_argument("--audio-hours-per-gpu-hour", type=float, default=1_000.0)
    parser.add_argument("--h2d-gb-per-s", type=float, default=20.0, help="host-to-GPU copy (assumed)")
    parser.add_argument("--registered", type=int, default=1_000, help="shards registered for run creation")
    parser.add_argument("--run-creation-shards", type=int, default=40, help="shards in the run-creation backfill")
    parser.add_argument("--repeats", type=int, default=3, help="code-location imports and step starts")
    parser.add_argument("--io-utterances", type=int, default=None, help="shard size for the I/O probe")
    args = parser.parse_args(argv)
    if args.quick:
        args.backfill_shards, args.landing_shards, args.repeats = 200, 60, 1
        args.registered, args.run_creation_shards = 200, 8
    args.io_utterances = args.io_utterances or (40 if args.quick else args.utterances)
    return args


def measure_costs(args: argparse.Namespace) -> dict:
    """What the simulation composes, each measured: model loads, orchestration, stage I/O."""
    with Stopwatch() as watch:
        loads = measure_model_loads(
            [spec.name for spec in MODELS], args.quick, warm=not args.quick, one_process=args.quick
        )
        progress(f"model loads: {loads}")
        cache_gb = sum(folder_bytes(p) for p in MODEL_CACHE_DIR.iterdir() if p.is_dir()) / 1e9
        location = code_location_import(args.repeats)
        progress(f"code location import: {location}")
        creation = run_creation(args.registered, args.run_creation_shards)
        progress(f"run creation: {creation}")
        steps = step_start(args.repeats)
        with tempfile.TemporaryDirectory(prefix="bench-duty-cycle-io-") as work:
            io = measure_stage_io(Path(work), args.io_utterances, args.utterance_s, args.repeats)
        progress(f"stage I/O: {io}")
    return {
        "model_loads": loads,
        "model_cache_gb": round(cache_gb, 3),
        "code_location_import": location,
        "run_creation": creation,
        "step_start": steps,
        "stage_io": io,
        "measure_seconds": round(watch.wall_s, 1),
    }


def simulate(args: argparse.Namespace, measured: dict) -> dict:
    """The duty cycle of both architectures in both modes, from the measured costs and modelled compute."""
    loads, location, steps = measured["model_loads"], measured["code_location_import"], measured["step_start"]
    shard_audio_s = args.utterances * args.utterance_s
    shard_audio_h = shard_audio_s / SECONDS_PER_HOUR
    compute = modelled_compute_s(shard_audio_s, args.audio_hours_per_gpu_hour)
    torch_import_s = 0.0 if location["torch_imported"] else loads["qwen3-1.7b"]["import_torch_transformers_s"]
    run_start_s = location["import_s"] + torch_import_s
    io = measured["stage_io"]
    baseline_stages = stage_costs(loads, io, compute, shard_audio_h, args.h2d_gb_per_s, warm=True)
    resident_stages = stage_costs(loads, io, compute, shard_audio_h, args.h2d_gb_per_s, warm=False)
    per_run_s = measured["run_creation"]["per_run_s"]
    in_process = RunCosts(per_run_s, run_start_s, steps["in_process"]["run_start_to_first_line_s"])
    multiprocess = RunCosts(per_run_s, run_start_s, steps["multiprocess"]["run_start_to_first_line_s"] + torch_import_s)
    modes = {
        "backfill": dict(shards=args.backfill_shards, shards_per_run=args.shards_per_run),
        "landing": dict(shards=args.landing_shards, shards_per_run=1, landing_interval_s=args.landing_interval_s),
    }
    duty = {}
    for mode, settings in modes.items():
        baseline = duty_cycle("baseline", mode, baseline_stages, in_process, **settings)
        baseline_mp = duty_cycle("baseline", mode, baseline_stages, multiprocess, **settings)
        # Dagster's backfill daemon creates runs in its own process while earlier runs execute:
        # the baseline with run creation entirely off the GPU's path bounds that overlap.
        creation_hidden = RunCosts(0.0, in_process.run_start_s, in_process.step_start_s)
        baseline_hidden = duty_cycle("baseline", mode, baseline_stages, creation_hidden, **settings)
        resident = duty_cycle(
            "resident", mode, resident_stages, in_process, **settings, concurrent_runs=args.concurrent_runs
        )
        duty[mode] = {
            "baseline": baseline,
            "baseline_multiprocess": baseline_mp,
            "baseline_run_creation_overlapped": baseline_hidden,
            "resident": resident,
            "resident_over_baseline": ratio(resident["duty_cycle"], baseline["duty_cycle"]),
            "resident_meets_goal": resident["duty_cycle"] >= TARGET_GOAL,
        }
        progress(f"{mode}: baseline {baseline['duty_cycle']}, resident {resident['duty_cycle']}")
    return {
        "gpu_compute_modelled": {
            "shard_audio_hours": round(shard_audio_h, 4),
            "per_stage_s": {stage: round(s, 3) for stage, s in compute.items()},
            "per_shard_s": round(sum(compute.values()), 3),
            "implied_mfu": round(implied_mfu(args.audio_hours_per_gpu_hour), 4),
            "source": "modelled: benchmarks/capacity/capacity_model.py FLOPs per audio second",
        },
        "stage_costs": {"baseline": rounded_stages(baseline_stages), "resident": rounded_stages(resident_stages)},
        "run_costs": {"in_process": vars(in_process), "multiprocess": vars(multiprocess)},
        "duty_cycle": duty,
    }


def run_params(args: argparse.Namespace, load_before: float) -> dict:
    return {
        "quick": args.quick,
        "backfill_shards": args.backfill_shards,
        "landing_shards": args.landing_shards,
        "landing_interval_s": args.landing_interval_s,
        "shards_per_run": args.shards_per_run,
        "concurrent_runs": args.concurrent_runs,
        "utterances_per_shard": args.utterances,
        "utterance_s": args.utterance_s,
        "audio_hours_per_gpu_hour": args.audio_hours_per_gpu_hour,
        "h2d_gb_per_s": args.h2d_gb_per_s,
        "registered": args.registered,
        "repeats": args.repeats,
        "io_utterances": args.io_utterances,
        "load_average_1m_before": load_before,
        "load_average_1m_after": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    load_before = round(os.getloadavg()[0], 2)
    with stdout_to_stderr():
        measured = measure_costs(args)
        simulated = simulate(args, measured)
    measure_seconds = measured.pop("measure_seconds")
    emit(
        BENCHMARK,
        run_params(args, load_before),
        {
            **measured,
            **simulated,
            "goal": TARGET_GOAL,
            "assumptions": list(ASSUMPTIONS),
            "measure_seconds": measure_seconds,
        },
    )


if __name__ == "__main__":
    main()
