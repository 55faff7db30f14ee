"""The index keys envelope band pairs instead of single bands (docs/near-duplicates.md, "Where it
stops being flat"): the decisions are those of the single-band rule (">= 3 shared pairs" is ">= 3
shared bands"), and an index written with single-band keys (the earlier segment format) is found by
its version and rebuilt from its entries files by the next run, deciding the same."""

import numpy as np
import pytest

from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_filter, near_dup_matching, near_dup_postings
from speechdata.quality.fingerprint_audio import AudioFingerprint
from speechdata.quality.fingerprint_envelope import ENVELOPE_POINTS, SHAPE_SEGMENTS, ShiftSignature, envelope_band_keys
from speechdata.quality.near_dup_index import (
    IndexDamaged,
    IndexReader,
    commit_shard_entries,
    repair_index,
    reserve_position,
    write_index,
)
from speechdata.quality.near_dup_matching import (
    ENVELOPE_CANDIDATES,
    MIN_SHARED_ENVELOPE_BANDS,
    SHIFTED_AUDIO,
    NearDuplicateThresholds,
    UtteranceSignals,
    decide_shard,
    find_representatives,
)

THRESHOLDS = NearDuplicateThresholds(check_transcripts=False)


def _unit(vector: np.ndarray) -> np.ndarray:
    return (vector / np.linalg.norm(vector)).astype(np.float16).astype(np.float32)


def synthetic_shards(seed: int = 0, shards: int = 3, per_shard: int = 50) -> list[list[UtteranceSignals]]:
    """Utterances known only by their shift signature (random fingerprints never match): originals,
    copies whose envelope carries noise from none to past the correlation threshold (sharing from all
    24 bands down to none: 2 and 3 among them), and a family of near-equal envelopes with unrelated
    shapes, more than the candidates fetched per utterance (``ENVELOPE_CANDIDATES``)."""
    rng = np.random.default_rng(seed)
    made: list[UtteranceSignals] = []
    corpus = []
    family = _unit(rng.standard_normal(ENVELOPE_POINTS))
    for shard in range(shards):
        signals = []
        for n in range(per_shard):
            roll = rng.random()
            if n % 4 == 3:
                shift = ShiftSignature(
                    _unit(family + rng.normal(0, 0.02, ENVELOPE_POINTS)),
                    rng.integers(-60, 60, (SHAPE_SEGMENTS, 52)).astype(np.int8),
                    4.0,
                )
            elif made and roll < 0.5:
                source = made[int(rng.integers(len(made)))].shift
                noise = rng.uniform(0.0, 0.06)
                shift = ShiftSignature(
                    _unit(source.envelope + rng.normal(0, noise, ENVELOPE_POINTS)),
                    source.spectral_shape,
                    source.span_s * rng.uniform(0.95, 1.05),
                )
            else:
                shift = ShiftSignature(
                    _unit(rng.standard_normal(ENVELOPE_POINTS)),
                    rng.integers(-60, 60, (SHAPE_SEGMENTS, 52)).astype(np.int8),
                    float(rng.uniform(2.5, 6.0)),
                )
            frames = int(rng.integers(50, 90))
            fingerprint = AudioFingerprint(
                rng.integers(0, 2**32, frames, dtype=np.uint64).astype(np.uint32), np.ones(frames, bool)
            )
            signals.append(UtteranceSignals(f"s{shard}", f"s{shard}-u{n:03d}", None, fingerprint, None, 0, None, shift))
        made += signals
        corpus.append(signals)
    return corpus


def single_band_keys(envelope: np.ndarray) -> np.ndarray:
    """The keys the index held before band pairs: one per band (the earlier segment format)."""
    return near_dup_postings._mix(envelope_band_keys(envelope) ^ near_dup_postings._ENVELOPE_SALT)


def single_band_rule(monkeypatch) -> None:
    monkeypatch.setattr(near_dup_postings, "envelope_keys", single_band_keys)
    monkeypatch.setattr(near_dup_matching, "MIN_SHARED_ENVELOPE_PAIRS", MIN_SHARED_ENVELOPE_BANDS)


def decide_incrementally(corpus):
    indexed, decisions = [], []
    for signals in corpus:
        decided = find_representatives(indexed, signals, THRESHOLDS)
        decisions.append(decided)
        indexed += [(s, (d.representative_shard, d.representative_utt)) for s, d in zip(signals, decided, strict=True)]
    return decisions


