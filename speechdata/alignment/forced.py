"""Word and token time spans of an utterance from CTC log-probs and its transcript.

The Viterbi path (:mod:`speechdata.alignment.viterbi`) assigns every frame to a target token or a
blank; a token spans from its first to one past its last frame (NeMo Forced Aligner's rule), and a
word from its first token's start to its last token's end. Times are integer ms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from speechdata.alignment.table import TimedUnit
from speechdata.alignment.transcript_units import CharVocabulary, SubwordVocabulary, ctc_targets
from speechdata.alignment.viterbi import AlignmentImpossible, ctc_viterbi


@dataclass(frozen=True)
class UtteranceAlignment:
    words: list[TimedUnit]
    tokens: list[TimedUnit]
    score: float
    """Mean log-prob per frame on the Viterbi path (higher is a more confident alignment)."""
    n_frames: int


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
) -> UtteranceAlignment:
    """Force-align ``text`` to ``log_probs [T, V]``; raise :class:`AlignmentRejected` with a reason code."""
    targets = ctc_targets(text or "", vocabulary)
    if not targets.words:
        raise AlignmentRejected("empty_transcript", "the transcript has no words")
    if not targets.targets:
        raise AlignmentRejected(
            "text_not_in_vocabulary", f"nothing in {text[:80]!r} can be expressed in the model's vocabulary"
        )
    try:
        path = ctc_viterbi(log_probs, targets.targets, vocabulary.blank_id)
    except AlignmentImpossible as exc:
        raise AlignmentRejected("audio_too_short_for_text", str(exc)) from exc

    spans = path.token_frame_spans()
    frame_scores = path.frame_log_probs

    def clamp(ms: int) -> int:
        return min(ms, duration_ms)

    tokens = [
        TimedUnit(
            targets.token_texts[k],
            clamp(first * frame_ms),
            clamp(last * frame_ms),
            float(frame_scores[first:last].mean()) if last > first else None,
        )
        for k, (first, last) in enumerate(spans)
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
