"""Near-duplicate audio and transcripts across the whole corpus, shard by shard as shards land.

:func:`run_near_duplicates` checks a shard's normalized utterances against every utterance indexed
before them (the corpus index, :mod:`speechdata.quality.near_dup_index`, and the shard's own
earlier utterances), writes ``shards/<shard>/near_duplicates.parquet`` (one row per utterance that
copies an earlier one) and adds the shard to the index. The representative of a group of copies is
the copy indexed first; a shard indexed again keeps its place in the index order, so its decisions
are the same and no later shard's change (docs/near-duplicates.md).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from speechdata.accounting.rejects import error_text
from speechdata.accounting.stage import StageSummary
from speechdata.audio import budget
from speechdata.audio.codec import decode_audio
from speechdata.io import layout
from speechdata.io.shard_lock import EXCLUSIVE_CREATE_PROTOCOLS, LockHolder
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_matching
from speechdata.quality.fingerprint_audio import audio_fingerprint, exact_audio_hash
from speechdata.quality.fingerprint_envelope import shift_signature
from speechdata.quality.fingerprint_text import normalized_transcript, transcript_signature, word_count
from speechdata.quality.near_dup_candidates import AudioKeyLoad
from speechdata.quality.near_dup_compaction import inline_merge_level
from speechdata.quality.near_dup_index import (
    DEFAULT_LOCK_TIMEOUT_S,
    IndexDamaged,
    IndexReader,
    ReservationLost,
    commit_shard_entries,
    compact_index,
    repair_index,
    reserve_position,
    wait_for_earlier,
)
from speechdata.quality.near_dup_matching import (
    FLAG_KINDS,
    KINDS,
    Decision,
    NearDuplicateThresholds,
    UtteranceSignals,
    decide_shard,
    postings_budget,
)
from speechdata.quality.near_dup_postings import audio_only_keys, index_keys
from speechdata.quality.paths import near_duplicate_flags
from speechdata.quality.speakers import SpeakerEncoder, shipped_speaker_encoder

MAX_CHECKED_SECONDS = 1_800.0
"""An utterance longer than this (30 minutes, the same bound as alignment's) is not decoded for its
signals: it stays unchecked, with the reason, and unindexed. Decoding, hashing and fingerprinting
hold about 0.3 MB per second of audio at once (the fingerprint is computed in windows), so this
bounds a step's memory per utterance to about 500 MB."""


def checked_seconds() -> float:
    """:data:`MAX_CHECKED_SECONDS`, or the whole-decode budget where that is lower (a long recording
    is never decoded whole: it stays unchecked)."""
    return min(MAX_CHECKED_SECONDS, budget.MAX_UTTERANCE_SECONDS)


INDEX_ATTEMPTS = 3
"""Reservations lost (taken for dead, or a rebuilt order) or damage repaired, before giving up."""

SPEAKER_MIN_WORDS = NearDuplicateThresholds().min_transcript_words
"""Transcripts this long get a speaker embedding: the default ``min_transcript_words``, below which
transcripts are never compared. A shard checked with a lower ``min_transcript_words`` compares its
shorter transcripts without speakers (as the same speaker: duplicates, as before speakers existed)."""
SIGNALS_BATCH_S = 300.0
"""Decoded audio held at once while computing signals: its speaker windows go through the encoder together."""
KEYS_PAST_CAP_WARNING_SHARE = 0.05
"""A shard whose sampled audio keys are past ``MAX_KEY_OCCURRENCES`` in more than this share warns in
its run's log (:meth:`NearDuplicatesSummary.recall_warning`). Measured on the extended planted set
inside a growing background of synthetic speech (``bench_near_dup_recall_at_scale``): no copy was
lost with 3.7 % of the keys past the cap, the first one (a compound copy found by audio alone) at
8.1 %; on keys whose loads sit at their mean (a Poisson count), 5 % is a mean load of 465 against
500, where a copy voting with 2 keys loses both with probability 0.3 % (docs/deploying.md, "Near
duplicates past N hours")."""
RECALL_DOC = 'docs/deploying.md, "Near duplicates past N hours"'
REJECT_REASON = "near_duplicate"
"""The reason the quality filter records for every utterance listed in ``near_duplicates.parquet``."""

COLUMN_DESCRIPTIONS = {
    "utt_id": "An utterance of this shard that copies an utterance indexed before it.",
    "representative_shard": "Shard of the group's representative: the copy indexed first, which is kept.",
    "representative_utt": "utt_id of the group's representative.",
    "kind": "exact_audio (same samples), near_audio (same recording re-encoded, trimmed, gain-changed, "
    "resampled or padded), contained_audio (a clip of an earlier utterance) or near_transcript (same words by "
    "the same speaker under other audio); the strongest signal that matched. In near_duplicate_flags.parquet: "
    "contains_earlier (holds an earlier utterance plus new speech) or other_speaker_reading (same words, "
    "another speaker); there the representative columns name the utterance matched.",
    "similarity": "0-1: 1 for exact_audio; 1 - 2 x fingerprint bit error rate for near_audio; estimated "
    "Jaccard similarity of the transcripts' character 5-grams for near_transcript.",
}

NEAR_DUPLICATES_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False, metadata={"description": COLUMN_DESCRIPTIONS["utt_id"]}),
        pa.field(
            "representative_shard",
            pa.string(),
            nullable=False,
            metadata={"description": COLUMN_DESCRIPTIONS["representative_shard"]},
        ),
        pa.field(
            "representative_utt",
            pa.string(),
            nullable=False,
            metadata={"description": COLUMN_DESCRIPTIONS["representative_utt"]},
        ),
        pa.field("kind", pa.string(), nullable=False, metadata={"description": COLUMN_DESCRIPTIONS["kind"]}),
        pa.field(
            "similarity", pa.float64(), nullable=False, metadata={"description": COLUMN_DESCRIPTIONS["similarity"]}
        ),
    ]
)


