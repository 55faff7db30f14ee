"""Each new utterance's candidates, gathered before :func:`~.near_dup_matching.decide_shard` decides:
the earlier postings of its keys (and the shard's own before it) looked up once per shard, then per
utterance the owners its exact key, sampled audio keys (voted by (owner, offset)), transcript band keys
and envelope band-pair keys name (module docstring of :mod:`.near_dup_matching`), and what
:data:`~.near_dup_matching.MAX_KEY_OCCURRENCES` kept out of the audio vote (:class:`AudioKeyLoad`).

The vote's limits are read from :mod:`.near_dup_matching` at each call, where they are declared (and
where a test or a benchmark sets them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from speechdata.quality import near_dup_matching
from speechdata.quality.near_dup_matching import CandidateSource, NearDuplicateThresholds, UtteranceSignals


@dataclass
class _Query:
    """One new utterance's candidates, gathered before any decision is made, and what the cap kept
    out of its audio vote (:class:`AudioKeyLoad`)."""

    exact: list[int]
    audio: list[int]
    transcript: list[int]
    envelope: list[int]
    audio_keys: int = 0
    audio_keys_met: int = 0
    audio_keys_past_cap: int = 0


@dataclass
class AudioKeyLoad:
    """How much of a shard's audio lookup :data:`~.near_dup_matching.MAX_KEY_OCCURRENCES` kept out of
    the vote, counted by :func:`~.near_dup_matching.decide_shard`. The cap is fixed while every key's
    chance postings grow with the corpus, so these figures grow with it; past a share of keys, copies
    found only by their audio (clips, compound and trimmed copies, which keep 2-3 exact keys) stop
    being found (docs/deploying.md, "Near duplicates past N hours")."""

    utterances: int = 0
    """New utterances with at least one sampled audio key."""
    keys: int = 0
    """Sampled audio keys looked up (one per sampled frame of each new utterance)."""
    keys_met: int = 0
    """Of those, keys with at least one posting of an utterance before theirs."""
    keys_past_cap: int = 0
    """Of those, keys with more than :data:`~.near_dup_matching.MAX_KEY_OCCURRENCES` such postings:
    they never voted."""
    utterances_silenced: int = 0
    """Utterances whose every key that met an earlier posting was past the cap (at least one met
    one): no audio key of theirs voted, so an earlier copy could be found by no audio key."""

    def add(self, query: _Query) -> None:
        self.utterances += query.audio_keys > 0
        self.keys += query.audio_keys
        self.keys_met += query.audio_keys_met
        self.keys_past_cap += query.audio_keys_past_cap
        self.utterances_silenced += query.audio_keys_met > 0 and query.audio_keys_met == query.audio_keys_past_cap

    @property
    def share_past_cap(self) -> float:
        """Of the sampled audio keys looked up, the share past the cap (0 when none was looked up)."""
        return self.keys_past_cap / self.keys if self.keys else 0.0


def _chunk_candidates(
    position: int,
    new: Sequence[UtteranceSignals],
    first: int,
    end: int,
    own: np.ndarray,
    audio_only: np.ndarray,
    earlier: CandidateSource,
    thresholds: NearDuplicateThresholds,
    budget: int | None,
) -> tuple[list[_Query], int] | None:
    """The :class:`_Query` of ``new[first:end]``, from the earlier postings of their keys and the
    shard's own, and how many earlier postings those were; None when the lookup passed ``budget`` (a
    single utterance is never refused: it holds its own keys' postings, whatever they are)."""
    from speechdata.quality.near_dup_postings import merged_fields, owner_of, sorted_unique

    if first == 0 and end == len(new):
        keys = sorted_unique(own["key"])
    else:
        owners = own["owner"]
        keys = sorted_unique(own["key"][(owners >= owner_of(position, first)) & (owners < owner_of(position, end))])
    looked_up = earlier.postings(keys, audio_only, limit=budget if end - first > 1 else None)
    if looked_up is None:
        return None
    if len(looked_up) and int(looked_up["owner"].max()) >= owner_of(position, 0):
        raise ValueError(f"the candidate source named an utterance at or after index position {position}")
    held = len(looked_up)
    columns = _PostingColumns.of(merged_fields(looked_up, own))
    del looked_up  # the merged columns hold them
    queries = [_candidates(position, rank, new[rank], columns, thresholds) for rank in range(first, end)]
    return queries, held


