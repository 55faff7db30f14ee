"""The per-shard GPU stages with the full profile's models on one GPU: throughput, memory, share of peak FLOP/s.

Why: the three GPU stages (``ctc_alignments`` with parakeet-ctc-1.1b, ``qwen_hidden_states`` with
Qwen3-1.7B cut at ``hidden_states[-2]``, and ``wavlm_features`` with WavLM-Large) set how many GPU
hours a corpus costs. This runs the library functions (``compute_log_probs`` through
``ctc_model_forward``, ``qwen_hidden_states``, ``wavlm_features``) as the stages do, on CUDA with the
resources' default budgets, on ``--hours`` of synthetic input: random 24 kHz audio in utterances of
``--min-s`` .. ``--max-s`` seconds and, per utterance, ``--tokens-per-s`` random token ids per
second of audio (about what Qwen's tokenizer gives for read speech). Random input costs the same
FLOPs as speech.

Models: ``Qwen/Qwen3-1.7B`` and ``microsoft/wavlm-large`` from the Hugging Face cache or hub, or,
with ``--random-weights``, the same architectures built from their configs (the real sizes, so
FLOPs, kernels and memory are the real ones without downloading the weights). The CTC model is
always built from config at parakeet-ctc-1.1b's sizes (:mod:`benchmarks.capacity.gpu_ctc`), and timed in
float32 (as the stage runs it today) and under bf16 autocast. ``end_to_end_audio_hours_per_gpu_hour``
combines the three stages run one after another on the GPU (the faster CTC precision), against
the issue's target of 1 000.

Reported per model, from the median of ``--repeats`` timed passes after a warm-up (wall-clock,
``time.perf_counter``; the functions return host arrays, so each pass ends synchronized):

* ``audio_hours_per_gpu_hour``: audio processed per second of GPU wall time (the figure that prices
  a corpus), plus tokens or 50 Hz frames per second;
* ``share_outside_forward``: wall time not inside the model's ``forward`` (padding, masks,
  resampling and normalization on the device, pooling, copies back), timed with forward hooks
  that synchronize the device;
* ``peak_memory_gib``: ``torch.cuda.max_memory_allocated`` over a pass, weights included;
* ``fraction_of_peak_flops``: estimated useful FLOP/s over ``--peak-tflops`` (dense bf16; by
  default from ``torch.cuda.get_device_name()``: H100 SXM / H200 989, H100 PCIe 756, A100 312).
  Estimates count real (unpadded) work only: Qwen ``2 * params * tokens`` with the parameters of the
  layers that run (the embedding table is a lookup and the LM head is cut off); WavLM
  ``2 * params * frames`` (50 Hz frames, parameters outside the conv feature extractor) plus the
  conv feature extractor's own multiply-adds, exact per utterance. Attention scores
  (``4 * T^2 * d`` per layer) are left out, so this slightly understates the work on long inputs.

Without a CUDA device it prints ``{"benchmark": "gpu_features", "skipped": "no CUDA device"}`` and
exits 0. ``--tiny-dry-run`` instead builds 2-layer versions of the three models (full widths, random
weights), runs one small batch of each on the CPU and reports the same fields, to test the code
path without a GPU (its speeds mean nothing).

    python -m benchmarks.capacity.gpu_features [--random-weights] [--hours H] [--peak-tflops T] [--tiny-dry-run]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from benchmarks.capacity.gpu_ctc import (
    CTC_MODEL_ID,
    build_ctc,
    ctc_params,
    flops_per_audio_second,
    log_probs_pass,
    to_16k,
)
from benchmarks.report import ForwardTimer, emit, progress, stdout_to_stderr
from speechdata.alignment.log_probs import CTC_FRAME_S, MODEL_SAMPLE_RATE
from speechdata.features.speech import SOURCE_SAMPLE_RATE, WAVLM_SAMPLE_RATE, wavlm_features
from speechdata.features.text import keep_layers_through, qwen_hidden_states

BENCHMARK = "gpu_features"
QWEN_ID = "Qwen/Qwen3-1.7B"
WAVLM_ID = "microsoft/wavlm-large"
DEFAULT_MAX_TOKENS = 16_384  # TorchDeviceResource.max_batch_tokens default
DEFAULT_MAX_AUDIO_S = 200.0  # TorchDeviceResource.max_batch_audio_s default
WARM_UP_UTTERANCES = 16
SECONDS_PER_HOUR = 3600.0

# Dense (no sparsity) bf16 tensor-core peak, TFLOP/s, by a substring of the device name; first match wins.
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))

# Qwen/Qwen3-1.7B's config.json sizes.
QWEN3_1_7B = dict(
    vocab_size=151_936,
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40_960,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
)
# microsoft/wavlm-large's config.json sizes (the conv stack, position conv and buckets are WavLMConfig's defaults).
WAVLM_LARGE = dict(
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
    feat_extract_norm="layer",
    do_stable_layer_norm=True,
    conv_bias=True,
)
TINY_LAYERS = 2
TARGET_AUDIO_HOURS_PER_GPU_HOUR = 1000.0  # the scale target: alignment + Qwen + WavLM on one H100
CTC_PRECISIONS: dict[str, torch.dtype | None] = {"fp32": None, "bf16_autocast": torch.bfloat16}


def default_peak_tflops(device_name: str) -> float | None:
    for needle, tflops in PEAK_BF16_TFLOPS:
        if needle in device_name:
            return tflops
    return None


def build_qwen(random_weights: bool, layers: int | None, device: torch.device, dtype: torch.dtype):
    """Qwen3-1.7B cut at ``hidden_states[-2]``, as ``QwenEncoder`` builds it."""
    from transformers import AutoModel, Qwen3Config

    if random_weights:
        config = Qwen3Config(**{**QWEN3_1_7B, **({"num_hidden_layers": layers} if layers else {})})
        with torch.device(device):
            model = AutoModel.from_config(config, dtype=dtype)
    else:
        from speechdata.features.models import load_pretrained

        model = load_pretrained("qwen", QWEN_ID, None, False, dtype)
    return keep_layers_through(model.eval(), -2).to(device, dtype)


def build_wavlm(random_weights: bool, layers: int | None, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModel, WavLMConfig

    if random_weights:
        config = WavLMConfig(**{**WAVLM_LARGE, **({"num_hidden_layers": layers} if layers else {})})
        with torch.device(device):
            model = AutoModel.from_config(config, dtype=dtype)
    else:
        from speechdata.features.models import load_pretrained

        model = load_pretrained("wavlm", WAVLM_ID, None, False, dtype)
    return model.eval().to(device, dtype)


def qwen_flop_params(model) -> int:
    """Parameters that do multiply-adds per token: everything but the embedding table."""
    embedding = model.get_input_embeddings().weight.numel()
    return sum(p.numel() for p in model.parameters()) - embedding


def wavlm_flop_params(model) -> int:
    """Parameters applied once per 50 Hz frame: everything outside the conv feature extractor."""
    conv = sum(p.numel() for p in model.feature_extractor.parameters())
    return sum(p.numel() for p in model.parameters()) - conv


def conv_extractor_flops(config, samples_16k: int) -> int:
    """Multiply-adds x 2 of WavLM's conv feature extractor on one unpadded utterance."""
    flops, length, channels = 0, samples_16k, 1
    for out_channels, kernel, stride in zip(config.conv_dim, config.conv_kernel, config.conv_stride, strict=True):
        length = (length - kernel) // stride + 1
        if length <= 0:
            return flops
        flops += 2 * length * kernel * channels * out_channels
        channels = out_channels
    return flops


