"""Streaming segment throughput: utterances (and segments) built per second on 100 000 synthetic utterances.

Why: ``streaming_segments`` runs on the CPU for every utterance of every shard with an LLM
segmentation; it must keep up with the aligner. This builds 100 000 synthetic utterances (transcripts
drawn from the fixture sentences, ordered random word times, three latency levels of 1-2, 2-4 and
4-8 word chunks with placeholder Chinese, 3% of chunks rewritten so they match nothing) and times, in
one process, on the same inputs:

- ``ours``: :func:`speechdata.translation.segments.utterance_segments` (monotonic matching,
  conservative timeline, bilingual segments; all three levels);
- ``baseline``: the original script as its README describes it: each chunk's tokens matched against ANY
  aligned word (start = earliest, end = latest match), an ``{english: chinese}`` dict, and a
  second-by-second scan emitting the chunks with ``end <= S + 1`` (unmatched chunks never emitted).

Besides speed it counts matched chunks whose span differs from the words they were cut from
(``misplaced_chunk_share``): the baseline's rule misplaces chunks holding a word that occurs twice.
"""

from __future__ import annotations

import argparse
import math
import re

import numpy as np

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call
from speechdata.alignment.table import TimedUnit
from speechdata.testing.shards import load_clips
from speechdata.translation.segmentation_input import LATENCY_LEVELS, LevelChunks, Segmentation
from speechdata.translation.segments import utterance_segments

CHUNK_WORDS = {"low_latency": (1, 2), "medium_latency": (2, 4), "high_latency": (4, 8)}
REWRITTEN_SHARE = 0.03


def synthetic_utterances(n: int, seed: int) -> list[tuple[list[TimedUnit], Segmentation, dict[str, list[tuple]]]]:
    """``(words, segmentation, truth)``; truth[level][i] is chunk i's true ``(start_ms, end_ms)`` or None."""
    rng = np.random.default_rng(seed)
    sentences = [clip.text for clip in load_clips() if clip.language == "en"]
    utterances = []
    for _ in range(n):
        text = " ".join(rng.choice(sentences, size=int(rng.integers(1, 4))))
        tokens = text.split()
        cuts = np.sort(rng.integers(0, 350 * len(tokens), size=2 * len(tokens)))
        words = [TimedUnit(w, int(cuts[2 * i]), int(cuts[2 * i + 1])) for i, w in enumerate(tokens)]
        levels, truth = {}, {}
        for level, (low, high) in CHUNK_WORDS.items():
            english, chinese, spans = [], [], []
            i = 0
            while i < len(tokens):
                j = min(len(tokens), i + int(rng.integers(low, high + 1)))
                if rng.random() < REWRITTEN_SHARE:
                    english.append(f"zz{rng.integers(1_000_000)}")
                    spans.append(None)
                else:
                    english.append(" ".join(tokens[i:j]).lower())
                    spans.append((words[i].start_ms, words[j - 1].end_ms))
                chinese.append(f"中{i}文{j}")
                i = j
            levels[level] = LevelChunks(tuple(english), tuple(chinese))
            truth[level] = spans
        utterances.append((words, Segmentation(levels), truth))
    return utterances


# --- the baseline's approach ----------------------------------------------------------------------

_PUNCT = re.compile(r"[^\w\s]")


def _baseline_normalize(text: str) -> list[str]:
    return _PUNCT.sub("", text.lower()).split()


def baseline_level(chunks: LevelChunks, words: list[TimedUnit]) -> tuple[list[tuple], list[dict]]:
    aligned = [(_baseline_normalize(w.text), w.start_ms / 1000.0, w.end_ms / 1000.0) for w in words]
    timed = []
    for chunk in chunks.english:
        tokens = set(_baseline_normalize(chunk))
        hits = [(s, e) for toks, s, e in aligned if any(t in tokens for t in toks)]
        timed.append((chunk, min(h[0] for h in hits), max(h[1] for h in hits)) if hits else (chunk, None, None))
    eng2zh = dict(zip(chunks.english, chunks.chinese, strict=True))
    last_end = max((e for _, _, e in timed if e is not None), default=0.0)
    emitted, segments = set(), []
    for second in range(int(math.ceil(last_end)) + 1):
        emit_now = [
            k for k, (_, _, end) in enumerate(timed) if end is not None and k not in emitted and end <= second + 1.0
        ]
        if emit_now:
            emitted.update(emit_now)
            segments.append(
                {
                    "second": second,
                    "source": " ".join(timed[k][0] for k in emit_now),
                    "target": "".join(eng2zh[timed[k][0]] for k in emit_now),
                }
            )
    return timed, segments


def misplaced(timed_spans: list[tuple | None], truth: list[tuple | None]) -> tuple[int, int]:
    """(matched chunks whose span differs from the truth, matched chunks)."""
    pairs = [(got, want) for got, want in zip(timed_spans, truth, strict=True) if got is not None and want is not None]
    return sum(got != want for got, want in pairs), len(pairs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 000 utterances")
    parser.add_argument("--utterances", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.utterances = 5_000
    with stdout_to_stderr():
        utterances = synthetic_utterances(args.utterances, args.seed)
        ours_s, ours = timed_call(lambda: [utterance_segments(seg, words) for words, seg, _ in utterances])
        baseline_s, baseline = timed_call(
            lambda: [
                {level: baseline_level(seg.levels[level], words) for level in LATENCY_LEVELS}
                for words, seg, _ in utterances
            ]
        )
        ours_segments = sum(len(r.segments) for levels in ours for r in levels.values())
        baseline_segments = sum(len(levels[lvl][1]) for levels in baseline for lvl in LATENCY_LEVELS)
        ours_bad = baseline_bad = matched_ours = matched_baseline = 0
        for (_, _, truth), mine, theirs in zip(utterances, ours, baseline, strict=True):
            for level in LATENCY_LEVELS:
                spans = [(t.start_ms, t.end_ms) if t.matched else None for t in mine[level].timings]
                bad, n = misplaced(spans, truth[level])
                ours_bad, matched_ours = ours_bad + bad, matched_ours + n
                spans = [None if e is None else (round(s * 1000), round(e * 1000)) for _, s, e in theirs[level][0]]
                bad, n = misplaced(spans, truth[level])
                baseline_bad, matched_baseline = baseline_bad + bad, matched_baseline + n
        progress(
            f"ours {ours_s:.2f} s ({ours_segments} segments), baseline {baseline_s:.2f} s ({baseline_segments} segments)"
        )
    emit(
        "streaming_segments",
        {
            "quick": args.quick,
            "utterances": args.utterances,
            "seed": args.seed,
            "levels": len(LATENCY_LEVELS),
            "rewritten_chunk_share": REWRITTEN_SHARE,
        },
        {
            "utt_per_s": round(args.utterances / ours_s, 1),
            "segments_per_s": round(ours_segments / ours_s, 1),
            "baseline_utt_per_s": round(args.utterances / baseline_s, 1),
            "baseline_segments_per_s": round(baseline_segments / baseline_s, 1),
            "ratio_utt_per_s_over_baseline": ratio(args.utterances / ours_s, args.utterances / baseline_s),
            "misplaced_chunk_share": round(ours_bad / max(matched_ours, 1), 6),
            "baseline_misplaced_chunk_share": round(baseline_bad / max(matched_baseline, 1), 6),
        },
    )


if __name__ == "__main__":
    main()