@dataclass(frozen=True)
class Unchecked:
    """An utterance whose audio could not be decoded or is longer than :data:`MAX_CHECKED_SECONDS`:
    it stays in the products, unchecked and unindexed."""

    utt_id: str
    detail: str


@dataclass(frozen=True, kw_only=True)
class NearDuplicatesSummary(StageSummary):
    """``duplicates``: this shard's rows of ``near_duplicates.parquet``; ``index_position``: the shard's
    place in the index order; ``indexed_before``: utterances of earlier shards it was checked against."""

    duplicates: list[Decision]
    flags: list[Decision]
    """Matches that are not duplicates (:data:`~.near_dup_matching.FLAG_KINDS`): kept, listed apart."""
    unchecked: list[Unchecked]
    index_position: int
    indexed_before: int
    index_locked: bool
    repairs: list[str] = field(default_factory=list)
    """What this run rebuilt of a damaged index (:func:`~.near_dup_index.repair_index`)."""
    postings_read: int = 0
    entries_read: int = 0
    audio_key_load: AudioKeyLoad = field(default_factory=AudioKeyLoad)
    """What ``MAX_KEY_OCCURRENCES`` kept out of the shard's audio vote (:class:`~.near_dup_candidates.AudioKeyLoad`)."""

    @property
    def by_kind(self) -> dict[str, int]:
        counts = Counter(decision.kind for decision in self.duplicates + self.flags)
        return {kind: counts.get(kind, 0) for kind in KINDS + FLAG_KINDS}

    def recall_warning(self) -> str | None:
        """:func:`recall_warning` of this shard."""
        return recall_warning(self.shard_id, self.audio_key_load)


def recall_warning(shard_id: str, load: AudioKeyLoad) -> str | None:
    """A line for the run's log once the share of the shard's sampled audio keys past the cap passes
    :data:`KEYS_PAST_CAP_WARNING_SHARE`; None below it."""
    if load.share_past_cap <= KEYS_PAST_CAP_WARNING_SHARE:
        return None
    cap = near_dup_matching.MAX_KEY_OCCURRENCES
    return (
        f"{shard_id}: {load.share_past_cap:.1%} of the shard's sampled audio keys had more than "
        f"MAX_KEY_OCCURRENCES ({cap}) earlier postings and never voted (warning above "
        f"{KEYS_PAST_CAP_WARNING_SHARE:.0%}); {load.utterances_silenced} of {load.utterances} utterances had no "
        "audio key voting at all. Copies found only by their audio (clips, compound and trimmed copies) are "
        f"being missed as the corpus grows: see {RECALL_DOC}"
    )


def utterance_signals(
    shard_id: str,
    utt_id: str,
    samples,
    sample_rate: int,
    text: str | None,
    speaker_encoder: Callable[[], SpeakerEncoder] | None = None,
) -> UtteranceSignals:
    """Everything the index keeps of one utterance (mono float ``samples``). The speaker embedding is
    computed with the encoder ``speaker_encoder()`` returns, for an utterance whose transcript has at
    least :data:`SPEAKER_MIN_WORDS` words (only such transcripts are compared, so only there does
    the speaker matter; the encoder is not even loaded for a shard without one), rounded to the
    float16 the index stores, so a decision taken now and one taken later from the stored entries
    are the same. No encoder, no embedding."""
    normalized = normalized_transcript(text)
    embedding = None
    if speaker_encoder is not None and word_count(normalized) >= SPEAKER_MIN_WORDS:
        found = speaker_encoder().signals(samples, sample_rate).embedding
        embedding = None if found is None else found.astype(np.float16).astype(np.float32)
    shift = shift_signature(samples, sample_rate)
    return UtteranceSignals(
        shard_id=shard_id,
        utt_id=utt_id,
        exact_hash=exact_audio_hash(samples),
        fingerprint=audio_fingerprint(samples, sample_rate),
        transcript_signature=transcript_signature(normalized),
        transcript_words=word_count(normalized),
        speaker_embedding=embedding,
        shift=shift,
    )