@dataclass(frozen=True)
class _PostingColumns:
    """The postings a shard decides against (sorted by key), one contiguous array per field, made
    once per shard: an utterance's lookups gather only the fields they use from them, where gathering
    whole 28-byte records and then a strided field of them cost about 0.5 us a posting read. Its
    keys are searched among the distinct ones (``distinct``; the postings of ``distinct[i]`` are
    ``[starts[i], starts[i + 1])``), a table a twentieth the size of the postings on speech."""

    owner: np.ndarray
    frame: np.ndarray
    context: np.ndarray
    distinct: np.ndarray
    starts: np.ndarray

    @classmethod
    def of(cls, postings: np.ndarray | dict[str, np.ndarray]) -> _PostingColumns:
        """The columns of ``postings`` (sorted by key): a structured array, or its fields
        (:func:`~.near_dup_postings.merged_fields`)."""
        keys = np.ascontiguousarray(postings["key"])
        new_key = np.ones(len(keys), bool)
        new_key[1:] = keys[1:] != keys[:-1]
        starts = np.flatnonzero(new_key)
        return cls(
            *(np.ascontiguousarray(postings[name]) for name in ("owner", "frame", "context")),
            distinct=keys[starts],
            starts=np.append(starts, len(keys)),
        )


def _key_postings(columns: _PostingColumns, keys: np.ndarray, before: int) -> tuple[np.ndarray, np.ndarray]:
    """``(index into keys, index into the postings)`` pairs for every posting of ``keys`` owned
    before ``before``, by key in ``keys`` order then in the postings' order."""
    if len(columns.distinct) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    # Searched in ascending order (each search starts from the last one's place), put back after.
    ascending = np.argsort(keys, kind="stable")
    at = np.empty(len(keys), np.int64)
    at[ascending] = np.searchsorted(columns.distinct, keys[ascending])
    present = at < len(columns.distinct)
    present[present] = columns.distinct[at[present]] == keys[present]
    at[~present] = 0
    starts = columns.starts[at]
    counts = np.where(present, columns.starts[at + 1] - starts, 0)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    which = np.repeat(np.arange(len(keys)), counts)
    hits = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)
    earlier = columns.owner[hits] < before
    return which[earlier], hits[earlier]


