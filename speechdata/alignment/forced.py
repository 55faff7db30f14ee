"""Word and token time spans of an utterance from CTC log-probs and its transcript.

The Viterbi path (:mod:`speechdata.alignment.viterbi`) assigns every frame to a target token or a
blank; a token spans from its first to one past its last frame (NeMo Forced Aligner's rule), and a
word from its first token's start to its last token's end. Times are integer ms.

Two Viterbi kernels give the same path (state for state): the whole-matrix one
(:mod:`speechdata.alignment.viterbi`, NeMo's recurrence) keeps one back-pointer byte per frame and
state (``T x (2L + 1)``), so a 2-hour utterance with a 17 000-word transcript would need ~16 GB; the
checkpointed one (:mod:`speechdata.alignment.long_form`) keeps ``~4 sqrt(T)`` bytes per state instead
(tens of MB for the same utterance) and takes about as long. An utterance up to
``whole_matrix_frame_tokens`` (frames x tokens) is aligned with the first, a longer one with the
second. ``max_frame_tokens`` (:data:`MAX_ALIGNMENT_FRAME_TOKENS`) only stops pathological input: an
utterance past it is rejected as ``too_long_to_align`` before any memory is spent on it.

With a :class:`WildcardSettings`, stretches of audio the transcript does not cover (music, an intro)
are explained by a wildcard at the word boundaries its ``placement`` allows, so the words around them
keep their timing; the stretches are returned (:attr:`UtteranceAlignment.untranscribed`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from speechdata.alignment.long_form import DEFAULT_WILDCARD_PENALTY, ctc_viterbi_checkpointed, wildcard_stretches
from speechdata.alignment.table import TimedUnit
from speechdata.alignment.transcript_units import CharVocabulary, CtcTargets, SubwordVocabulary, ctc_targets
from speechdata.alignment.viterbi import AlignmentImpossible, ViterbiPath, ctc_viterbi

WHOLE_MATRIX_FRAME_TOKENS = 50_000_000
"""Frames x target tokens up to which the whole-matrix Viterbi runs (~100 MB of back-pointers, about
6 minutes of speech at 80 ms frames and 11 characters a second); past it the checkpointed one."""

MAX_ALIGNMENT_FRAME_TOKENS = 25_000_000_000
"""Limit on frames x target tokens, for pathological input only: 2 hours at 80 ms frames with a
17 280-word character transcript is ~9e9. At the limit the checkpointed Viterbi needs at most ~0.5 GB
(its memory is ``~8 sqrt(T) L`` bytes and ``L <= T``) and a few minutes of one core (the compute
grows with ``T x L``); an utterance past it is ``too_long_to_align``."""

WILDCARD_PLACEMENTS = ("words", "sentences", "edges")
"""Where the wildcard may explain frames: at every word boundary (``words``), only after a word that
ends a sentence (``sentences``: ``.``, ``!``, ``?``, ``…`` and their CJK forms), or only before the first
and after the last word (``edges``); the start and the end of the utterance are always allowed."""

_SENTENCE_END = re.compile(r"[.!?…。！？][\"')\]»”’]*$")
"""A word ending a sentence: its last mark, then perhaps closing quotes or brackets."""


SEPARATOR_POLICIES = ("required", "optional")
"""How a vocabulary's word separator (the small model's ``|``, a character model's space) is aligned:
``required``, a target between every two words, as the model was trained; or ``optional``, no target,
the separator's probability added to the blank's so any blank frame may be it. Each vocabulary
says which it takes (``separator_policy``; :mod:`speechdata.alignment.transcript_units` says why)."""


def separator_as_blank(log_probs: np.ndarray, targets: CtcTargets, separator_id: int, blank_id: int):
    """``(log_probs, targets)`` with the separator folded into the blank: its targets dropped (word
    ranges kept on the same tokens) and the blank's column ``logaddexp(blank, separator)``."""
    kept = [k for k, token in enumerate(targets.targets) if token != separator_id]
    new_index = {old: new for new, old in enumerate(kept)}

    def remapped(first: int, last: int) -> tuple[int, int]:
        inside = [new_index[k] for k in range(first, last) if k in new_index]
        if not inside:
            start = sum(1 for k in kept if k < first)
            return start, start
        return inside[0], inside[-1] + 1

    folded = np.array(log_probs, copy=True)
    folded[:, blank_id] = np.logaddexp(folded[:, blank_id], folded[:, separator_id])
    return folded, CtcTargets(
        targets.words,
        [targets.targets[k] for k in kept],
        [remapped(first, last) for first, last in targets.word_target_ranges],
        [targets.token_texts[k] for k in kept],
    )


