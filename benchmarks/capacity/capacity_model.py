"""Audio hours per day for N CPU cores and M GPUs, from the per-stage throughputs, and the first bottleneck.

Every per-shard stage is a rate in audio seconds per second of one worker (a CPU core, or a GPU).
CPU stages share the CPU cores, GPU stages the GPUs, so each pool's rate is its worker count over
the sum of ``1 / rate`` of its stages; the platform's rate is the slower pool's, and that pool's
most expensive stage is the first bottleneck. A per-step fixed cost (a step pod starting, imports,
model loading) is paid once per shard and step, so the shard size sets how much of it shows.

CPU rates are the measured figures in docs/performance.md (one core; ``make bench``). GPU rates are
estimates until ``python -m benchmarks.capacity.gpu_features`` runs on a GPU: model FLOPs per audio second
over the GPU's dense bf16 peak times an assumed model FLOP utilisation (``--mfu``).

    python -m benchmarks.capacity.capacity_model [--cpus 64 --gpus 8] [--mfu 0.15] [--shard-hours 10] [--table]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from benchmarks.report import emit

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True)
class Stage:
    name: str
    pool: str  # "cpu" or "gpu"
    audio_s_per_s: float  # per core or per GPU
    source: str


# Measured on one core (docs/performance.md, "Capacity model"): audio seconds per CPU second.
MEASURED_CPU_STAGES = (
    Stage("raw_shards + normalized_audio", "cpu", 563.0, "bench_ingest: WAV+FLAC+MP3+Opus, FLAC storage"),
    Stage("vad_segments", "cpu", 516.0, "bench_vad: Silero batched"),
    Stage("asr_flac", "cpu", 563.0, "assumed = ingest (decode, resample to 16 kHz, FLAC encode)"),
    Stage("alignments (Viterbi)", "cpu", 5377 * 15.0, "bench_viterbi: 5377 utt/s of 10-20 s"),
    Stage("frame_grids", "cpu", 3662 * 9.6, "bench_frame_grid: 3662 utt/s, 9.6 s mean"),
    Stage("bridge_tars + shard_manifest", "cpu", 256e6 / 90e3, "bench_tar_writing: 256 MB/s, ~90 KB per audio s"),
)

# Model FLOPs per second of audio (forward only, real tokens/frames; attention scores left out).
GPU_FLOPS_PER_AUDIO_S = {
    # 2 * 1.41e9 non-embedding parameters * ~3 Qwen tokens per second of read speech
    "qwen_hidden_states (Qwen3-1.7B)": 2 * 1.41e9 * 3.0,
    # 2 * 0.31e9 transformer parameters * 50 frames/s, plus ~5 GFLOP of conv feature extractor
    "wavlm_features (WavLM-Large)": 2 * 0.31e9 * 50 + 5.0e9,
    # the aligner's CTC forward: 2 * 1.1e9 * 12.5 frames/s (FastConformer, 8x subsampling)
    "alignments (parakeet-ctc-1.1b forward)": 2 * 1.1e9 * 12.5,
}
H100_DENSE_BF16_FLOPS = 989e12

STEP_OVERHEAD_S = 45.0
"""A step pod's fixed cost: scheduling + image already on the node + Python imports (NeMo's alone takes
tens of seconds) + loading a model; paid by every step of every shard under the k8s_job_executor."""
STEPS_PER_SHARD = 10


def gpu_stages(mfu: float, peak_flops: float = H100_DENSE_BF16_FLOPS) -> tuple[Stage, ...]:
    return tuple(
        Stage(name, "gpu", peak_flops * mfu / flops, f"estimate: {flops / 1e9:.1f} GFLOP per audio s at MFU {mfu:g}")
        for name, flops in GPU_FLOPS_PER_AUDIO_S.items()
    )


def pool_rate(stages: tuple[Stage, ...], pool: str, workers: float) -> float:
    """Audio seconds per second the pool sustains through all its stages (0 without workers)."""
    cost = sum(1.0 / s.audio_s_per_s for s in stages if s.pool == pool)
    return workers / cost if cost and workers > 0 else (float("inf") if not cost else 0.0)


def capacity(stages: tuple[Stage, ...], cpus: float, gpus: float, shard_hours: float | None = None) -> dict:
    """Audio hours per day, the limiting pool and its most expensive stage."""
    rates = {"cpu": pool_rate(stages, "cpu", cpus), "gpu": pool_rate(stages, "gpu", gpus)}
    limiting = min(rates, key=rates.get)
    rate = rates[limiting]
    slowest = min((s for s in stages if s.pool == limiting), key=lambda s: s.audio_s_per_s)
    result = {
        "cpus": cpus,
        "gpus": gpus,
        "audio_hours_per_day": rate * SECONDS_PER_DAY / 3600.0,
        "cpu_hours_per_day": rates["cpu"] * SECONDS_PER_DAY / 3600.0,
        "gpu_hours_per_day": rates["gpu"] * SECONDS_PER_DAY / 3600.0,
        "bottleneck_pool": limiting,
        "bottleneck_stage": slowest.name,
    }
    if shard_hours:
        # Per shard: the work itself on one worker of each step vs the steps' fixed costs.
        work_s = sum(shard_hours * 3600.0 / s.audio_s_per_s for s in stages)
        result["step_overhead_share"] = STEP_OVERHEAD_S * STEPS_PER_SHARD / (STEP_OVERHEAD_S * STEPS_PER_SHARD + work_s)
    return result


def markdown_table(stages: tuple[Stage, ...], grid: list[tuple[int, int]]) -> str:
    lines = [
        "| CPU cores | GPUs | audio h/day (CPU pool) | audio h/day (GPU pool) | audio h/day | first bottleneck |",
        "|---|---|---|---|---|---|",
    ]
    for cpus, gpus in grid:
        c = capacity(stages, cpus, gpus)
        lines.append(
            f"| {cpus} | {gpus} | {c['cpu_hours_per_day']:,.0f} | {c['gpu_hours_per_day']:,.0f} | "
            f"{c['audio_hours_per_day']:,.0f} | {c['bottleneck_pool']}: {c['bottleneck_stage']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpus", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--mfu", type=float, default=0.15, help="assumed model FLOP utilisation on the GPU")
    parser.add_argument("--shard-hours", type=float, default=10.0, help="audio hours per shard")
    parser.add_argument("--table", action="store_true", help="print the markdown table of docs/performance.md instead")
    args = parser.parse_args(argv)
    stages = MEASURED_CPU_STAGES + gpu_stages(args.mfu)
    if args.table:
        print(markdown_table(stages, [(16, 1), (32, 2), (64, 4), (64, 8), (128, 8), (256, 8)]))
        return
    emit(
        "capacity_model",
        {"cpus": args.cpus, "gpus": args.gpus, "mfu": args.mfu, "shard_hours": args.shard_hours},
        {
            **capacity(stages, args.cpus, args.gpus, args.shard_hours),
            "stages": [
                {"name": s.name, "pool": s.pool, "audio_s_per_s": round(s.audio_s_per_s, 1), "source": s.source}
                for s in stages
            ],
        },
    )


if __name__ == "__main__":
    main()
