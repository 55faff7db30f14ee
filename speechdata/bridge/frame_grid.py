"""The 12.5 Hz frame grid: which text token owns each 80 ms Mimi frame (docs/bridge-tuples.md).

Inputs per utterance: the transcript, its aligned words (one per whitespace-separated word, times in
integer ms relative to the utterance's own audio), the text tokenizer's tokens with character
offsets, and the number of 24 kHz samples. Output: ``tokens [T]``, ``grid [F]`` (token index per
frame, -1 = SILENCE) and ``dur [T]`` (frames owned by each token, possibly 0), all int32.

All grid arithmetic is integer: frame ``k`` covers samples ``[1920k, 1920(k+1))`` and its center is
at ``80k + 40`` ms; a token ``[s, e)`` owns frame ``k`` when ``s <= 80k + 40 < e``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speechdata.alignment.table import TimedUnit
from speechdata.audio.clock import FRAME_CENTER_MS, FRAME_MS, SAMPLES_PER_FRAME, n_frames_for

SILENCE = -1

GRID_RULE_VERSION = "1"
"""Bump when the rule that gives tokens their spans or frames their owner changes: ``frame_grids``
carries it in its code version, so every grid built under the old rule shows as stale."""

_WORD = re.compile(r"\S+")


class GridError(ValueError):
    """The inputs cannot give a grid (e.g. the aligned words do not match the transcript's words)."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class FrameGrid:
    tokens: np.ndarray
    """int32 [T]: text-token ids of the transcript (no special tokens)."""
    grid: np.ndarray
    """int32 [F]: index into ``tokens`` of the token owning each frame, or -1 (SILENCE)."""
    dur: np.ndarray
    """int32 [T]: frames owned by each token; 0 for a token shorter than the gap between frame centers."""
    spans_ms: np.ndarray
    """int32 [T, 2]: each token's ``[start_ms, end_ms)`` after rounding."""

    @property
    def n_frames(self) -> int:
        return int(self.grid.shape[0])

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def silence_frames(self) -> int:
        return int(np.count_nonzero(self.grid == SILENCE))

    @property
    def zero_duration_tokens(self) -> int:
        return int(np.count_nonzero(self.dur == 0))


def round_half_up_ms(ms: float) -> int:
    return int(math.floor(ms + 0.5 + 1e-9))


def word_char_spans(text: str) -> list[tuple[int, int]]:
    """``[a_i, b_i)`` of each maximal non-whitespace run of ``text``."""
    return [(m.start(), m.end()) for m in _WORD.finditer(text)]


def token_spans_ms(text: str, words: Sequence[TimedUnit], offsets: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each token's ``[start_ms, end_ms)``, from the aligned words through character offsets.

    Follows docs/bridge-tuples.md, steps 1-5: characters map linearly into their word's time span; a
    whitespace-only token gets a zero-length span at the start of the next word; ``k`` consecutive
    tokens with the same character span split its time equally; times round half up to integer ms.
    """
    char_spans = word_char_spans(text)
    if len(char_spans) != len(words):
        raise GridError(
            "word_count_mismatch",
            f"transcript has {len(char_spans)} words, alignment has {len(words)}",
        )
    word_of_char = np.full(len(text) + 1, -1, dtype=np.int64)
    for i, (a, b) in enumerate(char_spans):
        word_of_char[a:b] = i

    def char_time(position: int, word: int) -> float:
        """Time of character boundary ``position`` inside word ``word`` (a <= position <= b)."""
        a, b = char_spans[word]
        unit = words[word]
        return unit.start_ms + (position - a) / (b - a) * (unit.end_ms - unit.start_ms)

    # Character span (non-whitespace part) of every token; None for whitespace-only tokens.
    token_chars: list[tuple[int, int] | None] = []
    for start, end in offsets:
        inside = [c for c in range(start, min(end, len(text))) if word_of_char[c] >= 0]
        token_chars.append((inside[0], inside[-1]) if inside else None)

    spans: list[tuple[float, float]] = []
    for index, chars in enumerate(token_chars):
        if chars is None:
            next_word = _next_word_at_or_after(char_spans, offsets[index][1])
            if next_word is not None:
                at = float(words[next_word].start_ms)
            elif words:
                at = float(words[-1].end_ms)
            else:
                at = 0.0
            spans.append((at, at))
            continue
        first, last = chars
        spans.append((char_time(first, int(word_of_char[first])), char_time(last + 1, int(word_of_char[last]))))

    _split_shared_spans(token_chars, spans)
    rounded: list[tuple[int, int]] = []
    previous_end = 0
    for start, end in spans:
        start_ms, end_ms = round_half_up_ms(start), round_half_up_ms(end)
        # Offsets of byte-level pieces can overlap by a character; spans must not (one owner per frame).
        start_ms = max(start_ms, previous_end)
        end_ms = max(end_ms, start_ms)
        rounded.append((start_ms, end_ms))
        previous_end = end_ms
    return rounded


def _next_word_at_or_after(char_spans: list[tuple[int, int]], position: int) -> int | None:
    for i, (a, _) in enumerate(char_spans):
        if a >= position:
            return i
    return None


def _split_shared_spans(token_chars: list[tuple[int, int] | None], spans: list[tuple[float, float]]) -> None:
    """Runs of consecutive tokens with the same character span share its time in equal parts."""
    i = 0
    while i < len(token_chars):
        j = i + 1
        while j < len(token_chars) and token_chars[i] is not None and token_chars[j] == token_chars[i]:
            j += 1
        k = j - i
        if k > 1:
            start, end = spans[i]
            step = (end - start) / k
            for n in range(k):
                spans[i + n] = (start + n * step, start + (n + 1) * step)
        i = j


def frame_grid_from_spans(token_ids: Sequence[int], spans_ms: Sequence[tuple[int, int]], n_samples: int) -> FrameGrid:
    """Quantize token spans to frames by the frame-center rule, in integer milliseconds."""
    n_frames = n_frames_for(n_samples)
    grid = np.full(n_frames, SILENCE, dtype=np.int32)
    dur = np.zeros(len(token_ids), dtype=np.int32)
    for index, (start_ms, end_ms) in enumerate(spans_ms):
        # First k with 80k + 40 >= s, and first k with 80k + 40 >= e: ceil((x - 40) / 80).
        first = max(0, -((FRAME_CENTER_MS - start_ms) // FRAME_MS))
        stop = min(n_frames, max(0, -((FRAME_CENTER_MS - end_ms) // FRAME_MS)))
        if stop > first:
            grid[first:stop] = index
            dur[index] = stop - first
    return FrameGrid(
        tokens=np.asarray(token_ids, dtype=np.int32),
        grid=grid,
        dur=dur,
        spans_ms=np.asarray(spans_ms, dtype=np.int32).reshape(-1, 2),
    )


def build_frame_grid(
    text: str,
    words: Sequence[TimedUnit],
    token_ids: Sequence[int],
    offsets: Sequence[tuple[int, int]],
    n_samples: int,
) -> FrameGrid:
    """The whole rule: token spans from words and offsets, then the frame-center quantization."""
    if not text.strip():
        raise GridError("empty_transcript", "the transcript has no words")
    if len(token_ids) != len(offsets):
        raise GridError("tokenizer_mismatch", f"{len(token_ids)} token ids but {len(offsets)} offsets")
    return frame_grid_from_spans(token_ids, token_spans_ms(text, words, offsets), n_samples)


def check_grid_invariants(grid: FrameGrid, n_samples: int) -> list[str]:
    """Broken invariants, as sentences (empty when the grid is sound)."""
    problems = []
    if grid.n_frames != n_frames_for(n_samples):
        problems.append(f"F={grid.n_frames} but ceil({n_samples}/{SAMPLES_PER_FRAME})={n_frames_for(n_samples)}")
    if int(grid.dur.sum()) + grid.silence_frames != grid.n_frames:
        problems.append(f"sum(dur)={int(grid.dur.sum())} + silence={grid.silence_frames} != F={grid.n_frames}")
    owned = grid.grid[grid.grid != SILENCE]
    if owned.size and np.any(np.diff(owned) < 0):
        problems.append("grid token indices decrease")
    if owned.size and (owned.min() < 0 or owned.max() >= grid.n_tokens):
        problems.append("grid points outside the token range")
    counts = np.bincount(owned, minlength=grid.n_tokens) if grid.n_tokens else np.zeros(0, np.int64)
    if not np.array_equal(counts, grid.dur):
        problems.append("dur does not equal the number of frames each token owns")
    return problems
