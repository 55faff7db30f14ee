"""Forced alignment's peak memory against the utterance's length: bounded by ``max_frame_tokens``.

Why: the Viterbi keeps a back-pointer byte per frame and state, ``T x (2L + 1)``, so one 2-hour
utterance with a 17 000-word transcript asked for gigabytes and killed every retry of the alignment
run. ``align_transcript`` now rejects an utterance past ``max_frame_tokens`` (frames x tokens) as
``too_long_to_align`` before the Viterbi runs; since then the default limit only stops pathological
input and a long utterance takes the checkpointed Viterbi (``benchmarks/accuracy/bench_long_form.py`` measures
that against length), so at the default limit every duration here aligns. This aligns one synthetic utterance per duration
(random character-model log-probs at 80 ms frames, a transcript of 2.36 words a second, the rate of
the 2-hour case) in a fresh subprocess each, and reports its peak RSS (``ru_maxrss``) and outcome
beside the baseline: the back-pointer bytes the Viterbi would allocate without the limit.

``python -m benchmarks.stages.bench_alignment_memory --measure SECONDS`` is the subprocess.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.report import emit, leave_measured, peak_rss_mb, progress

ROOT = Path(__file__).resolve().parents[2]
FRAME_S = 0.08
WORDS_PER_S = 17_000 / 7200
LABELS = list(" abcdefghijklmnopqrstuvwxyz'")


def _utterance(seconds: float) -> tuple[np.ndarray, str]:
    frames = int(seconds / FRAME_S)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((frames, len(LABELS) + 1)).astype(np.float32)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    # two-letter words without repeats: 3 tokens a word, so the text always fits the frames
    return log_probs, " ".join(["ab"] * int(seconds * WORDS_PER_S))


def _measure(seconds: float) -> None:
    from speechdata.alignment.forced import AlignmentRejected, align_transcript
    from speechdata.alignment.transcript_units import CharVocabulary

    vocabulary = CharVocabulary(LABELS)
    log_probs, text = _utterance(seconds)
    baseline_rss = peak_rss_mb()
    started = time.perf_counter()
    try:
        align_transcript(log_probs, text, vocabulary, 80, int(seconds * 1000))
        outcome = "aligned"
    except AlignmentRejected as exc:
        outcome = exc.reason
    print(
        json.dumps(
            {
                "outcome": outcome,
                "rss_before_mb": baseline_rss,
                "peak_rss_mb": peak_rss_mb(),
                "seconds": time.perf_counter() - started,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--durations-s", type=float, nargs="+", default=[60, 300, 1200, 1800, 7200])
    parser.add_argument("--quick", action="store_true", help="two short durations and a 30-minute one")
    parser.add_argument("--measure", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure is not None:
        _measure(args.measure)
        leave_measured()
    # 30 minutes takes the checkpointed Viterbi; 2 hours would too, at minutes of CPU for a smoke test
    durations = [60, 300, 1800] if args.quick else args.durations_s
    per_duration = []
    for seconds in durations:
        result = subprocess.run(
            [sys.executable, "-m", "benchmarks.stages.bench_alignment_memory", "--measure", str(seconds)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        figures = json.loads(result.stdout.strip().splitlines()[-1])
        frames = int(seconds / FRAME_S)
        tokens = 3 * int(seconds * WORDS_PER_S) - 1
        progress(f"{seconds:.0f} s: {figures['outcome']}, peak {figures['peak_rss_mb']:.0f} MB")
        per_duration.append(
            {
                "duration_s": seconds,
                "frames": frames,
                "tokens": tokens,
                "frame_tokens": frames * tokens,
                "outcome": figures["outcome"],
                "rss_before_mb": round(figures["rss_before_mb"], 1),
                "peak_rss_mb": round(figures["peak_rss_mb"], 1),
                "unbounded_backpointer_mb": round(frames * (2 * tokens + 1) / 2**20, 1),
                "seconds": round(figures["seconds"], 2),
            }
        )
    emit(
        "alignment_memory",
        {"durations_s": durations, "words_per_s": round(WORDS_PER_S, 3), "frame_s": FRAME_S},
        {"per_duration": per_duration, "max_peak_rss_mb": max(d["peak_rss_mb"] for d in per_duration)},
    )


if __name__ == "__main__":
    main()