def shard_signals(data_root: DataRoot, shard_id: str) -> tuple[list[UtteranceSignals], list[Unchecked], float]:
    """The signals of every utterance in the shard's audio container, in ``utt_id`` order, the
    utterances that could not be decoded, and the seconds of audio read. Speaker embeddings come
    from the encoder shipped in the Resemblyzer wheel, loaded once per process
    (:func:`~.speakers.shipped_speaker_encoder`, on the CPU: about 4 % of the audio's duration)."""
    texts = dict(
        zip(
            *data_root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id", "text"]).to_pydict().values(),
            strict=True,
        )
    )
    signals, unchecked, audio_seconds = [], [], 0.0
    decoded: list[tuple[str, np.ndarray, int]] = []
    decoded_s = 0.0
    with data_root.open_parquet(layout.normalized_audio(shard_id)) as parquet:
        for group in range(parquet.num_row_groups):
            described = parquet.read_row_group(group, columns=["utt_id", "sample_rate", "n_samples", "codec"])
            utt_ids, rates, lengths, codecs = described.to_pydict().values()
            checked = [length <= checked_seconds() * rate for rate, length in zip(rates, lengths, strict=True)]
            # A group of overlong utterances only is never read: their payloads alone can take GBs.
            payloads = parquet.read_row_group(group, columns=["audio"]).column(0) if any(checked) else None
            for row, (utt_id, rate, n_samples, codec) in enumerate(zip(utt_ids, rates, lengths, codecs, strict=True)):
                if not checked[row]:
                    unchecked.append(
                        Unchecked(
                            utt_id,
                            f"{n_samples / rate:.0f} s of audio, longer than the {checked_seconds():.0f} s checked "
                            "for near duplicates",
                        )
                    )
                    continue
                try:
                    samples = decode_audio(payloads[row].as_py(), codec)
                except Exception as exc:  # one undecodable payload must not stop the shard
                    unchecked.append(Unchecked(utt_id, f"audio not decodable ({codec}): {error_text(exc)}"))
                    continue
                audio_seconds += len(samples) / rate
                decoded.append((utt_id, samples, rate))
                decoded_s += len(samples) / rate
                if decoded_s >= SIGNALS_BATCH_S:
                    signals += _batch_signals(shard_id, decoded, texts)
                    decoded, decoded_s = [], 0.0
    signals += _batch_signals(shard_id, decoded, texts)
    return sorted(signals, key=lambda s: s.utt_id), unchecked, audio_seconds


def _batch_signals(shard_id: str, decoded: list[tuple[str, np.ndarray, int]], texts: dict) -> list[UtteranceSignals]:
    """The signals of decoded utterances; the speaker windows of those that get an embedding are
    embedded together first (the encoder remembers them), far cheaper than one call per utterance."""
    speaking = [
        (samples, rate)
        for utt_id, samples, rate in decoded
        if word_count(normalized_transcript(texts.get(utt_id))) >= SPEAKER_MIN_WORDS
    ]
    if speaking:
        shipped_speaker_encoder().window_embeddings_many(speaking)
    return [
        utterance_signals(shard_id, utt_id, samples, rate, texts.get(utt_id), shipped_speaker_encoder)
        for utt_id, samples, rate in decoded
    ]


def near_duplicates_table(decisions: list[Decision], kinds: tuple[str, ...] = KINDS) -> pa.Table:
    """The rows of ``near_duplicates.parquet`` (the schema's, even when there are none); with
    ``kinds=FLAG_KINDS`` those of ``near_duplicate_flags.parquet``, whose representative columns
    name the utterance matched (a flagged utterance is its own representative)."""
    rows = [
        {
            "utt_id": d.utt_id,
            "representative_shard": d.matched_shard if d.kind in FLAG_KINDS else d.representative_shard,
            "representative_utt": d.matched_utt if d.kind in FLAG_KINDS else d.representative_utt,
            "kind": d.kind,
            "similarity": d.similarity,
        }
        for d in decisions
        if d.kind in kinds
    ]
    return pa.Table.from_pylist(rows, schema=NEAR_DUPLICATES_SCHEMA)


