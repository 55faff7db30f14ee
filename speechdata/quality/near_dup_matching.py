"""Find each new utterance's earliest copy among the utterances indexed before it.

Everything indexed is in one order: the corpus index's shards in the order they were indexed, each
shard's utterances in ``utt_id`` order, then the shard being checked, also in ``utt_id`` order. An
utterance is compared only with utterances before it in that order, so its representative (the
first-indexed copy) never depends on what lands later, and a shard checked again sees exactly what
it saw the first time.

Three signals, strongest first: the exact audio hash; the audio fingerprint; the transcript's
MinHash. Candidates come from the utterance's keys (:mod:`.near_dup_postings`) looked up in what is
before it (a :class:`CandidateSource`: the corpus index on the data root, or utterances in memory),
so a shard touches only the postings of its own keys and the utterances they name:

- exact audio: the utterances holding its exact-hash key, verified on the whole hash;
- near audio: each sampled key's postings vote for (utterance, frame offset); the
  :data:`AUDIO_CANDIDATES_FETCHED` best-voted utterances are fetched whole, voted again on every
  active sub-fingerprint, and the :data:`AUDIO_CANDIDATES_VERIFIED` best with at least
  ``min_offset_votes`` votes are verified by the bit error rate at their offset (+-1 frame);
- near transcript: the utterances sharing an LSH band key (and long enough to compare), earliest
  first, verified on the whole signature.

:func:`decide_shard` is the one decision procedure: the incremental stage, the batch pass and
:func:`find_representatives` (in memory) all call it, so they decide alike.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from speechdata.quality.fingerprint_audio import (
    FINGERPRINT_SAMPLE_RATE,
    HOP_SAMPLES,
    AudioFingerprint,
    compare_at_offset,
    similarity_from_bit_error_rate,
)
from speechdata.quality.fingerprint_envelope import ShiftSignature, envelope_correlation, shape_correlation
from speechdata.quality.fingerprint_text import estimated_jaccard
from speechdata.quality.speakers import SAME_SPEAKER_MIN_COSINE, speaker_cosine

EXACT_AUDIO, NEAR_AUDIO, NEAR_TRANSCRIPT = "exact_audio", "near_audio", "near_transcript"
CONTAINED_AUDIO = "contained_audio"
"""A clip whose speech lies inside an utterance indexed before it: a duplicate (nothing new in it)."""
SHIFTED_AUDIO = "shifted_audio"
"""The same recording played faster or slower (tempo) or shifted in pitch, within the documented
bounds: its loudness envelope over its speech matches (:mod:`.fingerprint_envelope`)."""
KINDS = (EXACT_AUDIO, NEAR_AUDIO, CONTAINED_AUDIO, SHIFTED_AUDIO, NEAR_TRANSCRIPT)
"""Duplicates, strongest first: an utterance that matches on several signals is reported with the strongest."""
CONTAINS_EARLIER = "contains_earlier"
"""An utterance that holds an earlier one plus new speech: kept (its new speech is never discarded
silently), flagged, naming the utterance it contains."""
OTHER_SPEAKER_READING = "other_speaker_reading"
"""The transcript of an earlier utterance read by another speaker (speaker embeddings less alike
than ``same_speaker_min_cosine``): kept by default, rejected where a product's policy says so."""
FLAG_KINDS = (CONTAINS_EARLIER, OTHER_SPEAKER_READING)
"""Matches that are not duplicates by themselves: listed in ``near_duplicate_flags.parquet``; the
utterance stays its own representative."""
_STRENGTH = {kind: rank for rank, kind in enumerate(KINDS + FLAG_KINDS)}

