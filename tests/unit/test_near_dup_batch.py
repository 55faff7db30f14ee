"""The whole-corpus batch pass decides exactly as the incremental path, shard by shard in the same
order: on synthetic signals that stress the lookup (a sub-fingerprint in every frame of many
utterances, a transcript family past the candidate cap, copies of copies, exact hashes), with and
without shards that keep their stored decisions, and on the planted set's real signals
(speechdata.quality.near_dup_batch, in this process)."""

import numpy as np
import pytest

from speechdata.io.storage import DataRoot
from speechdata.quality.fingerprint_audio import AudioFingerprint
from speechdata.quality.near_dup_batch import LocalEngine, ShardOutline, ShardSignals, decide_in_order, select_shards
from speechdata.quality.near_dup_candidates import AudioKeyLoad
from speechdata.quality.near_dup_matching import (
    MAX_KEY_OCCURRENCES,
    MAX_TRANSCRIPT_CANDIDATES,
    MemorySource,
    NearDuplicateThresholds,
    UtteranceSignals,
    decide_shard,
    find_representatives,
)
from speechdata.quality.near_dup_planted import SAMPLE_RATE, planted_set
from speechdata.quality.near_duplicates import utterance_signals

COMMON_KEY = 0xDEADBEEF


def incremental(shards: list[list[UtteranceSignals]], thresholds: NearDuplicateThresholds):
    """The incremental path's decisions: each shard against everything indexed before it."""
    indexed, decisions = [], []
    for signals in shards:
        decided = find_representatives(indexed, signals, thresholds)
        decisions.append(decided)
        indexed += [(s, (d.representative_shard, d.representative_utt)) for s, d in zip(signals, decided, strict=True)]
    return decisions


def batch(shards, thresholds, decided_ids, partitions=3, kept=None):
    """The batch pass over ``shards`` (lists of signals); ``kept``: {shard_id: stored representatives}."""
    kept = kept or {}
    handles, outlines, ids = [], [], []
    for signals in shards:
        shard_id = signals[0].shard_id
        ids.append(shard_id)
        handles.append(ShardSignals(shard_id, signals, kept.get(shard_id)))
        outlines.append(ShardOutline(shard_id, [s.utt_id for s in signals], kept.get(shard_id), [], 0.0))
    positions = np.arange(len(ids), dtype=np.int64)
    return decide_in_order(LocalEngine(), ids, positions, set(decided_ids), handles, outlines, thresholds, partitions)


def _fingerprint(rng, frames):
    values = rng.integers(0, 2**32, frames, dtype=np.uint64).astype(np.uint32)
    return AudioFingerprint(values, rng.random(frames) < 0.9)


def _copy(rng, fingerprint: AudioFingerprint, trim: int) -> AudioFingerprint:
    values = fingerprint.sub_fingerprints[trim:].copy()
    flipped = rng.random(len(values)) < 0.15
    values[flipped] ^= np.uint32(1) << rng.integers(0, 32, int(flipped.sum()), dtype=np.uint64).astype(np.uint32)
    return AudioFingerprint(values, fingerprint.active[trim:].copy())


def _signature(rng, family: np.ndarray | None = None, shared: int = 0) -> np.ndarray:
    values = rng.integers(0, 2**63, 128, dtype=np.uint64)
    if family is not None:
        values[:shared] = family[:shared]
    return values