def write_near_duplicate_files(data_root: DataRoot, shard_id: str, decisions: list[Decision]) -> None:
    """The flags first, ``near_duplicates.parquet`` last: that file is the stage's mark of completion."""
    data_root.write_parquet(near_duplicate_flags(shard_id), near_duplicates_table(decisions, FLAG_KINDS))
    data_root.write_parquet(layout.near_duplicates(shard_id), near_duplicates_table(decisions))


def run_near_duplicates(
    data_root: DataRoot,
    shard_id: str,
    thresholds: NearDuplicateThresholds | None = None,
    *,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> NearDuplicatesSummary:
    """Check ``shard_id`` against the corpus index, write its ``near_duplicates.parquet`` and index it.

    Signals are computed first, with no lock; then the shard reserves its place in the index order,
    waits for the shards reserved before it, is decided against the committed shards before it
    (reading only the postings of its keys and the entries they name), commits, and writes its file
    last. A killed run leaves the index as it was, or with its reservation (dropped by the next
    shard that finds this run gone, or taken back by this shard's re-run), or with this shard fully
    committed; a re-run ends the same. Damage to the index found on the way is repaired
    (:func:`~.near_dup_index.repair_index`) and the shard decided again.
    """
    thresholds = thresholds or NearDuplicateThresholds()
    max_level = inline_merge_level()  # a bad value refused before any work, not after the commit
    budget = postings_budget()
    started = time.perf_counter()
    signals, unchecked, audio_seconds = shard_signals(data_root, shard_id)
    lock_options = {"run_id": run_id, "holder_finished": holder_finished}
    repairs: list[str] = []
    for attempt in range(INDEX_ATTEMPTS):
        key_load = AudioKeyLoad()  # a repaired index decides again: only the last decision's count stands
        try:
            with reserve_position(data_root, shard_id, timeout_s=lock_timeout_s, **lock_options) as reservation:
                # The postings of the shard's keys are read from what is committed now, while shards
                # reserved before it may still be deciding; then only theirs once they commit.
                # The shard's own postings, built and sorted once: looked up, decided with, committed.
                own = index_keys(signals, reservation.position)
                earlier = IndexReader(data_root, reservation.position)
                # Past the budget the prefetch stops and drops what it read: the settled read goes chunk by chunk.
                earlier.prefetch(own["key"], audio_only_keys(own), limit=budget)
                earlier.settle(wait_for_earlier(data_root, reservation, timeout_s=lock_timeout_s, **lock_options))
                decisions = decide_shard(
                    reservation.position,
                    signals,
                    earlier,
                    thresholds,
                    own_postings=own,
                    key_load=key_load,
                    budget=budget,
                )
                indexed = commit_shard_entries(
                    data_root,
                    reservation,
                    signals,
                    decisions,
                    postings=own,
                    timeout_s=lock_timeout_s,
                    **lock_options,
                )
                # After the commit: a run killed in between re-runs at the position it committed,
                # with the same decisions, so the file written then is the one this run would have written.
                write_near_duplicate_files(data_root, shard_id, decisions)
            break
        except ReservationLost:
            if attempt == INDEX_ATTEMPTS - 1:
                raise
        except IndexDamaged as damaged:
            if attempt == INDEX_ATTEMPTS - 1:
                raise
            repairs += repair_index(
                data_root,
                damaged_entries=[damaged.entries_of] if damaged.entries_of else [],
                refingerprint=lambda other: shard_signals(data_root, other)[0],
                timeout_s=lock_timeout_s,
                **lock_options,
            )
    # One merge per shard keeps the segments logarithmic; a repair may have rebuilt many level-0
    # segments at once (an index of an earlier format is rebuilt whole), so it merges all that is due.
    # Only small merges: larger ones are the compaction job's (near_dup_compaction), so no shard's
    # run rewrites a level that grows with the corpus.
    while compact_index(data_root, max_level=max_level, timeout_s=lock_timeout_s, **lock_options) and repairs:
        pass
    return NearDuplicatesSummary(
        shard_id=shard_id,
        rows_in=len(signals) + len(unchecked),
        rows_out=len(signals),
        rejects=[],
        audio_seconds=audio_seconds,
        compute_seconds=time.perf_counter() - started,
        outputs={"near_duplicates": data_root.uri(layout.near_duplicates(shard_id))},
        duplicates=[d for d in decisions if d.kind in KINDS],
        flags=[d for d in decisions if d.kind in FLAG_KINDS],
        unchecked=unchecked,
        index_position=indexed.position,
        indexed_before=earlier.utterances,
        index_locked=data_root.is_local or data_root.protocol in EXCLUSIVE_CREATE_PROTOCOLS,
        repairs=repairs,
        postings_read=earlier.postings_read,
        entries_read=earlier.rows_read,
        audio_key_load=key_load,
    )