def _candidates(
    position: int,
    rank: int,
    signals: UtteranceSignals,
    columns: _PostingColumns,
    thresholds: NearDuplicateThresholds,
) -> _Query:
    from speechdata.quality.near_dup_postings import (
        context_bit_errors,
        envelope_keys,
        exact_key,
        neighbour_contexts,
        owner_of,
        sampled_audio_keys,
        span_of_context,
        transcript_keys,
    )
    from speechdata.quality.near_dup_verification import _tempo_rules_out

    me = owner_of(position, rank)
    exact: list[int] = []
    if signals.exact_hash is not None:
        _, found = _key_postings(columns, np.array([exact_key(signals.exact_hash)], np.uint64), me)
        exact = sorted(set(columns.owner[found].tolist()))
    audio: list[int] = []
    keys_met = keys_past_cap = 0
    keys, frames = sampled_audio_keys(signals.fingerprint.sub_fingerprints, signals.fingerprint.active)
    if len(keys):
        which, found = _key_postings(columns, keys, me)
        if len(found):
            per_key = np.bincount(which, minlength=len(keys))
            keys_met = int(np.count_nonzero(per_key))
            keys_past_cap = int(np.count_nonzero(per_key > near_dup_matching.MAX_KEY_OCCURRENCES))
            contexts = neighbour_contexts(signals.fingerprint.sub_fingerprints, frames)
            # The cap first: a key past it never votes, so its postings' contexts are never compared.
            voting = np.flatnonzero(per_key[which] <= near_dup_matching.MAX_KEY_OCCURRENCES)
            which, found = which[voting], found[voting]
            alike = (
                context_bit_errors(contexts[which], columns.context[found]) <= near_dup_matching.MAX_CONTEXT_BIT_ERRORS
            )
            which, found = which[alike], found[alike]
            owners = columns.owner[found]
            offsets = columns.frame[found].astype(np.int64) - frames[which]
            if len(owners):
                pairs, votes = _pair_votes(owners, offsets)
                best = _best_offset_per_owner(pairs, votes, 1)
                audio = [owner for owner, _ in best[: near_dup_matching.AUDIO_CANDIDATES_FETCHED]]
    transcript: list[int] = []
    if (
        thresholds.check_transcripts
        and signals.transcript_signature is not None
        and signals.transcript_words >= thresholds.min_transcript_words
    ):
        _, found = _key_postings(columns, transcript_keys(signals.transcript_signature), me)
        comparable = columns.owner[found][columns.frame[found] >= thresholds.min_transcript_words]
        transcript = sorted(set(comparable.tolist()))[: near_dup_matching.MAX_TRANSCRIPT_CANDIDATES]
    envelope: list[int] = []
    if signals.shift is not None:
        _, found = _key_postings(columns, envelope_keys(signals.shift.envelope), me)
        if len(found):
            found_owners = columns.owner[found]
            owners, hits = _value_counts(found_owners)
            shared = hits >= near_dup_matching.MIN_SHARED_ENVELOPE_PAIRS
            owners, hits = owners[shared], hits[shared]
            # most shared pairs (so bands) first, the earliest on a tie
            chosen = np.lexsort((owners, -hits))[: near_dup_matching.ENVELOPE_CANDIDATES]
            # A candidate whose speech span (its postings' context: its first one's) the tempo rule
            # rules out is never fetched: _shifted_match would pass over it. Chosen first, so the others stay.
            first = _first_places(found_owners, owners[chosen])
            spans = [span_of_context(int(context)) for context in columns.context[found[first]].tolist()]
            envelope = [
                owner
                for owner, span in zip(owners[chosen].tolist(), spans, strict=True)
                if span is None or not _tempo_rules_out(signals.shift.span_s, span, thresholds)
            ]
    return _Query(exact, audio, transcript, envelope, len(keys), keys_met, keys_past_cap)


def _value_counts(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_counts=True)`` by one sort: the envelope's chance postings, tens
    of thousands an utterance at 10^5 hours, counted by owner for each new utterance."""
    ordered = np.sort(values)
    new_value = np.ones(len(ordered), bool)
    new_value[1:] = ordered[1:] != ordered[:-1]
    starts = np.flatnonzero(new_value)
    return ordered[starts], np.diff(np.append(starts, len(ordered)))


def _first_places(values: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The index of each of ``wanted``'s first occurrence in ``values`` (each one occurs): found among
    the occurrences of ``wanted`` only, a few of ``values``."""
    places = np.flatnonzero(np.isin(values, wanted))
    distinct, first = np.unique(values[places], return_index=True)
    return places[first[np.searchsorted(distinct, wanted)]]


def _pair_votes(first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(np.stack([first, second], axis=1), axis=0, return_counts=True)`` of two int64
    arrays: the distinct pairs in ascending (first, second) order and how often each occurs. One
    two-key sort: ``np.unique(axis=0)`` sorts the rows as a structured view, several times slower."""
    order = np.lexsort((second, first))
    first, second = first[order], second[order]
    new_pair = np.ones(len(first), bool)
    new_pair[1:] = (first[1:] != first[:-1]) | (second[1:] != second[:-1])
    starts = np.flatnonzero(new_pair)
    return np.stack([first[starts], second[starts]], axis=1), np.diff(np.append(starts, len(first)))


def _best_offset_per_owner(pairs: np.ndarray, votes: np.ndarray, min_votes: int) -> list[tuple[int, int]]:
    """``(owner, offset)`` with the most votes per owner, most voted first (then the smallest owner),
    at least ``min_votes``; of an owner's offsets tied on votes, the first in ``pairs``' order (the
    smallest, ``pairs`` ascending as :func:`_pair_votes` gives them)."""
    by_votes = np.lexsort((pairs[:, 0], -votes))
    by_votes = by_votes[votes[by_votes] >= min_votes]
    # Each owner's first place in that order (a stable sort keeps the first of equal owners).
    _, first = np.unique(pairs[by_votes, 0], return_index=True)
    chosen = by_votes[np.sort(first)]
    return list(zip(pairs[chosen, 0].tolist(), pairs[chosen, 1].tolist(), strict=True))