@pytest.fixture(scope="module")
def corpus():
    return synthetic_shards()


def test_band_pair_keys_decide_as_single_bands_did(corpus, monkeypatch):
    pairs = decide_incrementally(corpus)
    with monkeypatch.context() as patched:
        single_band_rule(patched)
        bands = decide_incrementally(corpus)
    assert pairs == bands
    kinds = [d.kind for shard in pairs for d in shard]
    assert kinds.count(SHIFTED_AUDIO) >= 20 and kinds.count(None) >= 40
    # the corpus holds copies at the rule's edge: sharing exactly 2 bands (no candidate) and exactly 3
    everything = [s for shard in corpus for s in shard]
    shared = {
        int((envelope_band_keys(a.shift.envelope) == envelope_band_keys(b.shift.envelope)).sum())
        for i, a in enumerate(everything)
        for b in everything[:i]
        if np.dot(a.shift.envelope, b.shift.envelope) > 0.6
    }
    assert {2, 3} <= shared
    assert sum(n % 4 == 3 for shard in corpus for n in range(len(shard))) > ENVELOPE_CANDIDATES


def test_an_index_of_the_earlier_segment_format_is_rebuilt_from_its_entries_and_decides_the_same(monkeypatch, tmp_path):
    root = DataRoot(str(tmp_path))
    corpus = synthetic_shards(seed=1, per_shard=16)
    earlier, last = corpus[:-1], corpus[-1]
    stored = decide_incrementally(earlier)
    with monkeypatch.context() as patched:
        single_band_rule(patched)
        patched.setattr(near_dup_postings, "_MAGIC", b"NDSEG02\n")
        patched.setattr(near_dup_filter, "_MAGIC", b"NDFLT01\n")
        write_index(root, [(s[0].shard_id, s, d) for s, d in zip(earlier, stored, strict=True)])
    with reserve_position(root, last[0].shard_id) as reservation:
        with pytest.raises(IndexDamaged, match="earlier index format"):
            decide_shard(reservation.position, last, IndexReader(root, reservation.position), THRESHOLDS)
        repairs = repair_index(root)
        assert sum("segment rebuilt from its entries" in line for line in repairs) == len(earlier)
        decided = decide_shard(reservation.position, last, IndexReader(root, reservation.position), THRESHOLDS)
        commit_shard_entries(root, reservation, last, decided)
    assert decided == decide_incrementally(corpus)[-1] and any(d.kind == SHIFTED_AUDIO for d in decided)
    for segment in root.glob("index/near_duplicates/segments/*.seg"):
        assert root.fs.cat_file(segment)[:8] == b"NDSEG03\n"


def test_envelope_candidates_the_tempo_rule_rules_out_are_never_fetched_and_decide_the_same(corpus, monkeypatch):
    """An envelope posting carries its utterance's speech span, so a candidate whose span the tempo
    rule rules out is left out before its entries row is read; postings without a span (an index
    written before spans were: context 0) are fetched as before. Same decisions either way."""
    import dataclasses

    from speechdata.quality.near_dup_matching import MemorySource

    rng = np.random.default_rng(5)
    # The family of near-equal envelopes at spans far apart: most of its candidates fail the tempo rule.
    varied = [
        [
            dataclasses.replace(s, shift=dataclasses.replace(s.shift, span_s=float(rng.uniform(2.0, 8.0))))
            if n % 4 == 3
            else s
            for n, s in enumerate(shard)
        ]
        for shard in corpus
    ]

    def decide_counting(shards):
        indexed, decisions, fetched = [], [], 0
        for signals in shards:
            source = MemorySource(indexed)
            entries = source.entries

            def counted(owners, entries=entries):
                nonlocal fetched
                fetched += len(owners)
                return entries(owners)

            source.entries = counted
            decided = decide_shard(source.next_position, signals, source, THRESHOLDS)
            decisions.append(decided)
            indexed += [
                (s, (d.representative_shard, d.representative_utt)) for s, d in zip(signals, decided, strict=True)
            ]
        return decisions, fetched

    with_spans, fetched_with_spans = decide_counting(varied)
    with monkeypatch.context() as patched:
        patched.setattr(near_dup_postings, "span_context", lambda span_s: np.uint64(0))
        unknown, fetched_unknown = decide_counting(varied)
    assert with_spans == unknown
    assert [d.kind for shard in with_spans for d in shard].count(SHIFTED_AUDIO) >= 10
    assert fetched_with_spans < fetched_unknown