def synthetic_corpus(seed: int = 0, shards: int = 4, per_shard: int = 60) -> list[list[UtteranceSignals]]:
    """Shards of synthetic signals: near-audio copies (trimmed, bits flipped) of earlier utterances and
    of copies, exact copies, a sub-fingerprint in over MAX_KEY_OCCURRENCES frames from the second
    shard on, and a transcript family larger than MAX_TRANSCRIPT_CANDIDATES whose best match is
    outside the first 64."""
    rng = np.random.default_rng(seed)
    family = rng.integers(0, 2**63, 128, dtype=np.uint64)
    made: list[UtteranceSignals] = []
    corpus = []
    family_members = 0
    member_70 = last_member = ""
    for shard in range(shards):
        signals = []
        for n in range(per_shard):
            utt_id = f"s{shard}-u{n:03d}"
            roll = rng.random()
            exact_hash = f"{rng.integers(0, 2**60):016x}"
            signature = _signature(rng)
            if made and roll < 0.25:
                source = made[int(rng.integers(0, len(made)))]
                fingerprint = _copy(rng, source.fingerprint, int(rng.integers(0, 4)))
            elif made and roll < 0.32:
                source = made[int(rng.integers(0, len(made)))]
                fingerprint, exact_hash = source.fingerprint, source.exact_hash
            else:
                fingerprint = _fingerprint(rng, int(rng.integers(60, 160)))
            if roll > 0.55:
                # 104 of 128 values shared: every member matches every earlier one (Jaccard 0.81)...
                signature = _signature(rng, family, 104)
                family_members += 1
                if family_members == MAX_TRANSCRIPT_CANDIDATES + 20:
                    # ...and this one copies member 70 exactly, which the 64 earliest leave out.
                    signature = next(s for s in made + signals if s.utt_id == member_70).transcript_signature.copy()
                    last_member = utt_id
                if family_members == 70:
                    member_70 = utt_id
            words = 8 if roll > 0.55 else int(rng.integers(2, 12))
            signals.append(
                UtteranceSignals(
                    shard_id=f"s{shard}",
                    utt_id=utt_id,
                    exact_hash=exact_hash,
                    fingerprint=fingerprint,
                    transcript_signature=signature,
                    transcript_words=words,
                )
            )
        # Hum: one sub-fingerprint in every frame, past MAX_KEY_OCCURRENCES in the last shard.
        hums = 1 if shard < 2 else (12 if shard == shards - 1 else 0)
        for n in range(hums):
            hum = AudioFingerprint(np.full(40, COMMON_KEY, np.uint32), np.ones(40, bool))
            signals.append(
                UtteranceSignals(
                    f"s{shard}", f"s{shard}-hum{n:02d}", f"{rng.integers(0, 2**60):016x}", hum, _signature(rng), 1
                )
            )
        # A chain: each link flips 8 bits in half the frames of the one before (bit error rate 1/8),
        # the other half each time, so the third link is far from the first (1/4) and shares no frame with it.
        if shard < 3:
            if shard == 0:
                chain = _fingerprint(rng, 100)
            else:
                values = chain.sub_fingerprints.copy()
                values[shard - 1 :: 2] ^= np.uint32(0xFF << (8 * shard))
                chain = AudioFingerprint(values, chain.active.copy())
            signals.append(UtteranceSignals(f"s{shard}", f"s{shard}-chain", None, chain, _signature(rng), 1))
        made += signals
        corpus.append(sorted(signals, key=lambda s: s.utt_id))
    occurrences = sum(int((s.fingerprint.sub_fingerprints[s.fingerprint.active] == COMMON_KEY).sum()) for s in made)
    assert occurrences > MAX_KEY_OCCURRENCES and family_members > MAX_TRANSCRIPT_CANDIDATES + 20
    return corpus, (member_70, last_member)


THRESHOLDS = [
    NearDuplicateThresholds(),
    NearDuplicateThresholds(max_bit_error_rate=0.05, min_transcript_jaccard=0.9, min_offset_votes=5),
    NearDuplicateThresholds(check_transcripts=False, min_overlap_share=0.95),
]


