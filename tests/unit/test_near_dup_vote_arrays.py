"""The near-duplicate vote's array work, done in fewer passes, gives what the plain NumPy forms gave:
the postings' sort, the popcount of contexts, the lookup of an utterance's keys, the (owner, offset)
vote count and each owner's best offset, ties included. The decisions tests (capped, skip,
exactness, planted set) compare whole shards; these pin the orders those might not meet."""

from __future__ import annotations

import numpy as np
import pytest

from speechdata.quality.near_dup_candidates import (
    _best_offset_per_owner,
    _first_places,
    _key_postings,
    _pair_votes,
    _PostingColumns,
    _value_counts,
)
from speechdata.quality.near_dup_postings import (
    POSTING_DTYPE,
    context_bit_errors,
    merge_earlier_postings,
    merged_fields,
    sort_postings,
)


def _postings(rng: np.random.Generator, count: int, keys: int, owners: int) -> np.ndarray:
    made = np.zeros(count, POSTING_DTYPE)
    made["key"] = rng.integers(0, keys, count).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    made["owner"] = rng.integers(0, owners, count)
    made["frame"] = rng.integers(0, 6, count)
    made["context"] = np.arange(count)  # tells apart postings equal on (key, owner, frame)
    return made


def _lexsorted(postings: np.ndarray) -> np.ndarray:
    return postings[np.lexsort((postings["frame"], postings["owner"], postings["key"]))]


@pytest.mark.parametrize("seed", range(4))
def test_sort_postings_is_the_stable_three_key_sort_for_runs_and_for_any_order(seed):
    rng = np.random.default_rng(seed)
    scattered = _postings(rng, 3_000, 40, 30)
    assert sort_postings(scattered).tobytes() == _lexsorted(scattered).tobytes()
    # Runs in owner order, each sorted (what a lookup's segments and a shard's own postings give),
    # with postings equal on (key, owner, frame): the fast path keeps their given order.
    runs = [_lexsorted(_postings(rng, 500, 40, 10)) for _ in range(3)]
    for number, run in enumerate(runs):
        run["owner"] += number * 10
    joined = np.concatenate(runs)
    joined["context"] = np.arange(len(joined))
    assert sort_postings(joined).tobytes() == _lexsorted(joined).tobytes()
    # The same runs out of owner order: within a key, owners fall back, and the result is the same.
    shuffled = np.concatenate([runs[2], runs[0], runs[1]])
    assert sort_postings(shuffled).tobytes() == _lexsorted(shuffled).tobytes()
    assert len(sort_postings(scattered[:0])) == 0


def test_context_bit_errors_count_every_differing_bit():
    rng = np.random.default_rng(5)
    first = rng.integers(0, 2**63, 2_000, dtype=np.int64).astype(np.uint64) * np.uint64(3)
    second = first ^ rng.integers(0, 2**63, 2_000, dtype=np.int64).astype(np.uint64)
    second[:3] = first[:3]
    expected = [bin(int(a) ^ int(b)).count("1") for a, b in zip(first.tolist(), second.tolist(), strict=True)]
    assert context_bit_errors(first, second).tolist() == expected
    assert context_bit_errors(np.array([0], np.uint64), np.array([2**64 - 1], np.uint64)).tolist() == [64]


def test_an_utterances_keys_find_every_earlier_posting_of_theirs_in_order():
    rng = np.random.default_rng(11)
    postings = _lexsorted(_postings(rng, 4_000, 200, 50))
    keys = np.concatenate([postings["key"][rng.integers(0, len(postings), 60)], [np.uint64(5), np.uint64(2**64 - 1)]])
    which, found = _key_postings(_PostingColumns.of(postings), keys, before=30)
    expected = [
        (number, at)
        for number, key in enumerate(keys.tolist())
        for at in np.flatnonzero((postings["key"] == key) & (postings["owner"] < 30)).tolist()
    ]
    assert list(zip(which.tolist(), found.tolist(), strict=True)) == expected
    assert [len(part) for part in _key_postings(_PostingColumns.of(postings[:0]), keys, 30)] == [0, 0]


@pytest.mark.parametrize("seed", range(3))
def test_pair_votes_and_best_offsets_are_np_unique_and_the_first_by_votes_then_owner_then_offset(seed):
    rng = np.random.default_rng(seed)
    owners = rng.integers(0, 12, 800).astype(np.int64) << 24
    offsets = rng.integers(-4, 4, 800).astype(np.int64)  # few values: many tied votes
    pairs, votes = _pair_votes(owners, offsets)
    expected_pairs, expected_votes = np.unique(np.stack([owners, offsets], axis=1), axis=0, return_counts=True)
    assert pairs.tolist() == expected_pairs.tolist() and votes.tolist() == expected_votes.tolist()
    # The rule as a loop: most votes first, the smaller owner on a tie, an owner's first pair (its
    # smallest offset among equal votes) kept.
    seen, expected = set(), []
    for index in sorted(range(len(votes)), key=lambda i: (-votes[i], pairs[i, 0], pairs[i, 1])):
        if votes[index] >= 3 and int(pairs[index, 0]) not in seen:
            seen.add(int(pairs[index, 0]))
            expected.append((int(pairs[index, 0]), int(pairs[index, 1])))
    assert _best_offset_per_owner(pairs, votes, 3) == expected
    assert _best_offset_per_owner(pairs, votes, 10_000) == []


def test_merged_fields_are_the_merged_postings_field_by_field():
    rng = np.random.default_rng(3)
    own = _lexsorted(_postings(rng, 1_500, 60, 5))
    own["owner"] += 100  # every owner of the shard after every earlier one
    earlier = _postings(rng, 2_000, 80, 100)
    for found in (earlier, earlier[:0]):
        merged = merge_earlier_postings(found, own)
        fields = merged_fields(found, own)
        assert {name: fields[name].tobytes() for name in POSTING_DTYPE.names} == {
            name: np.ascontiguousarray(merged[name]).tobytes() for name in POSTING_DTYPE.names
        }


def test_envelope_owner_counts_and_first_places_are_np_uniques():
    rng = np.random.default_rng(9)
    owners = np.concatenate([np.sort(rng.integers(0, 300, 40)) for _ in range(20)]).astype(np.int64)
    values, counts = _value_counts(owners)
    expected_values, expected_first, expected_counts = np.unique(owners, return_index=True, return_counts=True)
    assert values.tolist() == expected_values.tolist() and counts.tolist() == expected_counts.tolist()
    wanted = expected_values[rng.permutation(len(expected_values))[:16]]
    first_of = dict(zip(expected_values.tolist(), expected_first.tolist(), strict=True))
    assert _first_places(owners, wanted).tolist() == [first_of[owner] for owner in wanted.tolist()]
    assert [len(part) for part in _value_counts(owners[:0])] == [0, 0]
    assert len(_first_places(owners, wanted[:0])) == 0
