"""Word and token time spans of an utterance from CTC log-probs and its transcript.

The Viterbi path (:mod:`speechdata.alignment.viterbi`) assigns every frame to a target token or a
blank; a token spans from its first to one past its last frame (NeMo Forced Aligner's rule), and a
word from its first token's start to its last token's end. Times are integer ms.

The Viterbi keeps one back-pointer byte per frame and state (``T x (2L + 1)``), so its memory grows
with the product of the utterance's frames and its target tokens: a 2-hour utterance with a
17 000-word transcript would need ~16 GB. An utterance past ``max_frame_tokens`` (frames x tokens,
:data:`MAX_ALIGNMENT_FRAME_TOKENS` by default) is rejected as ``too_long_to_align`` before any
memory is spent on it (docs/reliability.md says why it is rejected rather than aligned in windows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speechdata.alignment.table import TimedUnit
from speechdata.alignment.transcript_units import CharVocabulary, SubwordVocabulary, ctc_targets
from speechdata.alignment.viterbi import AlignmentImpossible, ctc_viterbi

MAX_ALIGNMENT_FRAME_TOKENS = 250_000_000
"""Default limit on frames x target tokens: ~500 MB of back-pointers with the numba kernel (two bytes
per frame-token; the numpy fallback also gathers ``[T, U]`` float32 emissions, ~2 GB). About 30 min of
speech at 80 ms frames and 11 characters a second; an utterance past it is ``too_long_to_align``."""


def alignment_size_problem(num_frames: int, num_tokens: int, max_frame_tokens: int) -> str | None:
    """Why ``num_frames x num_tokens`` is too large to align within ``max_frame_tokens``, or None."""
    size = num_frames * num_tokens
    if size > max_frame_tokens:
        return (
            f"{num_frames} frames x {num_tokens} tokens = {size} frame-tokens exceeds the limit of "
            f"{max_frame_tokens} (max_frame_tokens, the Viterbi's memory bound)"
        )
    return None


def expected_frames(duration_s: float, frame_s: float) -> int:
    """The CTC frames a model with ``frame_s`` frames gives for ``duration_s`` of audio (rounded up)."""
    return int(-(-duration_s // frame_s))


@dataclass(frozen=True)
class UtteranceAlignment:
    words: list[TimedUnit]
    tokens: list[TimedUnit]
    score: float
    """Mean log-prob per frame on the Viterbi path (higher is a more confident alignment)."""
    n_frames: int


def shifted_token_spans_ms(
    spans: list[tuple[int, int]], frame_ms: int, duration_ms: int, offsets_ms: tuple[int, int] = (0, 0)
) -> list[tuple[int, int]]:
    """Each token's (start, end) in ms from its Viterbi frames ``[first, last)``, moved by the model's
    emission ``offsets_ms`` (start, end) and kept inside the audio, in order and without overlap: a
    token never ends after the next one starts, nor before it starts itself."""
    start_offset, end_offset = offsets_ms
    starts = [min(max(first * frame_ms + start_offset, 0), duration_ms) for first, _ in spans]
    ends = [min(max(last * frame_ms + end_offset, 0), duration_ms) for _, last in spans]
    for k in range(len(spans)):
        if k + 1 < len(spans):
            ends[k] = min(ends[k], starts[k + 1])
        ends[k] = max(ends[k], starts[k])
    return list(zip(starts, ends, strict=True))


class AlignmentRejected(ValueError):
    def __init__(self, reason: str, detail: str):
        self.reason = reason
        super().__init__(f"{reason}: {detail}")


def align_transcript(
    log_probs: np.ndarray,
    text: str | None,
    vocabulary: CharVocabulary | SubwordVocabulary,
    frame_ms: int,
    duration_ms: int,
    max_frame_tokens: int = MAX_ALIGNMENT_FRAME_TOKENS,
    language: str | None = None,
    emission_offsets_ms: tuple[int, int] = (0, 0),
) -> UtteranceAlignment:
    """Force-align ``text`` to ``log_probs [T, V]``; raise :class:`AlignmentRejected` with a reason code.

    ``too_long_to_align`` when ``T x L`` exceeds ``max_frame_tokens``. ``language`` picks how
    numbers and symbols are spoken (:func:`~speechdata.alignment.transcript_units.ctc_targets`); each
    written word spans from its spoken form's first token to its last. ``emission_offsets_ms`` (the
    model's calibrated emission delay, :func:`shifted_token_spans_ms`) moves every token's start and end."""
    targets = ctc_targets(text or "", vocabulary, language)
    if not targets.words:
        raise AlignmentRejected("empty_transcript", "the transcript has no words")
    if not targets.targets:
        raise AlignmentRejected(
            "text_not_in_vocabulary", f"nothing in {text[:80]!r} can be expressed in the model's vocabulary"
        )
    too_long = alignment_size_problem(int(log_probs.shape[0]), len(targets.targets), max_frame_tokens)
    if too_long is not None:
        raise AlignmentRejected("too_long_to_align", too_long)
    try:
        path = ctc_viterbi(log_probs, targets.targets, vocabulary.blank_id)
    except AlignmentImpossible as exc:
        raise AlignmentRejected("audio_too_short_for_text", str(exc)) from exc

    spans = path.token_frame_spans()
    frame_scores = path.frame_log_probs

    times = shifted_token_spans_ms(spans, frame_ms, duration_ms, emission_offsets_ms)
    tokens = [
        TimedUnit(
            targets.token_texts[k],
            start_ms,
            end_ms,
            float(frame_scores[first:last].mean()) if last > first else None,
        )
        for k, ((first, last), (start_ms, end_ms)) in enumerate(zip(spans, times, strict=True))
    ]
    words: list[TimedUnit] = []
    previous_end = 0
    for word, (first, last) in zip(targets.words, targets.word_target_ranges, strict=True):
        if last > first:
            unit = TimedUnit(
                word,
                tokens[first].start_ms,
                tokens[last - 1].end_ms,
                float(frame_scores[spans[first][0] : spans[last - 1][1]].mean()),
            )
        else:
            unit = TimedUnit(word, previous_end, previous_end, None)
        words.append(unit)
        previous_end = unit.end_ms
    return UtteranceAlignment(words, tokens, path.score, path.num_frames)
