"""Training-sized segments of a long aligned recording, cut at its pauses and untranscribed stretches.

A recording of an hour is one utterance to the aligner but no use as one training sample. Once it
is aligned, its word timings say where it can be cut without cutting a word: :func:`cut_segments`
returns segments of at most ``max_segment_ms``, each cut in the longest pause between two words of
the stretch that would overflow, never across a stretch the transcript does not cover (the
wildcard's). The ``alignments`` stage writes them as ``segment`` rows of ``alignments.parquet``
(for utterances longer than ``max_segment_ms``), and the bridge packs each as a sample of its own,
cut on the Mimi clock (:mod:`speechdata.bridge.segments`).
"""

from __future__ import annotations

from speechdata.alignment.table import TimedUnit

MAX_SEGMENT_MS = 20_000
"""Longest segment cut from a long recording: the ASR manifest's and the HF dataset's default longest
utterance, so every segment the bridge packs is one those products can also publish."""

EDGE_PAD_MS = 200
"""Silence kept around a segment's first and last word, at most half the pause to the next word."""


def cut_segments(
    words: list[TimedUnit],
    duration_ms: int,
    untranscribed: list[tuple[int, int]] = (),
    max_segment_ms: int = MAX_SEGMENT_MS,
) -> list[TimedUnit]:
    """Segments (text: their words joined; times in the recording's ms) covering every timed word once.

    A word longer than ``max_segment_ms`` on its own (a misalignment) gets a segment of its own.
    Words with no duration (nothing the model can spell) stay with their neighbours."""
    if max_segment_ms <= 0:
        raise ValueError(f"max_segment_ms must be > 0; got {max_segment_ms}")
    segments: list[list[int]] = []
    current: list[int] = []
    for i, word in enumerate(words):
        if current and _stretch_between(words[current[-1]].end_ms, word.start_ms, untranscribed):
            segments.append(current)
            current = []
        current.append(i)
        while len(current) > 1 and words[current[-1]].end_ms - words[current[0]].start_ms > max_segment_ms:
            cut = _best_cut(words, current, max_segment_ms)
            segments.append(current[: cut + 1])
            current = current[cut + 1 :]
    if current:
        segments.append(current)
    return [_segment(words, indices, duration_ms, untranscribed) for indices in segments]


def _stretch_between(end_ms: int, start_ms: int, untranscribed: list[tuple[int, int]]) -> bool:
    return any(end_ms <= first and last <= start_ms for first, last in untranscribed)


def _best_cut(words: list[TimedUnit], indices: list[int], max_segment_ms: int) -> int:
    """Position in ``indices`` after which to cut: the longest pause among those that leave a first
    part of at least half the maximum and at most the maximum (the latest on ties); any pause if none does."""
    start = words[indices[0]].start_ms
    candidates = (
        [
            k
            for k in range(len(indices) - 1)
            if max_segment_ms // 2 <= words[indices[k]].end_ms - start <= max_segment_ms
        ]
        or [k for k in range(len(indices) - 1) if words[indices[k]].end_ms - start <= max_segment_ms]
        or [0]
    )

    def pause(k: int) -> int:
        return words[indices[k + 1]].start_ms - words[indices[k]].end_ms

    longest = max(pause(k) for k in candidates)
    return max(k for k in candidates if pause(k) == longest)


def _segment(
    words: list[TimedUnit], indices: list[int], duration_ms: int, untranscribed: list[tuple[int, int]]
) -> TimedUnit:
    """The words' span, padded into the pauses around it, never into an untranscribed stretch."""
    first, last = words[indices[0]], words[indices[-1]]
    before = words[indices[0] - 1].end_ms if indices[0] > 0 else 0
    after = words[indices[-1] + 1].start_ms if indices[-1] + 1 < len(words) else duration_ms
    before = max([before] + [end for start, end in untranscribed if end <= first.start_ms])
    after = min([after] + [start for start, end in untranscribed if start >= last.end_ms])
    start = max(before + (first.start_ms - before) // 2, first.start_ms - EDGE_PAD_MS, 0)
    end = min(last.end_ms + (after - last.end_ms) // 2, last.end_ms + EDGE_PAD_MS, duration_ms)
    return TimedUnit(" ".join(words[i].text for i in indices), start, max(end, start))
