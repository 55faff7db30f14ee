"""Grid quantization throughput: utterances per second for a shard of 10 000 utterances.

Why: ``frame_grids`` runs on the CPU for every utterance of every shard; it must never be the
stage people wait for. This builds 10 000 synthetic utterances (transcripts drawn from the
fixture sentences, one to four sentences each, random but ordered word times) and measures, in
one process: tokenizing all transcripts with character offsets (the tiny Qwen-style tokenizer, a
batch call, the baseline any grid needs) and building every grid from words + offsets
(``build_frame_grid``: token spans, half-up rounding, frame-centre quantization), reported as
utterances per second each and as a ratio.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call
from speechdata.alignment.table import TimedUnit
from speechdata.bridge.frame_grid import build_frame_grid, check_grid_invariants
from speechdata.bridge.text_tokens import tiny_tokenizer, tokenize_many
from speechdata.testing.shards import load_clips


def synthetic_utterances(n: int, seed: int) -> list[tuple[str, list[TimedUnit], int]]:
    rng = np.random.default_rng(seed)
    sentences = [clip.text for clip in load_clips()]
    utterances = []
    for _ in range(n):
        text = " ".join(rng.choice(sentences, size=int(rng.integers(1, 5))))
        words = text.split()
        cuts = np.sort(rng.integers(0, 400 * len(words), size=2 * len(words)))
        units = [TimedUnit(w, int(cuts[2 * i]), int(cuts[2 * i + 1])) for i, w in enumerate(words)]
        n_samples = int((cuts[-1] + int(rng.integers(0, 800))) * 24)
        utterances.append((text, units, n_samples))
    return utterances


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 000 utterances")
    parser.add_argument("--utterances", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.utterances = 1_000
    with stdout_to_stderr():
        utterances = synthetic_utterances(args.utterances, args.seed)
        tokenizer = tiny_tokenizer()
        tokenize_many(tokenizer, [u[0] for u in utterances[:100]])  # warm-up
        tokenize_s, tokenized = timed_call(lambda: tokenize_many(tokenizer, [u[0] for u in utterances]))
        grid_s, grids = timed_call(
            lambda: [
                build_frame_grid(text, words, tokens.ids, tokens.offsets, n_samples)
                for (text, words, n_samples), tokens in zip(utterances, tokenized, strict=True)
            ]
        )
        broken = sum(bool(check_grid_invariants(g, u[2])) for g, u in zip(grids, utterances, strict=True))
        tokens = sum(g.n_tokens for g in grids)
        progress(f"tokenize {tokenize_s:.2f} s, grids {grid_s:.2f} s, {tokens} tokens, {broken} broken")
    emit(
        "frame_grid",
        {"quick": args.quick, "utterances": args.utterances, "seed": args.seed},
        {
            "tokens": tokens,
            "frames": sum(g.n_frames for g in grids),
            "tokenize_utt_per_s": round(args.utterances / tokenize_s, 1),
            "grid_utt_per_s": round(args.utterances / grid_s, 1),
            "ratio_grid_over_tokenize": ratio(args.utterances / grid_s, args.utterances / tokenize_s),
            "grids_breaking_invariants": broken,
        },
    )


if __name__ == "__main__":
    main()