MAX_KEY_OCCURRENCES = 500
"""Sampled audio keys held by more than this many earlier utterances' frames are too common to point
at a copy (steady tones, hum): they are left out of the vote, as Haitsma and Kalker do."""
MAX_CONTEXT_BIT_ERRORS = 16
"""A sampled key's hit votes only when the two frames after it differ in at most this many of their
64 bits (chance: 32): chance hits, which grow with the corpus, are dropped before anything is fetched."""
AUDIO_CANDIDATES_FETCHED = 32
"""Candidates (by sampled-key votes at one offset) fetched whole and voted on every frame, per utterance."""
AUDIO_CANDIDATES_VERIFIED = 8
"""Candidates (by full offset votes) whose bit error rate is measured, per utterance."""
OFFSET_SEARCH_FRAMES = 1
"""The voted offset is refined over +-1 frame: a trim between two hops votes for both."""
MAX_TRANSCRIPT_CANDIDATES = 64
ENVELOPE_CANDIDATES = 16
"""Utterances sharing the most envelope band keys, fetched and verified per utterance."""
MIN_SHARED_ENVELOPE_BANDS = 3
"""Envelope band keys an earlier utterance must share before it is fetched. Measured on random
envelopes, per new utterance against 16 000 indexed: 40 share one band, 0.12 share two; three keep
the chance candidates (and the entries row groups they cost) flat as the corpus grows. A copy
(envelope correlation 0.96 and more) shares about 6 of the 24, three or more with probability 0.97."""
MIN_SHARED_ENVELOPE_PAIRS = MIN_SHARED_ENVELOPE_BANDS * (MIN_SHARED_ENVELOPE_BANDS - 1) // 2
"""The same rule on the band-pair keys the index holds: k shared bands are k (k - 1) / 2 shared pairs."""
FRAME_SECONDS = HOP_SAMPLES / FINGERPRINT_SAMPLE_RATE

POSTINGS_BUDGET_ENV = "SPEECHDATA_NEAR_DUP_POSTINGS_BUDGET_MB"
DEFAULT_POSTINGS_BUDGET_MB = 256.0
"""Earlier postings a shard's lookup holds at once before its candidates are gathered in chunks of
utterances (docs/near-duplicates.md, "Postings held"). 256 MiB is 9.6 M postings: every index
measured so far stays below it (uniform keys: ~29 000 postings a new shard at 1 000 h), read in one
lookup; past it the stage holds about three times the budget (the postings read, those counted, the
merged copy) above its ~300 MB, well under 2 GB."""


