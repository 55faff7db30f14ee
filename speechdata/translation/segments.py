"""Streaming translation segments: LLM chunks placed on forced-aligned word times.

Three steps per utterance and latency level:

1. **Chunk-to-word matching, monotonic.** Chunks and aligned words are normalized (case folded,
   punctuation and symbols removed; see :func:`normalize_key`). A chunk matches the *next unused run*
   of aligned words whose normalized text, concatenated, equals the chunk's: first at the cursor,
   else after skipping up to ``max_skip_words`` words the LLM left out (a filler, a false start).
   Concatenating rather than comparing word lists makes "well-known" match "well known". When no run
   matches, the chunk's tokens are matched one by one to whole words in order inside the same window
   (``partial``: an LLM that rewrote "2" as "two" still gets "apples" placed). A chunk with no match
   has no times (``none``). The cursor only moves forward, so a repeated word lands on its right
   occurrence; the original translation script's "any word that matches" would give every "the" the
   first "the"'s time. The window grows by the tokens of chunks left unmatched since the last match,
   so one chunk the transcript does not contain cannot strand the rest of the utterance.
2. **Conservative emission timeline.** A chunk is emitted at second ``S`` (a multiple of ``step``)
   when it has fully finished: ``end <= S + step``, i.e. at the first such ``S``. Emission keeps chunk
   order (a chunk is never emitted before the one it follows). An unmatched chunk is emitted with the
   next matched chunk (by then it has been spoken too); unmatched chunks after the last matched one
   are emitted at the second in which the last aligned word ends.
3. **Bilingual segments.** Per emitted second, the English chunks are joined with spaces and the
   Chinese chunks concatenated without spaces. Seconds in which nothing is emitted give no segment;
   each segment carries its ``emit_ms`` so the waits are recoverable.

All times are integer milliseconds from the start of the utterance's own audio (the alignments
table's convention).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

from speechdata.alignment.table import TimedUnit
from speechdata.translation.segmentation_input import LevelChunks, Segmentation

DEFAULT_STEP_MS = 1000
DEFAULT_MAX_SKIP_WORDS = 8

_NOT_WORD = re.compile(r"[^\w\s]+|_+")
_NOT_KEY = re.compile(r"[^\w]+|_+")


def normalize_tokens(text: str) -> list[str]:
    """Case-folded whitespace tokens of ``text`` with punctuation and symbols removed."""
    return _NOT_WORD.sub("", text.casefold()).split()


def normalize_key(text: str) -> str:
    """The matching key: :func:`normalize_tokens` concatenated without spaces."""
    return _NOT_KEY.sub("", text.casefold())


class ChunkTiming(NamedTuple):
    """Where a chunk was found: word indices ``[first_word, last_word]`` (inclusive) and its span in ms.

    ``match`` is ``exact`` (at the cursor), ``skip`` (after skipping words), ``partial`` (some
    tokens placed one by one) or ``none`` (no times: ``start_ms``/``end_ms`` are None).
    """

    chunk: str
    start_ms: int | None
    end_ms: int | None
    first_word: int | None
    last_word: int | None
    match: str

    @property
    def matched(self) -> bool:
        return self.end_ms is not None


class WordStream:
    """The aligned words of one utterance prepared for matching (built once, shared by all levels).

    ``keys`` are the words' normalized texts; words that normalize to nothing (a lone dash) are
    left out of matching but keep their index. ``text`` is the keys concatenated and ``offsets[j]``
    where key ``j`` starts in it, so a run of words is one ``startswith`` at a word boundary.
    """

    def __init__(self, words: list[TimedUnit]):
        self.words = words
        self.keys: list[str] = []
        self.index: list[int] = []
        for i, word in enumerate(words):
            key = normalize_key(word.text)
            if key:
                self.keys.append(key)
                self.index.append(i)
        self.text = "".join(self.keys)
        self.offsets = [0] * (len(self.keys) + 1)
        for j, key in enumerate(self.keys):
            self.offsets[j + 1] = self.offsets[j] + len(key)
        self.key_at_offset = {offset: j for j, offset in enumerate(self.offsets)}
        self.final_ms = max((w.end_ms for w in words), default=0)

    def run_at(self, start: int, target: str) -> int | None:
        """End (exclusive) of the run of keys from ``start`` that concatenates to ``target``."""
        offset = self.offsets[start]
        if not self.text.startswith(target, offset):
            return None
        return self.key_at_offset.get(offset + len(target))

    def timing(self, chunk: str, first: int, last: int, match: str) -> ChunkTiming:
        a, b = self.index[first], self.index[last]
        return ChunkTiming(chunk, self.words[a].start_ms, self.words[b].end_ms, a, b, match)


def match_chunks(
    chunks: list[str] | tuple[str, ...],
    words: list[TimedUnit] | WordStream,
    max_skip_words: int = DEFAULT_MAX_SKIP_WORDS,
) -> list[ChunkTiming]:
    """Place every chunk on the aligned ``words`` (module docstring, step 1), in chunk order."""
    stream = words if isinstance(words, WordStream) else WordStream(words)
    n_keys = len(stream.keys)
    cursor = 0
    pending_tokens = 0  # tokens of chunks left unmatched since the last match
    timings: list[ChunkTiming] = []
    for chunk in chunks:
        target = normalize_key(chunk)
        window_end = min(n_keys, cursor + max_skip_words + pending_tokens + 1)
        found = None
        if target:
            for start in range(cursor, window_end):
                end = stream.run_at(start, target)
                if end is not None:
                    found = (start, end)
                    break
        if found is not None:
            start, end = found
            timings.append(stream.timing(chunk, start, end - 1, "exact" if start == cursor else "skip"))
            cursor, pending_tokens = end, 0
            continue
        tokens = normalize_tokens(chunk)
        placed = _place_tokens(tokens, stream.keys, cursor, window_end + len(tokens))
        if placed:
            timings.append(stream.timing(chunk, placed[0], placed[-1], "partial"))
            cursor, pending_tokens = placed[-1] + 1, 0
        else:
            timings.append(ChunkTiming(chunk, None, None, None, None, "none"))
            pending_tokens += max(len(tokens), 1)
    return timings


def _place_tokens(tokens: list[str], keys: list[str], cursor: int, window_end: int) -> list[int]:
    """Key indices of the tokens that equal a whole word, matched in order within the window."""
    placed: list[int] = []
    position = cursor
    limit = min(window_end, len(keys))
    for token in tokens:
        for j in range(position, limit):
            if keys[j] == token:
                placed.append(j)
                position = j + 1
                break
    return placed


def emission_step(end_ms: int, step_ms: int) -> int:
    """The first step ``k`` with ``end_ms <= k * step_ms + step_ms`` (k >= 0)."""
    return max(0, -(-end_ms // step_ms) - 1)


def emission_steps(timings: list[ChunkTiming], step_ms: int, final_ms: int) -> list[int]:
    """The step at which each chunk is emitted (module docstring, step 2); non-decreasing."""
    steps: list[int | None] = [None] * len(timings)
    previous = 0
    for i, timing in enumerate(timings):
        end_ms = timing.end_ms
        if end_ms is not None:
            step = -(-end_ms // step_ms) - 1  # emission_step, inlined: this loop runs per chunk
            if step > previous:
                previous = step
            steps[i] = previous
    following = max(previous, emission_step(final_ms, step_ms))
    for i in range(len(timings) - 1, -1, -1):  # an unmatched chunk waits for the next matched one
        if steps[i] is None:
            steps[i] = following
        following = steps[i]
    return steps  # type: ignore[return-value]


class Segment(NamedTuple):
    """What is emitted at ``emit_ms``: chunks ``[first_chunk, last_chunk]`` in both languages."""

    emit_ms: int
    source: str
    target: str
    first_chunk: int
    last_chunk: int
    n_unmatched: int


@dataclass(frozen=True)
class LevelSegments:
    """One latency level of one utterance: chunk timings, their emission steps, and the segments."""

    level: str
    timings: list[ChunkTiming]
    translations: tuple[str, ...]
    steps: list[int]
    segments: list[Segment]

    @property
    def n_unmatched(self) -> int:
        return sum(not t.matched for t in self.timings)


def join_source(chunks: list[str]) -> str:
    """English chunks joined with single spaces (the original script's rule for the source side)."""
    return " ".join(" ".join(chunks).split())


def join_target(chunks: list[str] | tuple[str, ...]) -> str:
    """Chinese chunks concatenated without spaces (Chinese is written without them)."""
    return "".join(c.strip() for c in chunks)


def build_segments(
    timings: list[ChunkTiming], translations: tuple[str, ...], steps: list[int], step_ms: int
) -> list[Segment]:
    """Group consecutive chunks by emission step into bilingual segments (module docstring, step 3)."""
    segments: list[Segment] = []
    n = len(timings)
    i = 0
    while i < n:
        step = steps[i]
        j = i + 1
        while j < n and steps[j] == step:
            j += 1
        group = timings[i:j]
        segments.append(
            Segment(
                step * step_ms,
                join_source([t.chunk for t in group]),
                join_target(translations[i:j]),
                i,
                j - 1,
                sum(t.end_ms is None for t in group),
            )
        )
        i = j
    return segments


def level_segments(
    level: str,
    chunks: LevelChunks,
    words: list[TimedUnit] | WordStream,
    step_ms: int = DEFAULT_STEP_MS,
    max_skip_words: int = DEFAULT_MAX_SKIP_WORDS,
) -> LevelSegments:
    """Match, time and segment one latency level of one utterance."""
    if step_ms <= 0:
        raise ValueError(f"step_ms must be positive, got {step_ms}")
    stream = words if isinstance(words, WordStream) else WordStream(words)
    timings = match_chunks(chunks.english, stream, max_skip_words)
    steps = emission_steps(timings, step_ms, stream.final_ms)
    return LevelSegments(level, timings, chunks.chinese, steps, build_segments(timings, chunks.chinese, steps, step_ms))


def utterance_segments(
    segmentation: Segmentation,
    words: list[TimedUnit],
    step_ms: int = DEFAULT_STEP_MS,
    max_skip_words: int = DEFAULT_MAX_SKIP_WORDS,
) -> dict[str, LevelSegments]:
    """Every latency level of one utterance, in :data:`~speechdata.translation.segmentation_input.LATENCY_LEVELS` order."""
    stream = WordStream(words)
    return {
        level: level_segments(level, chunks, stream, step_ms, max_skip_words)
        for level, chunks in segmentation.levels.items()
    }


def _seconds(ms: int | None) -> float | None:
    return None if ms is None else ms / 1000.0


def utterance_document(utt_id: str, text: str, levels: dict[str, LevelSegments], step_ms: int) -> dict:
    """The original script's per-utterance JSON (``utt_id``, ``original_text``, ``source_<level>``,
    ``target_<level>``), plus ``emit_s_<level>`` (when each segment is emitted, parallel to the
    segment lists) and ``chunks_<level>`` (each chunk's translation, start/end in seconds or null,
    emission second and match kind)."""
    document: dict = {"utt_id": utt_id, "original_text": text, "step_s": step_ms / 1000.0}
    for level, result in levels.items():
        document[f"source_{level}"] = [s.source for s in result.segments]
        document[f"target_{level}"] = [s.target for s in result.segments]
        document[f"emit_s_{level}"] = [s.emit_ms / 1000.0 for s in result.segments]
        document[f"chunks_{level}"] = [
            {
                "chunk": t.chunk,
                "translation": zh,
                "start": _seconds(t.start_ms),
                "end": _seconds(t.end_ms),
                "emit_s": step * step_ms / 1000.0,
                "match": t.match,
            }
            for t, zh, step in zip(result.timings, result.translations, result.steps, strict=True)
        ]
    return document
