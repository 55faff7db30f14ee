"""Feature extraction on the CPU with the tiny profile models: batched against one utterance at a time.

Why: the Qwen3 hidden-state and WavLM stages batch utterances by length under a padded budget
(``max_batch_tokens`` / ``max_batch_s``) so that the device runs few, large forwards. This checks,
on the same utterances in the same run, what that batching buys over one forward per utterance, and
how much of the wall time is *not* the model: tensor building, padding, masks, on-device
resampling and normalization (WavLM), pooling to Mimi frames, float16 conversion and copies back.
A high share outside the forward is time a faster device cannot win back.

Input: ``--utterances`` utterances of 24 kHz audio, each ``--min-s`` .. ``--max-s`` seconds,
built by concatenating the fixture clips (``load_clips()``, resampled once to 24 kHz with soxr)
and cutting to length, with the concatenated transcripts of the clips they contain, tokenized with
the tiny tokenizer. Models: ``tiny_qwen3`` (cut by ``keep_layers_through(model, -2)``, as the
stage does) and ``tiny_wavlm``, float32, on the CPU with ``torch.set_num_threads(--threads)``.

For each model, wall-clock (``time.perf_counter``) of the library function over all utterances:

* batched: ``qwen_hidden_states(max_batch_tokens=16384)`` and ``wavlm_features(max_batch_s=200)``,
  the ``TorchDeviceResource`` defaults;
* one at a time, the baseline: the same function with a budget so small that every forward holds
  one utterance (``budgeted_batches`` never puts two items in a batch whose padded cost exceeds it).

Reported: audio seconds per wall second for both, ``batched_over_one_at_a_time`` (>1: batching
helps), forward counts, and ``share_outside_forward = 1 - forward_s / total_s``, where forward_s
sums the model's own ``forward`` (timed with forward pre/post hooks on the model instance), plus
``batched_padded_over_real``: padded over real tokens / samples of the batched budget's batches
(one at a time pads nothing). Each mode's figures come from its median pass (the faster of the
middle two for an even count) of ``--repeats`` (``--qwen-repeats`` for Qwen, whose passes are
short) after an untimed warm-up on a few utterances; the two modes alternate which goes first, so
a burst of load on a shared machine skews neither. The 1-minute load average before and after is in ``params``:
other processes on the cores slow multi-threaded torch far more than their share.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import numpy as np
import soxr
import torch

from benchmarks.report import ForwardTimer, emit, progress, ratio, stdout_to_stderr
from speechdata.bridge.frame_grid import n_frames_for
from speechdata.bridge.text_tokens import TINY_VOCAB_SIZE, tiny_tokenizer, tokenize_many
from speechdata.features.gpu_batching import budgeted_batches
from speechdata.features.models import tiny_qwen3, tiny_wavlm
from speechdata.features.speech import SOURCE_SAMPLE_RATE, WAVLM_SAMPLE_RATE, wavlm_features
from speechdata.features.text import keep_layers_through, qwen_hidden_states
from speechdata.testing.shards import load_clips

SAMPLE_RATE = 24_000
DEVICE = torch.device("cpu")
BATCHED_MAX_TOKENS = 16_384  # TorchDeviceResource.max_batch_tokens default
BATCHED_MAX_AUDIO_S = 200.0  # TorchDeviceResource.max_batch_audio_s default
# Budgets below any single utterance's cost: every forward holds exactly one utterance.
ONE_MAX_TOKENS = 1
ONE_MAX_AUDIO_S = 1 / 16_000
WARM_UP_UTTERANCES = 8


def build_utterances(count: int, min_s: float, max_s: float, seed: int) -> tuple[list[np.ndarray], list[str]]:
    """``count`` 24 kHz float32 utterances of min_s..max_s seconds and their transcripts."""
    rng = np.random.default_rng(seed)
    clips = [(soxr.resample(c.samples, c.sample_rate, SAMPLE_RATE).astype(np.float32), c.text) for c in load_clips()]
    audios, texts = [], []
    for _ in range(count):
        target = int(rng.uniform(min_s, max_s) * SAMPLE_RATE)
        parts, words, total = [], [], 0
        while total < target:
            samples, text = clips[rng.integers(len(clips))]
            gap = np.zeros(int(rng.uniform(0.1, 0.5) * SAMPLE_RATE), np.float32)
            parts += [samples, gap]
            words.append(text)
            total += samples.shape[0] + gap.shape[0]
        audio = np.concatenate(parts)[:target]
        # Keep the transcripts of the clips that start before the cut (roughly what is heard).
        kept, start = [], 0
        for part_index in range(0, len(parts), 2):
            if start < target:
                kept.append(words[part_index // 2])
            start += parts[part_index].shape[0] + parts[part_index + 1].shape[0]
        audios.append(audio)
        texts.append(" ".join(kept))
    return audios, texts


def padded_over_real(costs: list[int], budget: int) -> float:
    """Padded cost (``len(batch) * max(cost)`` summed over batches) over the real cost, for ``budget``."""
    padded = sum(len(b) * max(costs[i] for i in b) for b in budgeted_batches(costs, budget))
    return round(padded / sum(costs), 4)


def measure(
    runs: dict[str, Callable[[list[int]], object]], timer: ForwardTimer, count: int, audio_s: float, repeats: int
) -> dict:
    """Median pass of each mode (``batched``, ``one_at_a_time``) over all ``count`` utterances.

    ``runs[mode](indices)`` runs the mode on those utterances. The modes alternate which goes first.
    """
    everything = list(range(count))
    for run in runs.values():
        run(everything[:WARM_UP_UTTERANCES])  # warm-up: first-call set-up, allocator
    passes: dict[str, list[dict]] = {mode: [] for mode in runs}
    for repeat in range(repeats):
        order = list(runs) if repeat % 2 == 0 else list(runs)[::-1]
        for mode in order:
            passes[mode].append(timer.timed_pass(lambda mode=mode: runs[mode](everything)))
    out = {}
    for mode, results in passes.items():
        # The median pass by wall time (the faster of the middle two for an even count), whole:
        # its forward time and share come from the same pass as its total.
        middle = sorted(results, key=lambda r: r["total_s"])[(len(results) - 1) // 2]
        total, forward = middle["total_s"], middle["forward_s"]
        out[mode] = {
            "audio_s_per_s": round(audio_s / total, 1),
            "wall_s": round(total, 3),
            "forward_s": round(forward, 3),
            "forwards": middle["forwards"],
            "share_outside_forward": round(1 - forward / total, 4),
        }
    progress(f"{out}")
    out["batched_over_one_at_a_time"] = ratio(out["batched"]["audio_s_per_s"], out["one_at_a_time"]["audio_s_per_s"])
    return out


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few utterances and one pass, for smoke runs")
    parser.add_argument("--utterances", type=int, default=200)
    parser.add_argument("--min-s", type=float, default=2.0, help="shortest utterance, seconds")
    parser.add_argument("--max-s", type=float, default=15.0, help="longest utterance, seconds")
    parser.add_argument("--repeats", type=int, default=2, help="timed passes of each WavLM mode")
    parser.add_argument("--qwen-repeats", type=int, default=7, help="timed passes of each Qwen mode (they are short)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.utterances, args.repeats, args.qwen_repeats = 24, 1, 1
    return args


def measure_qwen(tokens: list[list[int]], audio_s: float, repeats: int) -> dict:
    qwen = keep_layers_through(tiny_qwen3(TINY_VOCAB_SIZE), -2).to(DEVICE)

    def qwen_run(max_batch_tokens: int):
        return lambda indices: qwen_hidden_states(
            qwen, [tokens[i] for i in indices], device=DEVICE, max_batch_tokens=max_batch_tokens
        )

    runs = {"batched": qwen_run(BATCHED_MAX_TOKENS), "one_at_a_time": qwen_run(ONE_MAX_TOKENS)}
    qwen_figures = measure(runs, ForwardTimer(qwen), len(tokens), audio_s, repeats)
    qwen_figures["batched_padded_over_real"] = padded_over_real([max(len(t), 1) for t in tokens], BATCHED_MAX_TOKENS)
    return qwen_figures


def measure_wavlm(audios: list[np.ndarray], audio_s: float, repeats: int) -> dict:
    wavlm = tiny_wavlm().to(DEVICE)
    n_frames = [n_frames_for(a.shape[0]) for a in audios]

    def wavlm_run(max_batch_s: float):
        return lambda indices: wavlm_features(
            wavlm,
            [audios[i] for i in indices],
            [n_frames[i] for i in indices],
            device=DEVICE,
            dtype=torch.float32,
            max_batch_s=max_batch_s,
        )

    runs = {"batched": wavlm_run(BATCHED_MAX_AUDIO_S), "one_at_a_time": wavlm_run(ONE_MAX_AUDIO_S)}
    wavlm_figures = measure(runs, ForwardTimer(wavlm), len(audios), audio_s, repeats)
    wavlm_figures["batched_padded_over_real"] = padded_over_real(
        [-(-a.shape[0] * WAVLM_SAMPLE_RATE // SOURCE_SAMPLE_RATE) for a in audios],
        int(BATCHED_MAX_AUDIO_S * WAVLM_SAMPLE_RATE),
    )
    return wavlm_figures


def run_params(args: argparse.Namespace, load_before: float, load_after: float) -> dict:
    return {
        "quick": args.quick,
        "utterances": args.utterances,
        "min_s": args.min_s,
        "max_s": args.max_s,
        "repeats": args.repeats,
        "qwen_repeats": args.qwen_repeats,
        "seed": args.seed,
        "device": "cpu",
        "dtype": "float32",
        "torch_num_threads": args.threads,
        "models": "tiny_qwen3 (cut at hidden_states[-2]), tiny_wavlm",
        "batched_budgets": {"max_batch_tokens": BATCHED_MAX_TOKENS, "max_batch_s": BATCHED_MAX_AUDIO_S},
        # Other processes competing for the cores slow multi-threaded torch a lot (threads wait
        # on each other at every op); the 1-minute load average before and after says how busy.
        "load_average_1m": {"before": load_before, "after": load_after},
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    load_before = round(os.getloadavg()[0], 2)
    with stdout_to_stderr():
        torch.set_num_threads(args.threads)
        audios, texts = build_utterances(args.utterances, args.min_s, args.max_s, args.seed)
        audio_s = sum(a.shape[0] for a in audios) / SAMPLE_RATE
        tokens = [t.ids for t in tokenize_many(tiny_tokenizer(), texts)]
        n_tokens = sum(len(t) for t in tokens)
        progress(f"{len(audios)} utterances, {audio_s:.0f} s of audio, {n_tokens} tokens")
        qwen_figures = measure_qwen(tokens, audio_s, args.qwen_repeats)
        wavlm_figures = measure_wavlm(audios, audio_s, args.repeats)
        load_after = round(os.getloadavg()[0], 2)
    emit(
        "features",
        run_params(args, load_before, load_after),
        {"audio_seconds": round(audio_s, 1), "tokens": n_tokens, "qwen": qwen_figures, "wavlm": wavlm_figures},
    )


if __name__ == "__main__":
    main()
