"""The key-space benchmark's arithmetic: chance pairs counted only between unrelated utterances, the
live segments of an 8-way merge, block reads that grow with the corpus and saturate, and the variant
keys it measures (three-band keys inside groups, wider audio keys on today's frames)."""

from __future__ import annotations

from itertools import combinations
from types import SimpleNamespace

import numpy as np

from benchmarks.accuracy.bench_near_dup_keyspace import (
    band_triples,
    block_reads,
    key_figures,
    live_segments,
    wider_audio_keys,
)
from speechdata.quality.near_dup_postings import sampled_audio_keys


def test_chance_postings_count_only_pairs_of_unrelated_utterances():
    keys = [np.array([1, 2], np.uint64), np.array([1, 3], np.uint64), np.array([1, 1], np.uint64)]
    figures = key_figures(keys, np.array([0, 0, 1]))

    # key 1: utterances 0 and 1 are related; utterance 2 holds it twice, against each of 0 and 1
    assert figures["chance_postings"] == 4
    assert figures["unrelated_utterance_pairs"] == 2
    assert figures["chance_per_utterance_pair"] == 2.0
    assert figures["chance_per_key_pair"] == 4 / 8
    assert figures["top_value_shares"]["1"] == round(4 / 6, 5)


def test_live_segments_are_the_base_8_digits_of_the_shard_count():
    assert live_segments(8**2 * 2 + 3) == [1, 1, 1, 64, 64]
    assert sum(live_segments(68_000)) == 68_000


def test_block_reads_grow_with_the_corpus_and_a_key_kind_without_chance_reads_only_false_positives():
    quiet = block_reads({"keys": (100.0, 0.0)}, 10_000, 100.0)
    busy = [block_reads({"keys": (100.0, 1e-4)}, hours, 100.0) for hours in (10_000, 100_000)]

    assert quiet["chance_postings_per_new_utterance"] == {"keys": 0}
    # 100 000 keys a shard, 0.6 % false positives, in each of the live segments (fewer blocks in small ones)
    assert quiet["blocks_per_new_shard"] <= 100_000 * 0.006 * quiet["live_segments"]
    assert busy[0]["blocks_per_new_shard"] > quiet["blocks_per_new_shard"]
    assert (
        busy[1]["chance_postings_per_new_utterance"]["keys"]
        == 10 * busy[0]["chance_postings_per_new_utterance"]["keys"]
    )
    assert busy[1]["blocks_per_new_shard"] > busy[0]["blocks_per_new_shard"]