def postings_budget() -> int | None:
    """``SPEECHDATA_NEAR_DUP_POSTINGS_BUDGET_MB`` (a decimal number of MiB, default
    :data:`DEFAULT_POSTINGS_BUDGET_MB`) as a count of postings held at once, at least one; None when
    it is 0 (no budget: every key in one lookup, whatever it holds). Read at each call; anything but
    a number 0 or more: a ValueError naming the variable."""
    from speechdata.quality.near_dup_postings import POSTING_DTYPE

    value = os.environ.get(POSTINGS_BUDGET_ENV, "").strip()
    megabytes = DEFAULT_POSTINGS_BUDGET_MB
    if value:
        try:
            megabytes = float(value) if value.isascii() else math.nan
        except ValueError:
            megabytes = math.nan
        if not (math.isfinite(megabytes) and megabytes >= 0):
            raise ValueError(
                f"{POSTINGS_BUDGET_ENV}={value!r}: expected MiB of postings, a number 0 or more "
                f"(0: no budget; default {DEFAULT_POSTINGS_BUDGET_MB:g})"
            )
    if megabytes == 0:
        return None
    return max(1, int(megabytes * 2**20) // POSTING_DTYPE.itemsize)


@dataclass(frozen=True)
class NearDuplicateThresholds:
    """When two utterances are copies. Defaults measured on the planted set (docs/near-duplicates.md)."""

    max_bit_error_rate: float = 0.20
    """Near audio: at most this share of fingerprint bits differ over the aligned overlap (chance: 0.5)."""
    min_overlap_share: float = 0.8
    """Near audio: the aligned overlap covers at least this share of the shorter utterance's frames."""
    min_duration_ratio: float = 0.3
    """Near audio: a later utterance whose speech lies inside an earlier one is ``near_audio`` (a
    trimmed copy) when it holds at least this share of the earlier one's active frames, else
    ``contained_audio`` (a clip); both are duplicates. A later utterance that holds an earlier one
    plus new speech is ``contains_earlier``: kept."""
    max_new_speech_seconds: float = 0.5
    """Containment: a later utterance with more than this much active audio outside what it shares with
    an earlier one holds new speech: it is never a copy (``contains_earlier`` at most), whatever
    share of it the overlap covers."""
    min_contained_seconds: float = 1.0
    """Containment: the contained utterance holds at least this much active audio (a second of shared
    speech can be chance; a shorter clip is nobody's copy)."""
    min_offset_votes: int = 3
    """Near audio: sub-fingerprints that agree on one offset before a candidate is verified."""
    min_transcript_jaccard: float = 0.8
    """Near transcript: estimated Jaccard similarity of the normalized transcripts' character 5-grams."""
    min_transcript_words: int = 4
    """Near transcript: shorter transcripts ("yes", "thank you") are never duplicates by text alone."""
    check_transcripts: bool = True
    """False: only audio makes a duplicate."""
    min_envelope_correlation: float = 0.8
    """Shifted audio: least correlation of the two loudness envelopes over their speech (planted tempo
    and pitch copies: 0.94 at their tenth percentile; unrelated utterances: below 0.52)."""
    min_shape_correlation: float = 0.9
    """Shifted audio: least correlation of the two spectral shapes at their best shift of up to 3
    semitones (copies: 0.93-0.99; other voices reading the same sentence at the same pace: at most 0.80)."""
    max_tempo_change: float = 1.12
    """Shifted audio: the longer speech span is at most this many times the shorter (tempo +-10 %
    and a margin; a pitch shift keeps the duration)."""
    same_speaker_min_cosine: float = SAME_SPEAKER_MIN_COSINE
    """Near transcript: two readings of one transcript are by one speaker (a duplicate) when their
    speaker embeddings are at least this alike; less alike, the later one is an
    ``other_speaker_reading`` (kept by default). An utterance without an embedding (too short, or
    indexed before embeddings were stored) counts as the same speaker."""


@dataclass(frozen=True)
class UtteranceSignals:
    """What the index keeps of one utterance. ``transcript_signature``: None for an empty
    transcript (it is stored with its word count)."""

    shard_id: str
    utt_id: str
    exact_hash: str | None
    fingerprint: AudioFingerprint
    transcript_signature: np.ndarray | None
    transcript_words: int
    speaker_embedding: np.ndarray | None = None
    """float32 ``[256]`` L2-normalized (:mod:`speechdata.quality.speakers`); None when unknown."""
    shift: ShiftSignature | None = None
    """The loudness envelope and spectral shape over the speech span (:mod:`.fingerprint_envelope`),
    which tempo and pitch changes keep; None for a flat or short utterance."""


@dataclass(frozen=True)
class Decision:
    """One utterance's verdict: ``kind`` None when it is the first of its kind (its own representative).
    A flag (:data:`FLAG_KINDS`) keeps the utterance its own representative and names what it matched."""

    utt_id: str
    representative_shard: str
    representative_utt: str
    kind: str | None
    similarity: float
    matched_shard: str | None = None
    matched_utt: str | None = None


IndexEntry = tuple[UtteranceSignals, tuple[str, str]]
"""An indexed utterance and its representative (shard, utt_id)."""


class CandidateSource(Protocol):
    """What is indexed before the shard being decided."""

    def postings(
        self, keys: np.ndarray, audio_only: np.ndarray | None = None, limit: int | None = None
    ) -> np.ndarray | None:
        """The postings (:data:`~.near_dup_postings.POSTING_DTYPE`) of ``keys`` (sorted unique uint64)
        held by utterances before the shard, in any order. ``audio_only`` (sorted unique): keys the
        shard holds as sampled audio keys only (:func:`~.near_dup_postings.audio_only_keys`); of
        such a key a source may give any more than ``MAX_KEY_OCCURRENCES`` of its postings instead
        of all of them (it never votes either way). The postings of a key never depend on which
        other keys are looked up with it. ``limit``: None instead, once the lookup holds more than
        this many postings (it stops reading then)."""
        ...

    def entries(self, owners: Sequence[int]) -> dict[int, IndexEntry]:
        """The signals and representative of each owner (each one named by :meth:`postings`)."""
        ...


class MemorySource:
    """Indexed utterances held in memory, in index order (each shard's utterances together, in
    ``utt_id`` order): shard n of the sequence is at position n."""

    def __init__(self, indexed: Sequence[IndexEntry]):
        from speechdata.quality.near_dup_postings import index_keys, owner_of, sort_postings

        self._entries: dict[int, IndexEntry] = {}
        shards: list[list[IndexEntry]] = []
        for entry in indexed:
            if not shards or shards[-1][0][0].shard_id != entry[0].shard_id:
                shards.append([])
            shards[-1].append(entry)
        parts = []
        for position, shard in enumerate(shards):
            parts.append(index_keys([signals for signals, _ in shard], position))
            for rank, entry in enumerate(shard):
                self._entries[owner_of(position, rank)] = entry
        self.next_position = len(shards)
        self._postings = sort_postings(np.concatenate(parts)) if parts else None

    def postings(
        self, keys: np.ndarray, audio_only: np.ndarray | None = None, limit: int | None = None
    ) -> np.ndarray | None:
        from speechdata.quality.near_dup_postings import POSTING_DTYPE, postings_for

        if self._postings is None:
            return np.empty(0, POSTING_DTYPE)
        return within(postings_for(self._postings, keys), limit)

    def entries(self, owners: Sequence[int]) -> dict[int, IndexEntry]:
        return {owner: self._entries[owner] for owner in owners}


def within(postings: np.ndarray, limit: int | None) -> np.ndarray | None:
    """``postings``, or None when they are more than ``limit`` (a :class:`CandidateSource`'s lookup
    that holds them all already)."""
    return None if limit is not None and len(postings) > limit else postings


def find_representatives(
    indexed: Sequence[IndexEntry], new: Sequence[UtteranceSignals], thresholds: NearDuplicateThresholds
) -> list[Decision]:
    """A :class:`Decision` per ``new`` utterance (one shard, in ``utt_id`` order) against ``indexed``
    (in index order, each with its representative ``(shard, utt)``) and the ``new`` utterances before it."""
    source = MemorySource(indexed)
    return decide_shard(source.next_position, new, source, thresholds)


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
    """How much of a shard's audio lookup :data:`MAX_KEY_OCCURRENCES` kept out of the vote, counted
    by :func:`decide_shard`. The cap is fixed while every key's chance postings grow with the corpus,
    so these figures grow with it; past a share of keys, copies found only by their audio (clips,
    compound and trimmed copies, which keep 2-3 exact keys) stop being found (docs/deploying.md,
    "Near duplicates past N hours")."""

    utterances: int = 0
    """New utterances with at least one sampled audio key."""
    keys: int = 0
    """Sampled audio keys looked up (one per sampled frame of each new utterance)."""
    keys_met: int = 0
    """Of those, keys with at least one posting of an utterance before theirs."""
    keys_past_cap: int = 0
    """Of those, keys with more than :data:`MAX_KEY_OCCURRENCES` such postings: they never voted."""
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


_FROM_SETTING = object()


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


def decide_shard(
    position: int,
    new: Sequence[UtteranceSignals],
    earlier: CandidateSource,
    thresholds: NearDuplicateThresholds,
    *,
    own_postings: np.ndarray | None = None,
    key_load: AudioKeyLoad | None = None,
    budget: int | None | object = _FROM_SETTING,
) -> list[Decision]:
    """A :class:`Decision` per ``new`` utterance (the shard at index ``position``, in ``utt_id``
    order) against ``earlier`` (everything indexed before the shard) and its own earlier utterances.
    ``own_postings``: the shard's postings (:func:`~.near_dup_postings.index_keys` of ``new`` at
    ``position``), when the caller built them already (they are looked up and committed too).
    ``key_load``: counts what the cap kept out of the shard's audio vote, when given.
    ``budget``: the earlier postings held at once (None: no budget; default
    :func:`postings_budget`).

    Reads ``earlier`` for the postings of every key of the shard (in one lookup, or chunk by chunk
    of utterances where they pass the budget), then once for the candidates those postings name;
    memory and time follow the shard and what it touches, memory at most the budget."""
    from speechdata.quality.near_dup_postings import audio_only_keys, index_keys, owner_of

    own = index_keys(new, position) if own_postings is None else own_postings
    if budget is _FROM_SETTING:
        budget = postings_budget()
    audio_only = audio_only_keys(own)
    first_own = owner_of(position, 0)
    queries: list[_Query] = []
    # Every utterance at once when the shard's earlier postings fit the budget (one lookup, as a
    # prefetch read it); else in chunks that fit: halved until one does, doubled after one that held
    # less than half of it (never back to a size refused: a refusal reads up to the budget for
    # nothing). A key's postings do not depend on the other keys looked up with it, so each
    # utterance gets the same candidates whatever the chunks.
    chunk = refused = len(new)
    while len(queries) < len(new):
        first, end = len(queries), min(len(new), len(queries) + chunk)
        gathered = _chunk_candidates(position, new, first, end, own, audio_only, earlier, thresholds, budget)
        if gathered is None:
            refused = end - first
            chunk = max(1, refused // 2)
            continue
        queries += gathered[0]
        if budget is not None and gathered[1] < budget // 2:
            chunk = max(chunk, min(2 * chunk, refused - 1))
    if key_load is not None:
        for query in queries:
            key_load.add(query)
    wanted = sorted({o for q in queries for o in (*q.exact, *q.audio, *q.transcript, *q.envelope) if o < first_own})
    fetched = earlier.entries(wanted)
    known: dict[int, IndexEntry] = dict(fetched)
    decisions = []
    for rank, signals in enumerate(new):
        match = _decide_one(signals, queries[rank], known, thresholds)
        if match is None:
            decision = Decision(signals.utt_id, signals.shard_id, signals.utt_id, None, 1.0)
        elif match[0] in FLAG_KINDS:
            kind, matched, similarity = match
            matched_signals = known[matched][0]
            decision = Decision(
                signals.utt_id,
                signals.shard_id,
                signals.utt_id,
                kind,
                round(similarity, 4),
                matched_signals.shard_id,
                matched_signals.utt_id,
            )
        else:
            kind, matched, similarity = match
            matched_signals, representative = known[matched]
            decision = Decision(
                signals.utt_id,
                *representative,
                kind,
                round(similarity, 4),
                matched_signals.shard_id,
                matched_signals.utt_id,
            )
        decisions.append(decision)
        known[owner_of(position, rank)] = (signals, (decision.representative_shard, decision.representative_utt))
    return decisions


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
            keys_past_cap = int(np.count_nonzero(per_key > MAX_KEY_OCCURRENCES))
            contexts = neighbour_contexts(signals.fingerprint.sub_fingerprints, frames)
            # The cap first: a key past it never votes, so its postings' contexts are never compared.
            voting = np.flatnonzero(per_key[which] <= MAX_KEY_OCCURRENCES)
            which, found = which[voting], found[voting]
            alike = context_bit_errors(contexts[which], columns.context[found]) <= MAX_CONTEXT_BIT_ERRORS
            which, found = which[alike], found[alike]
            owners = columns.owner[found]
            offsets = columns.frame[found].astype(np.int64) - frames[which]
            if len(owners):
                pairs, votes = _pair_votes(owners, offsets)
                best = _best_offset_per_owner(pairs, votes, 1)
                audio = [owner for owner, _ in best[:AUDIO_CANDIDATES_FETCHED]]
    transcript: list[int] = []
    if (
        thresholds.check_transcripts
        and signals.transcript_signature is not None
        and signals.transcript_words >= thresholds.min_transcript_words
    ):
        _, found = _key_postings(columns, transcript_keys(signals.transcript_signature), me)
        comparable = columns.owner[found][columns.frame[found] >= thresholds.min_transcript_words]
        transcript = sorted(set(comparable.tolist()))[:MAX_TRANSCRIPT_CANDIDATES]
    envelope: list[int] = []
    if signals.shift is not None:
        _, found = _key_postings(columns, envelope_keys(signals.shift.envelope), me)
        if len(found):
            found_owners = columns.owner[found]
            owners, hits = _value_counts(found_owners)
            shared = hits >= MIN_SHARED_ENVELOPE_PAIRS
            owners, hits = owners[shared], hits[shared]
            # most shared pairs (so bands) first, the earliest on a tie
            chosen = np.lexsort((owners, -hits))[:ENVELOPE_CANDIDATES]
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


def _decide_one(
    signals: UtteranceSignals, query: _Query, known: dict[int, IndexEntry], thresholds: NearDuplicateThresholds
) -> tuple[str, int, float] | None:
    """The strongest match: a duplicate (:data:`KINDS`) before a flag (:data:`FLAG_KINDS`)."""
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
    for _, owner, offset in sorted(voted)[:AUDIO_CANDIDATES_VERIFIED]:
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
    for shift in range(-OFFSET_SEARCH_FRAMES, OFFSET_SEARCH_FRAMES + 1):
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
