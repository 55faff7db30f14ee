"""Find each new utterance's earliest copy among the utterances indexed before it.

Everything indexed is in one order: the corpus index's shards in the order they were indexed, each
shard's utterances in ``utt_id`` order, then the shard being checked, also in ``utt_id`` order. An
utterance is compared only with utterances before it in that order, so its representative (the
first-indexed copy) never depends on what lands later, and a shard checked again sees exactly what
it saw the first time.

Three signals, strongest first: the exact audio hash; the audio fingerprint (candidates from
sub-fingerprint lookup, voted by frame offset, then verified by the bit error rate over the aligned
overlap); the transcript's MinHash (candidates from LSH band keys, verified on the whole signature).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from speechdata.quality.fingerprint_audio import (
    AudioFingerprint,
    compare_at_offset,
    similarity_from_bit_error_rate,
)
from speechdata.quality.fingerprint_text import band_keys, estimated_jaccard

EXACT_AUDIO, NEAR_AUDIO, NEAR_TRANSCRIPT = "exact_audio", "near_audio", "near_transcript"
KINDS = (EXACT_AUDIO, NEAR_AUDIO, NEAR_TRANSCRIPT)
"""Strongest first: an utterance that matches on several signals is reported with the strongest."""

MAX_KEY_OCCURRENCES = 500
"""Sub-fingerprints seen more often than this in the index are too common to point at a copy
(steady tones, hum): they are left out of the lookup, as Haitsma and Kalker do."""
AUDIO_CANDIDATES_VERIFIED = 8
"""Candidates (by offset votes) whose bit error rate is measured, per utterance."""
OFFSET_SEARCH_FRAMES = 1
"""The voted offset is refined over +-1 frame: a trim between two hops votes for both."""
MAX_TRANSCRIPT_CANDIDATES = 64


@dataclass(frozen=True)
class NearDuplicateThresholds:
    """When two utterances are copies. Defaults measured on the planted set (docs/near-duplicates.md)."""

    max_bit_error_rate: float = 0.20
    """Near audio: at most this share of fingerprint bits differ over the aligned overlap (chance: 0.5)."""
    min_overlap_share: float = 0.8
    """Near audio: the aligned overlap covers at least this share of the shorter utterance's frames."""
    min_duration_ratio: float = 0.3
    """Near audio: the shorter is at least this share of the longer (a clip inside a long recording
    is containment, not a copy)."""
    min_offset_votes: int = 3
    """Near audio: sub-fingerprints that agree on one offset before a candidate is verified."""
    min_transcript_jaccard: float = 0.8
    """Near transcript: estimated Jaccard similarity of the normalized transcripts' character 5-grams."""
    min_transcript_words: int = 4
    """Near transcript: shorter transcripts ("yes", "thank you") are never duplicates by text alone."""
    check_transcripts: bool = True
    """False: only audio makes a duplicate."""


@dataclass(frozen=True)
class UtteranceSignals:
    """What the index keeps of one utterance. ``transcript_signature``: None for a transcript with
    fewer words than any threshold would compare (it is stored with its word count)."""

    shard_id: str
    utt_id: str
    exact_hash: str | None
    fingerprint: AudioFingerprint
    transcript_signature: np.ndarray | None
    transcript_words: int


@dataclass(frozen=True)
class Decision:
    """One utterance's verdict: ``kind`` None when it is the first of its kind (its own representative)."""

    utt_id: str
    representative_shard: str
    representative_utt: str
    kind: str | None
    similarity: float
    matched_shard: str | None = None
    matched_utt: str | None = None