def synthetic_input(hours: float, min_s: float, max_s: float, tokens_per_s: float, vocab: int, seed: int):
    """Random 24 kHz utterances totalling ``hours`` and random token ids for each."""
    rng = np.random.default_rng(seed)
    audios, tokens, total = [], [], 0.0
    while total < hours * SECONDS_PER_HOUR:
        seconds = float(rng.uniform(min_s, max_s))
        audios.append((0.1 * rng.standard_normal(int(seconds * SOURCE_SAMPLE_RATE))).astype(np.float32))
        tokens.append(rng.integers(0, vocab, max(1, round(seconds * tokens_per_s))).tolist())
        total += seconds
    return audios, tokens


def timed_passes(
    run: Callable[[list[int]], object],
    count: int,
    timer: ForwardTimer,
    repeats: int,
    on_cuda: bool,
    warm_up: bool = True,
) -> dict:
    """Warm up on a few utterances, then ``repeats`` passes over all; the median pass by wall time."""
    if warm_up:
        run(list(range(min(WARM_UP_UTTERANCES, count))))
    passes = []
    for _ in range(repeats):
        if on_cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        timer.reset()
        started = time.perf_counter()
        run(list(range(count)))
        if on_cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() / 2**30 if on_cuda else None
        passes.append({"wall_s": wall, "forward_s": timer.seconds, "forwards": timer.calls, "peak_gib": peak})
    passes.sort(key=lambda p: p["wall_s"])
    middle = passes[(len(passes) - 1) // 2]
    middle["all_wall_s"] = [round(p["wall_s"], 3) for p in passes]
    return middle


def figures(
    measured: dict, audio_s: float, flops: float, units: float, unit_name: str, peak_tflops: float | None, params: int
) -> dict:
    wall = measured["wall_s"]
    achieved_tflops = flops / wall / 1e12
    return {
        "audio_hours_per_gpu_hour": round(audio_s / wall, 1),
        f"{unit_name}_per_s": round(units / wall, 1),
        "wall_s": round(wall, 3),
        "wall_s_all_passes": measured["all_wall_s"],
        "forwards": measured["forwards"],
        "share_outside_forward": round(1 - measured["forward_s"] / wall, 4),
        "peak_memory_gib": None if measured["peak_gib"] is None else round(measured["peak_gib"], 2),
        "flop_params": params,
        "estimated_tflop": round(flops / 1e12, 3),
        "achieved_tflops": round(achieved_tflops, 2),
        "fraction_of_peak_flops": round(achieved_tflops / peak_tflops, 4) if peak_tflops else None,
    }


def measure_ctc(
    audios: list[np.ndarray],
    layers: int | None,
    device: torch.device,
    repeats: int,
    on_cuda: bool,
    peak_tflops: float | None,
    tiny_dry_run: bool,
) -> dict:
    """The alignment stage's log-prob pass, in float32 (production today) and under bf16 autocast."""
    audios_16k = to_16k(audios)
    audio_s = sum(a.shape[0] for a in audios_16k) / MODEL_SAMPLE_RATE
    model = build_ctc(layers, device)
    # ctc_model_forward calls the encoder itself (its hooks fire); the encoder is where the work is.
    timer = ForwardTimer(model.encoder, torch.cuda.synchronize if on_cuda else None)
    flops = flops_per_audio_second(model, audios_16k, device) * audio_s
    params = ctc_params(model)
    result: dict = {"model": CTC_MODEL_ID, "layers_run": len(model.encoder.layers), "params": params}
    for name, autocast in CTC_PRECISIONS.items():
        measured = timed_passes(
            lambda idx, model=model, autocast=autocast: log_probs_pass(
                model, [audios_16k[i] for i in idx], device, autocast
            ),
            len(audios_16k),
            timer,
            repeats,
            on_cuda,
            warm_up=not tiny_dry_run,
        )
        frames = audio_s / CTC_FRAME_S
        result[name] = figures(measured, audio_s, flops, frames, "frames_12_5hz", peak_tflops, params)
    result["bf16_over_fp32"] = round(
        result["bf16_autocast"]["audio_hours_per_gpu_hour"] / result["fp32"]["audio_hours_per_gpu_hour"], 3
    )
    del model
    if on_cuda:
        torch.cuda.empty_cache()
    return result


def end_to_end_rate(*audio_hours_per_gpu_hour: float) -> float:
    """Audio hours per GPU hour when every stage runs on the same GPU, one after another."""
    return round(1.0 / sum(1.0 / rate for rate in audio_hours_per_gpu_hour), 1)


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a quarter of an hour of input and one pass")
    parser.add_argument("--random-weights", action="store_true", help="build the models from config, no download")
    parser.add_argument("--hours", type=float, default=4.0, help="hours of synthetic audio")
    parser.add_argument("--min-s", type=float, default=2.0, help="shortest utterance, seconds")
    parser.add_argument("--max-s", type=float, default=15.0, help="longest utterance, seconds")
    parser.add_argument("--tokens-per-s", type=float, default=3.0, help="Qwen tokens per second of audio")
    parser.add_argument("--max-batch-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--max-batch-s", type=float, default=DEFAULT_MAX_AUDIO_S)
    parser.add_argument("--peak-tflops", type=float, default=None, help="dense bf16 peak (default: by device name)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per model")
    parser.add_argument(
        "--tiny-dry-run",
        action="store_true",
        help=f"{TINY_LAYERS}-layer models, random weights, one small batch on the CPU",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.hours, args.repeats = 0.25, 1
    if args.tiny_dry_run:
        args.random_weights, args.hours, args.repeats = True, 12.0 / SECONDS_PER_HOUR, 1
        args.min_s, args.max_s = 2.0, 4.0
    return args


@dataclass(frozen=True)
class Target:
    """Where the models run: the device, its dtype, the layers built (None: all) and its bf16 peak."""

    device: torch.device
    dtype: torch.dtype
    layers: int | None
    name: str
    peak_tflops: float | None

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def synchronize(self) -> Callable[[], None] | None:
        return torch.cuda.synchronize if self.on_cuda else None

    def release(self) -> None:
        if self.on_cuda:
            torch.cuda.empty_cache()


def choose_target(args: argparse.Namespace) -> Target | None:
    """The CPU for a tiny dry run, else the GPU; None without one."""
    if args.tiny_dry_run:
        return Target(torch.device("cpu"), torch.bfloat16, TINY_LAYERS, "cpu (tiny dry run)", args.peak_tflops)
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        return Target(torch.device("cuda"), torch.bfloat16, None, name, args.peak_tflops or default_peak_tflops(name))
    return None


def measure_qwen(args: argparse.Namespace, target: Target, tokens: list[list[int]], audio_s: float) -> dict:
    qwen = build_qwen(args.random_weights, target.layers, target.device, target.dtype)
    timer = ForwardTimer(qwen, target.synchronize())
    n_tokens = sum(len(t) for t in tokens)
    params = qwen_flop_params(qwen)
    measured = timed_passes(
        lambda idx, qwen=qwen: qwen_hidden_states(
            qwen, [tokens[i] for i in idx], device=target.device, max_batch_tokens=args.max_batch_tokens
        ),
        len(tokens),
        timer,
        args.repeats,
        target.on_cuda,
        warm_up=not args.tiny_dry_run,
    )
    qwen_figures = {
        "layers_run": len(qwen.layers),
        "hidden_size": qwen.config.hidden_size,
        "attn_implementation": qwen.config._attn_implementation,
        **figures(measured, audio_s, 2.0 * params * n_tokens, n_tokens, "tokens", target.peak_tflops, params),
    }
    del qwen
    target.release()
    return qwen_figures


def measure_wavlm(
    args: argparse.Namespace, target: Target, audios: list[np.ndarray], audio_s: float
) -> tuple[dict, int]:
    """WavLM's figures, and the 50 Hz frames it computed."""
    wavlm = build_wavlm(args.random_weights, target.layers, target.device, target.dtype)
    timer = ForwardTimer(wavlm, target.synchronize())
    samples_16k = [-(-a.shape[0] * WAVLM_SAMPLE_RATE // SOURCE_SAMPLE_RATE) for a in audios]
    frames = int(wavlm._get_feat_extract_output_lengths(torch.tensor(samples_16k)).sum())
    n_frames = [-(-a.shape[0] // 1920) for a in audios]  # Mimi frames, 12.5 Hz at 24 kHz
    params = wavlm_flop_params(wavlm)
    conv_flops = sum(conv_extractor_flops(wavlm.config, n) for n in samples_16k)
    measured = timed_passes(
        lambda idx, wavlm=wavlm: wavlm_features(
            wavlm,
            [audios[i] for i in idx],
            [n_frames[i] for i in idx],
            device=target.device,
            dtype=target.dtype,
            max_batch_s=args.max_batch_s,
        ),
        len(audios),
        timer,
        args.repeats,
        target.on_cuda,
        warm_up=not args.tiny_dry_run,
    )
    flops = 2.0 * params * frames + conv_flops
    wavlm_figures = {
        "layers_run": len(wavlm.encoder.layers),
        "hidden_size": wavlm.config.hidden_size,
        "conv_extractor_share_of_flops": round(conv_flops / flops, 4),
        **figures(measured, audio_s, flops, frames, "frames_50hz", target.peak_tflops, params),
    }
    del wavlm
    target.release()
    return wavlm_figures, frames


def run_params(args: argparse.Namespace, target: Target) -> dict:
    return {
        "quick": args.quick,
        "tiny_dry_run": args.tiny_dry_run,
        "random_weights": args.random_weights,
        "models": {"qwen": QWEN_ID, "wavlm": WAVLM_ID, "ctc": CTC_MODEL_ID},
        "device": target.name,
        "dtype": str(target.dtype),
        "torch": torch.__version__,
        "hours": args.hours,
        "min_s": args.min_s,
        "max_s": args.max_s,
        "tokens_per_s": args.tokens_per_s,
        "max_batch_tokens": args.max_batch_tokens,
        "max_batch_s": args.max_batch_s,
        "repeats": args.repeats,
        "seed": args.seed,
        "peak_bf16_tflops": target.peak_tflops,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    target = choose_target(args)
    if target is None:
        print('{"benchmark": "gpu_features", "skipped": "no CUDA device"}', flush=True)
        return
    with stdout_to_stderr():
        started = time.perf_counter()
        audios, tokens = synthetic_input(
            args.hours, args.min_s, args.max_s, args.tokens_per_s, QWEN3_1_7B["vocab_size"], args.seed
        )
        audio_s = sum(a.shape[0] for a in audios) / SOURCE_SAMPLE_RATE
        progress(
            f"{len(audios)} utterances, {audio_s / 3600:.2f} h, {sum(map(len, tokens))} tokens "
            f"({time.perf_counter() - started:.1f} s)"
        )
        qwen_figures = measure_qwen(args, target, tokens, audio_s)
        progress(f"qwen {qwen_figures}")
        wavlm_figures, frames = measure_wavlm(args, target, audios, audio_s)
        progress(f"wavlm {wavlm_figures}")
        ctc_figures = measure_ctc(
            audios, target.layers, target.device, args.repeats, target.on_cuda, target.peak_tflops, args.tiny_dry_run
        )
        progress(f"ctc {ctc_figures}")
        end_to_end = end_to_end_rate(
            qwen_figures["audio_hours_per_gpu_hour"],
            wavlm_figures["audio_hours_per_gpu_hour"],
            max(ctc_figures[name]["audio_hours_per_gpu_hour"] for name in CTC_PRECISIONS),
        )
    emit(
        BENCHMARK,
        run_params(args, target),
        {
            "utterances": len(audios),
            "audio_hours": round(audio_s / SECONDS_PER_HOUR, 4),
            "tokens": sum(len(t) for t in tokens),
            "frames_50hz": frames,
            "qwen": qwen_figures,
            "wavlm": wavlm_figures,
            "ctc_alignment": ctc_figures,
            "end_to_end_audio_hours_per_gpu_hour": end_to_end,
            "end_to_end_over_target": round(end_to_end / TARGET_AUDIO_HOURS_PER_GPU_HOUR, 3),
        },
    )


if __name__ == "__main__":
    main()