@pytest.mark.parametrize("thresholds", THRESHOLDS, ids=["defaults", "strict", "audio-only"])
def test_the_batch_pass_decides_every_synthetic_shard_as_the_incremental_path(thresholds):
    corpus, _ = synthetic_corpus()
    expected = incremental(corpus, thresholds)
    by_utt = {d.utt_id: d for shard in expected for d in shard}
    # The corpus exercises what it claims to: every kind (where the thresholds allow), copies of copies.
    kinds = {d.kind for d in by_utt.values()}
    assert {"exact_audio", "near_audio"} <= kinds
    transcripts_match = thresholds.check_transcripts and thresholds.min_transcript_jaccard <= 0.8
    assert transcripts_match == ("near_transcript" in kinds)
    if thresholds.max_bit_error_rate >= 0.2:
        assert (by_utt["s2-chain"].matched_utt, by_utt["s2-chain"].representative_utt) == ("s1-chain", "s0-chain")
    for partitions in (1, 5):
        got = batch(corpus, thresholds, [f"s{n}" for n in range(len(corpus))], partitions)
        assert [got[f"s{n}"] for n in range(len(corpus))] == expected


def test_the_batch_pass_counts_each_shards_audio_keys_past_the_cap_as_the_incremental_path():
    corpus, _ = synthetic_corpus(seed=2)
    thresholds = NearDuplicateThresholds()
    expected = []
    for position, signals in enumerate(corpus):
        source = MemorySource([(s, (s.shard_id, s.utt_id)) for shard in corpus[:position] for s in shard])
        load = AudioKeyLoad()
        decide_shard(position, signals, source, thresholds, key_load=load)
        expected.append(load)
    assert expected[-1].keys_past_cap > 0  # the common sub-fingerprint passes the cap from the second shard on

    loads: dict = {}
    ids = [f"s{n}" for n in range(len(corpus))]
    handles = [ShardSignals(shard[0].shard_id, shard, None) for shard in corpus]
    outlines = [ShardOutline(shard[0].shard_id, [s.utt_id for s in shard], None, [], 0.0) for shard in corpus]
    positions = np.arange(len(ids), dtype=np.int64)
    decide_in_order(LocalEngine(), ids, positions, set(ids), handles, outlines, thresholds, 3, key_loads=loads)
    assert [loads[shard_id] for shard_id in ids] == expected


def test_shards_outside_the_selection_keep_their_stored_decisions_and_are_matched_against():
    corpus, _ = synthetic_corpus(seed=1)
    thresholds = NearDuplicateThresholds()
    expected = incremental(corpus, thresholds)
    stored = {
        f"s{n}": [(d.representative_shard, d.representative_utt) for d in expected[n]] for n in range(len(corpus))
    }
    # s0 and s2 keep their decisions; s1 and s3 are decided against them.
    got = batch(corpus, thresholds, ["s1", "s3"], kept={"s0": stored["s0"], "s2": stored["s2"]})
    assert set(got) == {"s1", "s3"}
    assert got["s1"] == expected[1] and got["s3"] == expected[3]


def test_the_planted_sets_real_signals_decide_alike_across_shards():
    utterances = planted_set(10, seed=5)
    shards = 3
    corpus = [
        [
            utterance_signals(f"p{shard}", u.utt_id, u.samples, SAMPLE_RATE, u.text)
            for u in sorted(utterances[shard::shards], key=lambda u: u.utt_id)
        ]
        for shard in range(shards)
    ]
    thresholds = NearDuplicateThresholds()
    expected = incremental(corpus, thresholds)
    assert sum(d.kind is not None for shard in expected for d in shard) >= 5
    got = batch(corpus, thresholds, [f"p{n}" for n in range(shards)], partitions=4)
    assert [got[f"p{n}"] for n in range(shards)] == expected


def test_a_selection_keeps_the_order_given_or_filters_the_available_shards_and_refuses_bad_ids(tmp_path):
    root = DataRoot(str(tmp_path))
    assert select_shards(root, ["b", "a", "b"]) == ["b", "a"]
    assert select_shards(root, None, "yodas-*", available=["yodas-2", "other", "yodas-1"]) == ["yodas-2", "yodas-1"]
    with pytest.raises(ValueError, match="'../escape'"):
        select_shards(root, ["ok", "../escape"])
    with pytest.raises(ValueError, match="none matches 'x-\\*'"):
        select_shards(root, None, "x-*", available=["a"])