def find_representatives(
    indexed: Sequence[tuple[UtteranceSignals, tuple[str, str]]],
    new: Sequence[UtteranceSignals],
    thresholds: NearDuplicateThresholds,
) -> list[Decision]:
    """A :class:`Decision` per ``new`` utterance (in its order) against ``indexed`` (in index order,
    each with its representative ``(shard, utt)``) and the ``new`` utterances before it."""
    everything = [signals for signals, _ in indexed] + list(new)
    representatives: list[tuple[str, str]] = [rep for _, rep in indexed]
    first = len(indexed)
    exact_first: dict[str, int] = {}
    for position, signals in enumerate(everything[:first]):
        if signals.exact_hash is not None:
            exact_first.setdefault(signals.exact_hash, position)
    audio = _AudioLookup(everything)
    text = _TranscriptLookup(everything, thresholds)
    decisions = []
    for position in range(first, len(everything)):
        signals = everything[position]
        match = _exact(signals, exact_first) or audio.match(position, thresholds) or text.match(position)
        if match is None:
            representative = (signals.shard_id, signals.utt_id)
            decisions.append(Decision(signals.utt_id, *representative, None, 1.0))
        else:
            kind, matched, similarity = match
            representative = representatives[matched]
            decisions.append(
                Decision(
                    signals.utt_id,
                    *representative,
                    kind,
                    round(similarity, 4),
                    everything[matched].shard_id,
                    everything[matched].utt_id,
                )
            )
        representatives.append(representative)
        if signals.exact_hash is not None:
            exact_first.setdefault(signals.exact_hash, position)
    return decisions


def _exact(signals: UtteranceSignals, exact_first: dict[str, int]) -> tuple[str, int, float] | None:
    if signals.exact_hash is None or signals.exact_hash not in exact_first:
        return None
    return EXACT_AUDIO, exact_first[signals.exact_hash], 1.0


class _AudioLookup:
    """Every active sub-fingerprint of the index, sorted, with the utterance and frame it comes from."""

    def __init__(self, everything: Sequence[UtteranceSignals]):
        self.fingerprints = [signals.fingerprint for signals in everything]
        keys, owners, frames = [], [], []
        for position, fingerprint in enumerate(self.fingerprints):
            active = np.flatnonzero(fingerprint.active)
            keys.append(fingerprint.sub_fingerprints[active])
            owners.append(np.full(len(active), position, np.int64))
            frames.append(active.astype(np.int64))
        keys_all = np.concatenate(keys) if keys else np.zeros(0, np.uint32)
        order = np.argsort(keys_all, kind="stable")
        self.keys = keys_all[order]
        self.owners = (np.concatenate(owners) if owners else np.zeros(0, np.int64))[order]
        self.frames = (np.concatenate(frames) if frames else np.zeros(0, np.int64))[order]

    def match(self, position: int, thresholds: NearDuplicateThresholds) -> tuple[str, int, float] | None:
        query = self.fingerprints[position]
        query_frames = np.flatnonzero(query.active)
        if len(query_frames) == 0 or len(self.keys) == 0:
            return None
        query_keys = query.sub_fingerprints[query_frames]
        starts = np.searchsorted(self.keys, query_keys, side="left")
        ends = np.searchsorted(self.keys, query_keys, side="right")
        counts = ends - starts
        usable = (counts > 0) & (counts <= MAX_KEY_OCCURRENCES)
        if not usable.any():
            return None
        starts, counts, query_frames = starts[usable], counts[usable], query_frames[usable]
        hits = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        owners = self.owners[hits]
        offsets = self.frames[hits] - np.repeat(query_frames, counts)
        earlier = owners < position
        if not earlier.any():
            return None
        return near_audio_match(query, owners[earlier], offsets[earlier], self.fingerprints.__getitem__, thresholds)


def near_audio_match(
    query: AudioFingerprint,
    owners: np.ndarray,
    offsets: np.ndarray,
    fingerprint_of: Callable[[int], AudioFingerprint],
    thresholds: NearDuplicateThresholds,
) -> tuple[str, int, float] | None:
    """The ``near_audio`` match of ``query`` from its lookup hits: one ``(owner, frame offset)`` per
    usable sub-fingerprint occurrence of an earlier utterance (``owners`` before the query in the
    order). Shared by the incremental lookup and the whole-corpus batch pass, so both decide alike."""
    if len(owners) == 0:
        return None
    pairs, votes = np.unique(np.stack([owners, offsets], axis=1), axis=0, return_counts=True)
    best = _best_offset_per_owner(pairs, votes, thresholds.min_offset_votes)
    accepted = []
    for owner, offset in best[:AUDIO_CANDIDATES_VERIFIED]:
        verdict = verify_near_audio(query, fingerprint_of(int(owner)), int(offset), thresholds)
        if verdict is not None:
            accepted.append((int(owner), verdict))
    if not accepted:
        return None
    owner, bit_error_rate = min(accepted, key=lambda item: (item[0], item[1]))
    return NEAR_AUDIO, owner, similarity_from_bit_error_rate(bit_error_rate)


