"""DurationBucketBatchSampler: the original sampler's properties, and equality with the plain-Python oracle."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speechdata.asr.sampler import DurationBucketBatchSampler, durations_to_ms, pack_greedy
from tests.unit.asr_sampler_reference import reference_rank_batches

BOUNDARIES = (3.0, 5.0, 8.0, 12.0, 16.0)


def corpus(seed: int, n: int, languages=("hi", "en", "ta", "as"), shares=(0.6, 0.3, 0.08, 0.02)):
    rng = np.random.default_rng(seed)
    durations = np.round(rng.uniform(0.3, 22.0, n), 3)
    langs = rng.choice(np.array(languages), size=n, p=np.array(shares) / sum(shares))
    return durations, langs


sampler_args = st.fixed_dictionaries(
    {
        "n": st.integers(0, 300),
        "data_seed": st.integers(0, 10_000),
        "world_size": st.integers(1, 4),
        "grad_accum": st.integers(1, 4),
        "temperature": st.sampled_from([0.0, 0.3, 1.0]),
        "max_batch_duration_s": st.sampled_from([10.0, 30.0, 90.0]),
        "seed": st.integers(0, 1000),
        "epoch": st.integers(0, 5),
    }
)


def build(args, rank=0, **overrides):
    durations, langs = corpus(args["data_seed"], args["n"])
    params = {k: args[k] for k in ("world_size", "grad_accum", "temperature", "max_batch_duration_s", "seed", "epoch")}
    return durations, langs, DurationBucketBatchSampler(durations, langs, rank=rank, **{**params, **overrides})


@settings(max_examples=40, deadline=None)
@given(sampler_args)
def test_every_rank_gets_the_same_number_of_batches_divisible_by_grad_accum(args):
    lengths = {len(build(args, rank=r)[2]) for r in range(args["world_size"])}
    assert len(lengths) == 1
    assert lengths.pop() % args["grad_accum"] == 0


@settings(max_examples=40, deadline=None)
@given(sampler_args)
def test_batches_come_from_one_bucket_and_respect_the_cap(args):
    durations, _, sampler = build(args)
    buckets = np.searchsorted(BOUNDARIES, durations, side="right")
    cap_ms = durations_to_ms(np.array([args["max_batch_duration_s"]]))[0]
    for batch in sampler:
        assert len(set(buckets[batch])) == 1
        total_ms = durations_to_ms(durations[batch]).sum()
        assert total_ms <= cap_ms or len(batch) == 1


@settings(max_examples=25, deadline=None)
@given(sampler_args)
def test_ranks_hold_disjoint_batches(args):
    seen = []
    for r in range(args["world_size"]):
        for batch in build(args, rank=r)[2]:
            seen.extend(batch)
    assert len(seen) == len(set(seen))


@settings(max_examples=25, deadline=None)
@given(sampler_args)
def test_deterministic_for_seed_and_epoch_and_reshuffled_by_set_epoch(args):
    _, _, first = build(args)
    _, _, second = build(args)
    assert list(first) == list(second)
    before = list(first)
    first.set_epoch(args["epoch"] + 1)
    again = build(args, epoch=args["epoch"] + 1)[2]
    assert list(first) == list(again)
    if len(before) >= 4:
        assert list(first) != before


@settings(max_examples=60, deadline=None)
@given(sampler_args, st.integers(0, 3))
def test_equal_to_the_plain_python_reference(args, rank):
    rank = rank % args["world_size"]
    durations, langs, sampler = build(args, rank=rank)
    expected = reference_rank_batches(
        durations.tolist(),
        langs.tolist(),
        rank=rank,
        **{k: args[k] for k in ("world_size", "grad_accum", "temperature", "max_batch_duration_s", "seed", "epoch")},
    )
    assert list(sampler) == expected


def test_equal_to_the_reference_on_exact_sums_and_ties():
    # Thirty 3.0 s clips fill a 90 s cap exactly; equal costs keep the original sampler's stable order.
    durations = [3.0] * 60 + [1.5] * 20 + [50.0] * 3
    langs = ["en"] * 50 + ["hi"] * 33
    sampler = DurationBucketBatchSampler(durations, langs, world_size=2, rank=1, seed=7)
    assert list(sampler) == reference_rank_batches(durations, langs, world_size=2, rank=1, seed=7)
    assert sorted(len(b) for b in DurationBucketBatchSampler(durations, langs, world_size=1)) == [1, 1, 1, 20, 30, 30]


def test_pack_greedy_never_crosses_a_bucket_run():
    offsets = pack_greedy(np.array([40, 40, 40, 40, 100]), np.array([3, 5]), 90)
    assert offsets.tolist() == [0, 2, 3, 4, 5]


def test_languages_weighted_toward_uniform_come_first_inside_a_bucket():
    durations = np.full(20_000, 2.0)
    langs = np.array(["en"] * 18_000 + ["as"] * 2_000)
    shares = {}
    for temperature in (1.0, 0.3, 0.0):
        sampler = DurationBucketBatchSampler(
            durations,
            langs,
            temperature=temperature,
            max_batch_duration_s=20.0,
            epoch_fraction=0.25,
            seed=3,
        )
        kept = np.concatenate(sampler.batches())
        shares[temperature] = float(np.mean(langs[kept] == "as"))
    # T = 1: the natural 10 %; T = 0.3: target 0.5^... toward uniform; T = 0: even closer to 50 %.
    assert abs(shares[1.0] - 0.10) < 0.02
    assert shares[1.0] < shares[0.3] < shares[0.0]
    target_03 = 2000**0.3 / (2000**0.3 + 18000**0.3)
    assert shares[0.3] > 0.10 + 0.5 * (target_03 - 0.10)


def test_full_epochs_keep_the_natural_language_mix_as_the_seeds_algorithm_does():
    durations, langs = corpus(5, 20_000)
    natural = Counter(langs.tolist())
    sampler = DurationBucketBatchSampler(durations, langs, temperature=0.0, world_size=1, seed=1)
    used = Counter(langs[np.concatenate(sampler.batches())].tolist())
    assert used == natural  # every utterance is packed: temperature only changes who shares a batch


def test_rejects_inconsistent_arguments():
    with pytest.raises(ValueError):
        DurationBucketBatchSampler([1.0], ["en", "hi"])
    with pytest.raises(ValueError):
        DurationBucketBatchSampler([1.0], ["en"], world_size=2, rank=2)