@dataclass(frozen=True)
class WildcardSettings:
    """The wildcard for stretches the transcript does not cover (:mod:`speechdata.alignment.long_form`)."""

    placement: str = "words"
    """One of :data:`WILDCARD_PLACEMENTS`."""
    penalty: float = DEFAULT_WILDCARD_PENALTY
    """Nats per frame the wildcard costs below the frame's best log-prob."""
    min_stretch_s: float = 1.0
    """Shorter runs of wildcard frames (a pause between words) are not reported as stretches."""

    def __post_init__(self):
        if self.placement not in WILDCARD_PLACEMENTS:
            raise ValueError(f"wildcard placement must be one of {WILDCARD_PLACEMENTS}; got {self.placement!r}")


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
    untranscribed: list[tuple[int, int]] = field(default_factory=list)
    """``(start_ms, end_ms)`` of each stretch the wildcard explained (at least ``min_stretch_s`` long)."""


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
    *,
    wildcard: WildcardSettings | None = None,
    whole_matrix_frame_tokens: int = WHOLE_MATRIX_FRAME_TOKENS,
    emission_offsets_ms: tuple[int, int] = (0, 0),
    separator_policy: str | None = None,
) -> UtteranceAlignment:
    """Force-align ``text`` to ``log_probs [T, V]``; raise :class:`AlignmentRejected` with a reason code.

    ``too_long_to_align`` when ``T x L`` exceeds ``max_frame_tokens``. ``language`` picks how
    numbers and symbols are spoken (:func:`~speechdata.alignment.transcript_units.ctc_targets`); each
    written word spans from its spoken form's first token to its last. ``emission_offsets_ms`` (the
    model's calibrated emission delay, :func:`shifted_token_spans_ms`) moves every token's start and end.
    ``separator_policy`` (:data:`SEPARATOR_POLICIES`; None: the vocabulary's own) says whether word
    separators are targets. Past ``whole_matrix_frame_tokens``
    (or with a ``wildcard``) the checkpointed Viterbi runs: the same path in bounded memory."""
    separator_policy = separator_policy or vocabulary.separator_policy
    if separator_policy not in SEPARATOR_POLICIES:
        raise ValueError(f"separator_policy {separator_policy!r} is not one of {SEPARATOR_POLICIES}")
    targets = ctc_targets(text or "", vocabulary, language)
    if not targets.words:
        raise AlignmentRejected("empty_transcript", "the transcript has no words")
    if separator_policy == "optional" and vocabulary.separator_id is not None:
        log_probs, targets = separator_as_blank(log_probs, targets, vocabulary.separator_id, vocabulary.blank_id)
    if not targets.targets:
        raise AlignmentRejected(
            "text_not_in_vocabulary", f"nothing in {text[:80]!r} can be expressed in the model's vocabulary"
        )
    too_long = alignment_size_problem(int(log_probs.shape[0]), len(targets.targets), max_frame_tokens)
    if too_long is not None:
        raise AlignmentRejected("too_long_to_align", too_long)
    try:
        path = best_path(log_probs, targets, vocabulary.blank_id, wildcard, whole_matrix_frame_tokens)
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
    untranscribed = []
    if wildcard is not None:
        min_frames = max(1, math.ceil(wildcard.min_stretch_s * 1000 / frame_ms - 1e-9))
        word_frames = [
            (spans[first][0], spans[last - 1][1]) for first, last in targets.word_target_ranges if last > first
        ]
        untranscribed = [
            (min(first * frame_ms, duration_ms), min(last * frame_ms, duration_ms))
            for first, last in _merged_stretches(wildcard_stretches(path.wildcard_frames), word_frames)
            if last - first >= min_frames
        ]
    return UtteranceAlignment(words, tokens, path.score, path.num_frames, untranscribed)


def best_path(
    log_probs: np.ndarray,
    targets: CtcTargets,
    blank: int,
    wildcard: WildcardSettings | None = None,
    whole_matrix_frame_tokens: int = WHOLE_MATRIX_FRAME_TOKENS,
) -> ViterbiPath:
    """The Viterbi path: whole-matrix while small and without a wildcard, else checkpointed (same path)."""
    if wildcard is None and int(log_probs.shape[0]) * len(targets.targets) <= whole_matrix_frame_tokens:
        return ctc_viterbi(log_probs, targets.targets, blank)
    gaps = None if wildcard is None else wildcard_positions(targets, wildcard.placement)
    penalty = DEFAULT_WILDCARD_PENALTY if wildcard is None else wildcard.penalty
    return ctc_viterbi_checkpointed(log_probs, targets.targets, blank, wildcard_gaps=gaps, wildcard_penalty=penalty)


def _merged_stretches(stretches: list[tuple[int, int]], word_frames: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Runs of wildcard frames joined where no word lies between them (only a blank or a separator
    frame the model happened to favour inside the same uncovered stretch)."""
    word_starts = np.array([first for first, _ in word_frames], dtype=np.int64)
    merged: list[tuple[int, int]] = []
    for first, last in stretches:
        if merged:
            # a word starting in [previous end, this start) separates the two
            between = np.searchsorted(word_starts, first) - np.searchsorted(word_starts, merged[-1][1])
            if between == 0:
                merged[-1] = (merged[-1][0], last)
                continue
        merged.append((first, last))
    return merged


def wildcard_positions(targets: CtcTargets, placement: str) -> list[int]:
    """The blanks (``k``: the blank before target ``k``; ``L`` is the last) where the wildcard may go.

    A boundary between two words covers every blank from the first word's last token to the next
    word's first (for character models, both sides of the separator); a word with no tokens does not
    split a boundary, but its sentence end counts."""
    num_targets = len(targets.targets)
    positions = {0, num_targets}
    spoken = [(i, first, last) for i, (first, last) in enumerate(targets.word_target_ranges) if last > first]
    for (i, _, last), (j, first, _) in zip(spoken, spoken[1:], strict=False):
        ends_sentence = any(_SENTENCE_END.search(targets.words[w]) for w in range(i, j))
        if placement == "words" or (placement == "sentences" and ends_sentence):
            positions.update(range(last, first + 1))
    if spoken:
        positions.update(range(0, spoken[0][1] + 1))
        positions.update(range(spoken[-1][2], num_targets + 1))
    return sorted(positions)