def verify_near_audio(
    query: AudioFingerprint, reference: AudioFingerprint, offset: int, thresholds: NearDuplicateThresholds
) -> float | None:
    """The bit error rate of ``query`` against ``reference`` at ``offset`` (+-1 frame) when it makes a copy, else None."""
    shorter, longer = sorted((query.frames, reference.frames))
    if shorter == 0 or shorter < thresholds.min_duration_ratio * longer:
        return None
    comparisons = [
        compare_at_offset(query, reference, offset + shift)
        for shift in range(-OFFSET_SEARCH_FRAMES, OFFSET_SEARCH_FRAMES + 1)
    ]
    best = min(comparisons, key=lambda comparison: comparison.bit_error_rate)
    if best.overlap_frames < thresholds.min_overlap_share * shorter or best.compared_frames == 0:
        return None
    return best.bit_error_rate if best.bit_error_rate <= thresholds.max_bit_error_rate else None


def _best_offset_per_owner(pairs: np.ndarray, votes: np.ndarray, min_votes: int) -> list[tuple[int, int]]:
    """``(owner, offset)`` with the most votes per owner, most voted first, at least ``min_votes``."""
    by_votes = np.lexsort((pairs[:, 0], -votes))
    seen: set[int] = set()
    best = []
    for index in by_votes:
        if votes[index] < min_votes:
            break
        owner = int(pairs[index, 0])
        if owner not in seen:
            seen.add(owner)
            best.append((owner, int(pairs[index, 1])))
    return best


class _TranscriptLookup:
    """LSH band keys of every comparable transcript of the index, sorted, with their utterance."""

    def __init__(self, everything: Sequence[UtteranceSignals], thresholds: NearDuplicateThresholds):
        self.everything = everything
        self.thresholds = thresholds
        comparable = [
            position
            for position, signals in enumerate(everything)
            if thresholds.check_transcripts
            and signals.transcript_signature is not None
            and signals.transcript_words >= thresholds.min_transcript_words
        ]
        self.comparable = set(comparable)
        if comparable:
            signatures = np.stack([everything[position].transcript_signature for position in comparable])
            keys = band_keys(signatures)
            owners = np.repeat(np.asarray(comparable, np.int64), keys.shape[1])
            flat = keys.reshape(-1)
            order = np.argsort(flat, kind="stable")
            self.keys, self.owners = flat[order], owners[order]
            self.keys_by_position = dict(zip(comparable, keys, strict=True))
        else:
            self.keys, self.owners, self.keys_by_position = np.zeros(0, np.uint64), np.zeros(0, np.int64), {}

    def match(self, position: int) -> tuple[str, int, float] | None:
        if position not in self.comparable:
            return None
        query_keys = self.keys_by_position[position]
        starts = np.searchsorted(self.keys, query_keys, side="left")
        ends = np.searchsorted(self.keys, query_keys, side="right")
        candidates = set()
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            candidates.update(owner for owner in self.owners[start:end].tolist() if owner < position)
        return near_transcript_match(
            self.everything[position].transcript_signature,
            candidates,
            lambda owner: self.everything[owner].transcript_signature,
            self.thresholds,
        )


def near_transcript_match(
    query: np.ndarray,
    candidates: Iterable[int],
    signature_of: Callable[[int], np.ndarray],
    thresholds: NearDuplicateThresholds,
) -> tuple[str, int, float] | None:
    """The ``near_transcript`` match of a comparable transcript's signature among ``candidates``
    (earlier comparable utterances sharing an LSH band key): the most similar of the first
    :data:`MAX_TRANSCRIPT_CANDIDATES` in the order. Shared by the incremental lookup and the batch pass."""
    best = None
    for owner in sorted(set(candidates))[:MAX_TRANSCRIPT_CANDIDATES]:
        similarity = estimated_jaccard(query, signature_of(owner))
        if similarity >= thresholds.min_transcript_jaccard and (best is None or similarity > best[1]):
            best = (owner, similarity)
    return None if best is None else (NEAR_TRANSCRIPT, best[0], best[1])