def test_band_triples_in_groups_cover_every_seven_bands():
    every = band_triples(1)
    grouped = band_triples(3)
    assert len(every) == 2024 and len(grouped) == 3 * 56
    assert all(len({int(band) // 8 for band in triple}) == 1 for triple in grouped)
    as_sets = {frozenset(triple.tolist()) for triple in grouped}
    rng = np.random.default_rng(0)
    for _ in range(200):
        seven = rng.choice(24, 7, replace=False).tolist()
        assert any(frozenset(t) in as_sets for t in combinations(seven, 3))


def test_wider_audio_keys_use_todays_sampled_frames_and_a_copy_keeps_them():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 2**32, 400, dtype=np.uint64).astype(np.uint32)
    active = np.ones(400, bool)
    keys, frames = wider_audio_keys(1, 8)(values, active)
    _, today = sampled_audio_keys(values, active)

    assert set(frames.tolist()) == set(today.tolist()) - {399}
    changed = values.copy()
    changed[frames[0] + 1] ^= np.uint32(1)  # a bit of the next frame inside the key's 8 bits
    other, other_frames = wider_audio_keys(1, 8)(changed, active)
    before = dict(zip(frames.tolist(), keys.tolist(), strict=True))
    after = dict(zip(other_frames.tolist(), other.tolist(), strict=True))
    assert after[int(frames[0])] != before[int(frames[0])]
    untouched = set(before) - {int(frames[0]), int(frames[0]) + 1}
    assert all(after[frame] == before[frame] for frame in untouched)


def test_positional_keys_count_a_key_pair_per_position():
    keys = [np.array([1, 2], np.uint64), np.array([1, 3], np.uint64)]
    anywhere = key_figures(keys, np.array([0, 1]))
    per_position = key_figures(keys, np.array([0, 1]), positional=True)

    assert anywhere["chance_per_key_pair"] == 1 / 4
    assert per_position["chance_per_key_pair"] == 1 / 2


def test_capping_audio_postings_and_one_run_per_level_never_read_more():
    for hours in (10_000, 1_000_000):
        reads = block_reads({"audio_sampled": (100.0, 0.01), "envelope_band_pairs": (276.0, 5e-4)}, hours, 400.0)
        assert reads["gb_read_audio_postings_capped"] <= reads["gb_read_per_new_shard"]
        assert reads["gb_read_audio_postings_capped_one_run_per_level"] <= reads["gb_read_audio_postings_capped"]
        assert reads["gb_read_audio_postings_capped_one_segment"] <= reads["gb_read_audio_postings_capped"]
    # Past the cap in the largest segment (10^6 h: 6.8 M postings a key), a key is read there only.
    assert reads["gb_read_audio_postings_capped_one_segment"] < 0.8 * reads["gb_read_audio_postings_capped"]
    assert reads["mean_chance_postings_per_audio_key"] == round(0.01 / 100 * 1_000_000 * 680)


def test_a_speech_folder_is_a_corpus_whose_files_are_unrelated_but_those_with_the_same_samples(tmp_path):
    import soundfile as sf

    from benchmarks.accuracy.bench_near_dup_keyspace import speech_folder_corpus

    rng = np.random.default_rng(2)
    tone = (0.3 * np.sin(np.linspace(0, 900, 16_000)) * rng.uniform(0.5, 1, 16_000)).astype(np.float32)
    sf.write(tmp_path / "a.wav", tone, 16_000)
    (tmp_path / "more").mkdir()
    sf.write(tmp_path / "more" / "b.wav", tone, 16_000)  # the same samples in another folder
    sf.write(tmp_path / "c.wav", rng.uniform(-0.3, 0.3, 16_000).astype(np.float32), 16_000)
    (tmp_path / "notes.txt").write_text("not audio")

    corpus = speech_folder_corpus(tmp_path)

    assert [s.utt_id for s in corpus.signals] == ["a.wav", "c.wav", "more/b.wav"]
    assert corpus.groups.tolist() == [0, 1, 0]


def test_bit_reliabilities_are_the_distance_of_each_fingerprint_bit_from_its_threshold():
    from speechdata.quality.fingerprint_audio import audio_fingerprint, bit_reliabilities

    rng = np.random.default_rng(3)
    samples = (rng.standard_normal(16_000) * np.hanning(16_000)).astype(np.float32)
    fingerprint = audio_fingerprint(samples, 16_000)
    reliabilities = bit_reliabilities(samples, 16_000)

    assert reliabilities.shape == (fingerprint.frames, 32)
    assert (reliabilities >= 0).all() and not reliabilities[0].any()
    # a tiny change of the audio flips only bits that were close to their threshold
    nudged = audio_fingerprint(samples + rng.standard_normal(16_000).astype(np.float32) * 0.01, 16_000)
    differing = (fingerprint.sub_fingerprints ^ nudged.sub_fingerprints).view(np.uint8).reshape(-1, 4)
    flipped = np.unpackbits(differing, axis=1, bitorder="little").astype(bool)
    assert flipped.sum() >= 3
    assert np.median(reliabilities[flipped]) < np.median(reliabilities[1:]) / 10


def test_soft_probes_hold_the_exact_key_and_find_a_copy_whose_weakest_bit_flipped():
    from benchmarks.accuracy.bench_near_dup_keyspace import soft_probes

    rng = np.random.default_rng(4)
    frames = 60
    values = rng.integers(0, 2**32, frames, dtype=np.uint64).astype(np.uint32)
    reliabilities = rng.uniform(1, 2, (frames, 32))
    original = SimpleNamespace(fingerprint=SimpleNamespace(sub_fingerprints=values, active=np.ones(frames, bool)))
    indexed, _ = wider_audio_keys(2, 16)(values, np.ones(frames, bool))

    assert np.isin(indexed, soft_probes(original, reliabilities, 2, 16, 2)).all()
    copy_values = values.copy()
    reliabilities[:, 5] = 0.01  # bit 5 is every frame's least reliable: the copy flips it everywhere
    copy_values ^= np.uint32(1 << 5)
    copy = SimpleNamespace(fingerprint=SimpleNamespace(sub_fingerprints=copy_values, active=np.ones(frames, bool)))
    copy_keys, _ = wider_audio_keys(2, 16)(copy_values, np.ones(frames, bool))
    assert not np.isin(copy_keys, indexed).any()
    # the key holds bit 5 twice (of n and of n+2): both are the two least reliable, toggled together
    assert not np.isin(indexed, soft_probes(copy, reliabilities, 2, 16, 1)).any()
    assert np.isin(indexed, soft_probes(copy, reliabilities, 2, 16, 2)).all()


def _envelopes_with_a_shared_shape(rng: np.random.Generator, count: int) -> np.ndarray:
    """Envelopes like speech's: a common onset rise and final fall, plus a little of each utterance's
    own, mean removed and unit norm (as ``shift_signature`` stores them)."""
    from speechdata.quality.fingerprint_envelope import ENVELOPE_POINTS

    shape = np.sin(np.linspace(0, np.pi, ENVELOPE_POINTS))
    own = np.cumsum(rng.standard_normal((count, ENVELOPE_POINTS)), axis=1) * 0.05
    envelopes = shape + own
    envelopes -= envelopes.mean(axis=1, keepdims=True)
    return envelopes / np.linalg.norm(envelopes, axis=1, keepdims=True)


def test_random_hashing_of_24_bands_of_14_bits_is_todays_envelope_keys():
    from benchmarks.accuracy.bench_near_dup_keyspace import random_hashing
    from speechdata.quality.fingerprint_envelope import envelope_band_keys
    from speechdata.quality.near_dup_postings import envelope_keys

    hashing = random_hashing(24, 14)
    for envelope in _envelopes_with_a_shared_shape(np.random.default_rng(5), 4):
        assert (hashing.band_keys(envelope) == envelope_band_keys(envelope)).all()
        assert (hashing.pair_keys(envelope) == envelope_keys(envelope)).all()
    assert len(random_hashing(32, 16).pair_keys(envelope)) == len(np.unique(random_hashing(32, 16).pair_keys(envelope)))


def test_whitened_hashing_balances_and_decorrelates_the_bits_of_envelopes_that_share_a_shape():
    from benchmarks.accuracy.bench_near_dup_keyspace import balanced_hashing, random_hashing, whitened_hashing

    rng = np.random.default_rng(6)
    fit, measured = _envelopes_with_a_shared_shape(rng, 600), _envelopes_with_a_shared_shape(rng, 600)

    def off_balance_and_correlation(hashing):
        bits = (measured @ hashing.hyperplanes.T > hashing.thresholds).astype(float)
        varying = bits[:, bits.std(axis=0) > 0]
        correlations = np.corrcoef(varying.T)[np.triu_indices(varying.shape[1], 1)]
        return np.abs(bits.mean(axis=0) - 0.5).mean(), np.abs(correlations).mean()

    plain = off_balance_and_correlation(random_hashing(24, 14))
    balanced = off_balance_and_correlation(balanced_hashing(fit, 24, 14))
    whitened = off_balance_and_correlation(whitened_hashing(fit, 24, 14))
    assert plain[0] > 0.2  # most random hyperplanes see only the shared shape: their bit hardly changes
    assert balanced[0] < 0.03 and balanced[1] > 0.2  # balanced thresholds centre the bits, leave them correlated
    # out of sample, balanced and about as correlated as random hyperplanes on isotropic data (~0.08)
    assert whitened[0] < 0.03 and whitened[1] < balanced[1] / 3
    # its bit is g @ W (e - mean) > 0: the threshold is each hyperplane at the fit's mean
    hashing = whitened_hashing(fit, 24, 14, components=8)
    assert np.allclose(hashing.thresholds, hashing.hyperplanes @ fit.mean(axis=0))
    assert np.linalg.matrix_rank(hashing.hyperplanes) == 8


def test_the_frontier_weighs_a_band_as_random_hyperplanes_draw_it():
    from math import comb

    from benchmarks.accuracy.bench_near_dup_keyspace import _at_least_3_of, _band_agreement, envelope_basis

    rng = np.random.default_rng(7)
    first = rng.standard_normal(64)
    second = 0.8 * first / np.linalg.norm(first) * 8 + rng.standard_normal(64)
    correlation = first @ second / np.linalg.norm(first) / np.linalg.norm(second)
    planes = rng.standard_normal((8_000, 4, 64))  # 8 000 draws of a band of 4 bits
    agreeing = ((planes @ first > 0) == (planes @ second > 0)).all(axis=1).mean()
    assert abs(agreeing - _band_agreement(np.array([correlation]), 4)[0]) < 0.015
    assert _band_agreement(np.array([1.0, 0.0]), 14).tolist() == [1.0, 0.5**14]
    share = np.array([0.2])
    assert np.isclose(_at_least_3_of(24, share)[0], sum(comb(24, k) * 0.2**k * 0.8 ** (24 - k) for k in range(3, 25)))
    # strength 0, every component, not centred: a rotation, so today's correlations
    fit = _envelopes_with_a_shared_shape(rng, 500)
    rotated = envelope_basis(fit, 0.0, None, False)(fit[:2])
    assert np.isclose(rotated[0] @ rotated[1], fit[0] @ fit[1], atol=1e-6)
    whitened = envelope_basis(fit, 1.0, None, True)(fit)
    assert np.allclose(np.cov(whitened.T), np.eye(whitened.shape[1]), atol=1e-6)
