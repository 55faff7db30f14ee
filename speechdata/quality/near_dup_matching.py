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

Here: the kinds, the thresholds and limits, the sources and the decision; the candidates are gathered
in :mod:`.near_dup_candidates` and verified in :mod:`.near_dup_verification`, which read the limits
from this module at each call.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from speechdata.quality.fingerprint_audio import FINGERPRINT_SAMPLE_RATE, HOP_SAMPLES, AudioFingerprint
from speechdata.quality.fingerprint_envelope import ShiftSignature
from speechdata.quality.speakers import SAME_SPEAKER_MIN_COSINE

if TYPE_CHECKING:
    from speechdata.quality.near_dup_candidates import AudioKeyLoad

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


_FROM_SETTING = object()


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
    ``key_load``: counts what the cap kept out of the shard's audio vote, when given
    (:class:`~.near_dup_candidates.AudioKeyLoad`).
    ``budget``: the earlier postings held at once (None: no budget; default
    :func:`postings_budget`).

    Reads ``earlier`` for the postings of every key of the shard (in one lookup, or chunk by chunk
    of utterances where they pass the budget), then once for the candidates those postings name;
    memory and time follow the shard and what it touches, memory at most the budget."""
    from speechdata.quality.near_dup_candidates import _chunk_candidates, _Query
    from speechdata.quality.near_dup_postings import audio_only_keys, index_keys, owner_of
    from speechdata.quality.near_dup_verification import _decide_one

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
