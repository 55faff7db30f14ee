"""Verification of each new utterance's candidates (:mod:`.near_dup_candidates`), strongest signal
first: the exact hash, the audio fingerprint's bit error rate at the voted offset (a copy, a clip, or
an utterance that contains an earlier one), the loudness envelope and spectral shape (tempo and pitch
copies), then the transcript's MinHash with the speakers' embeddings. :func:`_decide_one` gives
:func:`~.near_dup_matching.decide_shard` the strongest match of one utterance.

The limits are read from :mod:`.near_dup_matching` at each call, where they are declared.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from speechdata.quality import near_dup_matching
from speechdata.quality.fingerprint_audio import AudioFingerprint, compare_at_offset, similarity_from_bit_error_rate
from speechdata.quality.fingerprint_envelope import envelope_correlation, shape_correlation
from speechdata.quality.fingerprint_text import estimated_jaccard
from speechdata.quality.near_dup_candidates import _pair_votes, _Query
from speechdata.quality.near_dup_matching import (
    _STRENGTH,
    CONTAINED_AUDIO,
    CONTAINS_EARLIER,
    EXACT_AUDIO,
    FRAME_SECONDS,
    KINDS,
    NEAR_AUDIO,
    NEAR_TRANSCRIPT,
    OTHER_SPEAKER_READING,
    SHIFTED_AUDIO,
    IndexEntry,
    NearDuplicateThresholds,
    UtteranceSignals,
)
from speechdata.quality.speakers import speaker_cosine


def _decide_one(
    signals: UtteranceSignals, query: _Query, known: dict[int, IndexEntry], thresholds: NearDuplicateThresholds
) -> tuple[str, int, float] | None:
    """The strongest match: a duplicate (:data:`~.near_dup_matching.KINDS`) before a flag
    (:data:`~.near_dup_matching.FLAG_KINDS`)."""
    for owner in query.exact:
        if known[owner][0].exact_hash == signals.exact_hash:
            return EXACT_AUDIO, owner, 1.0
    audio = _audio_match(signals.fingerprint, query.audio, known, thresholds)
    if audio is not None and audio[0] in KINDS:
        return audio
    shifted = _shifted_match(signals, query.envelope, known, thresholds)
    if shifted is not None:
        return shifted
    same_speaker, other_speaker = _transcript_matches(signals, query.transcript, known, thresholds)
    if same_speaker is not None:
        return NEAR_TRANSCRIPT, same_speaker[0], same_speaker[1]
    if audio is not None:
        return audio
    if other_speaker is not None:
        return OTHER_SPEAKER_READING, other_speaker[0], other_speaker[1]
    return None


def _shifted_match(
    signals: UtteranceSignals, candidates: list[int], known: dict[int, IndexEntry], thresholds: NearDuplicateThresholds
) -> tuple[str, int, float] | None:
    """The earliest candidate whose envelope and spectral shape correlate with this one's (at least
    ``min_envelope_correlation`` and ``min_shape_correlation``) over a speech span at most
    ``max_tempo_change`` times longer or shorter."""
    mine = signals.shift
    if mine is None:
        return None
    for owner in sorted(candidates):
        other = known[owner][0].shift
        if other is None:
            continue
        if _tempo_rules_out(mine.span_s, other.span_s, thresholds):
            continue
        if envelope_correlation(mine.envelope, other.envelope) < thresholds.min_envelope_correlation:
            continue
        shape = shape_correlation(mine.spectral_shape, other.spectral_shape)
        if shape >= thresholds.min_shape_correlation:
            return SHIFTED_AUDIO, owner, shape
    return None


def _tempo_rules_out(first_span_s: float, second_span_s: float, thresholds: NearDuplicateThresholds) -> bool:
    """No shifted copy of each other: a span not positive, or one more than ``max_tempo_change``
    times the other."""
    shorter, longer = sorted((first_span_s, second_span_s))
    return shorter <= 0 or longer > thresholds.max_tempo_change * shorter


def _transcript_matches(
    signals: UtteranceSignals, candidates: list[int], known: dict[int, IndexEntry], thresholds: NearDuplicateThresholds
) -> tuple[tuple[int, float] | None, tuple[int, float] | None]:
    """The most alike earlier transcript read by the same speaker, and by another: ``(owner, similarity)`` each."""
    same_speaker = other_speaker = None
    for owner in candidates:
        other = known[owner][0]
        if other.transcript_signature is None or other.transcript_words < thresholds.min_transcript_words:
            continue
        similarity = estimated_jaccard(signals.transcript_signature, other.transcript_signature)
        if similarity < thresholds.min_transcript_jaccard:
            continue
        voices = speaker_cosine(signals.speaker_embedding, other.speaker_embedding)
        if voices is None or voices >= thresholds.same_speaker_min_cosine:
            if same_speaker is None or similarity > same_speaker[1]:
                same_speaker = (owner, similarity)
        elif other_speaker is None or similarity > other_speaker[1]:
            other_speaker = (owner, similarity)
    return same_speaker, other_speaker


def _full_votes(query: AudioFingerprint, references: Sequence[AudioFingerprint]) -> list[tuple[int, int]]:
    """``(votes, offset)`` per reference: the offset most active sub-fingerprints of the two agree on
    (the smallest on a tie), and how many agree there; ``(0, 0)`` when none does. All references in
    one sort, one lookup."""
    result = [(0, 0)] * len(references)
    query_frames = np.flatnonzero(query.active)
    if len(query_frames) == 0 or not references:
        return result
    values, frames, which = [], [], []
    for number, reference in enumerate(references):
        active = np.flatnonzero(reference.active)
        values.append(reference.sub_fingerprints[active])
        frames.append(active)
        which.append(np.full(len(active), number, np.int64))
    all_values = np.concatenate(values)
    order = np.argsort(all_values, kind="stable")
    all_values, all_frames, all_which = all_values[order], np.concatenate(frames)[order], np.concatenate(which)[order]
    query_values = query.sub_fingerprints[query_frames]
    starts = np.searchsorted(all_values, query_values, side="left")
    counts = np.searchsorted(all_values, query_values, side="right") - starts
    if counts.sum() == 0:
        return result
    hits = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
    offsets = all_frames[hits].astype(np.int64) - np.repeat(query_frames, counts)
    pairs, votes = _pair_votes(all_which[hits], offsets)
    # Pairs come sorted by (reference, offset): a stable sort by votes, most first, keeps the
    # smallest offset first among a reference's ties.
    by_votes = np.argsort(-votes, kind="stable")
    seen: set[int] = set()
    for index in by_votes.tolist():
        number = int(pairs[index, 0])
        if number not in seen:
            seen.add(number)
            result[number] = (int(votes[index]), int(pairs[index, 1]))
    return result


def _audio_match(
    query: AudioFingerprint, candidates: list[int], known: dict[int, IndexEntry], thresholds: NearDuplicateThresholds
) -> tuple[str, int, float] | None:
    voted = []
    full = _full_votes(query, [known[owner][0].fingerprint for owner in candidates])
    for owner, (votes, offset) in zip(candidates, full, strict=True):
        if votes >= thresholds.min_offset_votes:
            voted.append((-votes, owner, offset))
    accepted = []
    for _, owner, offset in sorted(voted)[: near_dup_matching.AUDIO_CANDIDATES_VERIFIED]:
        verdict = _verify(query, known[owner][0].fingerprint, offset, thresholds)
        if verdict is not None:
            accepted.append((_STRENGTH[verdict[0]], owner, verdict[1], verdict[0]))
    if not accepted:
        return None
    _, owner, bit_error_rate, kind = min(accepted)
    return kind, owner, similarity_from_bit_error_rate(bit_error_rate)


def _verify(
    query: AudioFingerprint, reference: AudioFingerprint, offset: int, thresholds: NearDuplicateThresholds
) -> tuple[str, float] | None:
    """``(kind, bit error rate)`` of ``query`` against an earlier ``reference`` at ``offset`` (+-1
    frame), None when they are no copies. Which one holds the other is told by *active* frames
    (speech), so silence padding is never new speech: the overlap holds at least
    ``min_overlap_share`` of the query's active frames (nothing new in the query: ``near_audio`` when
    it holds at least ``min_duration_ratio`` of the reference's, a trimmed copy; ``contained_audio``
    when less, a clip) with at most ``max_new_speech_seconds`` of the query's outside it, or only of
    the reference's (the query holds the reference plus new speech: ``contains_earlier``, kept)."""
    if query.frames == 0 or reference.frames == 0:
        return None
    best = None
    for shift in range(-near_dup_matching.OFFSET_SEARCH_FRAMES, near_dup_matching.OFFSET_SEARCH_FRAMES + 1):
        comparison = compare_at_offset(query, reference, offset + shift)
        if best is None or comparison.bit_error_rate < best[0].bit_error_rate:
            best = (comparison, offset + shift)
    comparison, at = best
    if comparison.compared_frames == 0 or comparison.bit_error_rate > thresholds.max_bit_error_rate:
        return None
    start, end = max(0, -at), min(query.frames, reference.frames - at)
    query_active, reference_active = int(query.active.sum()), int(reference.active.sum())
    query_inside = int(query.active[start:end].sum())
    reference_inside = int(reference.active[start + at : end + at].sum())
    new_speech_s = (query_active - query_inside) * FRAME_SECONDS
    query_covered = (
        query_inside >= thresholds.min_overlap_share * query_active
        and new_speech_s <= thresholds.max_new_speech_seconds
    )
    reference_covered = reference_inside >= thresholds.min_overlap_share * reference_active
    least_contained = thresholds.min_contained_seconds / FRAME_SECONDS
    if query_covered:
        if query_active >= thresholds.min_duration_ratio * reference_active:
            return NEAR_AUDIO, comparison.bit_error_rate
        if query_active >= least_contained:
            return CONTAINED_AUDIO, comparison.bit_error_rate
        return None
    if reference_covered and reference_active >= least_contained:
        return CONTAINS_EARLIER, comparison.bit_error_rate
    return None
