"""Split assignment: whole recordings, duration shares near target, stable as data arrives, seeded."""

import re

import numpy as np
import pytest

from speechdata.hf.splits import SplitTargets, assign_splits, split_shares, train_subset_name


def synthetic_durations(n: int, seed: int, prefix: str = "rec") -> dict[str, float]:
    rng = np.random.default_rng(seed)
    return {f"{prefix}{i:05d}": float(d) for i, d in enumerate(rng.lognormal(np.log(600), 0.8, n))}


def test_shares_are_within_one_recording_of_target_on_a_synthetic_corpus():
    durations = synthetic_durations(3000, seed=1)
    splits = assign_splits(durations, {}, SplitTargets(test=0.01, validation=0.02), seed=7)
    shares = split_shares(durations, splits)
    tolerance = max(durations.values()) / sum(durations.values())
    assert abs(shares["test"] - 0.01) <= tolerance
    assert abs(shares["validation"] - 0.02) <= tolerance
    assert abs(shares["train"] - 0.97) <= 2 * tolerance


def test_recordings_assigned_before_keep_their_split_when_a_second_batch_arrives():
    first = synthetic_durations(1500, seed=2, prefix="a")
    existing = assign_splits(first, {}, seed=3)
    second = {**first, **synthetic_durations(1500, seed=4, prefix="b")}
    added = assign_splits(second, existing, seed=3)
    assert set(added) == set(second) - set(first)  # only new recordings are (re)assigned
    combined = {**existing, **added}
    shares = split_shares(second, combined)
    tolerance = max(second.values()) / sum(second.values())
    assert abs(shares["test"] - 0.01) <= tolerance and abs(shares["validation"] - 0.01) <= tolerance


def test_a_recording_is_in_exactly_one_split():
    durations = synthetic_durations(500, seed=5)
    splits = assign_splits(durations, {}, seed=0)
    assert set(splits) == set(durations)
    assert set(splits.values()) <= {"train", "test", "validation"}


def test_same_seed_same_assignment_other_seed_other_assignment():
    durations = synthetic_durations(800, seed=6)
    assert assign_splits(durations, {}, seed=11) == assign_splits(dict(reversed(list(durations.items()))), {}, seed=11)
    assert assign_splits(durations, {}, seed=11) != assign_splits(durations, {}, seed=12)


def test_small_countries_still_get_test_and_validation_recordings():
    splits = assign_splits({"r1": 100.0, "r2": 100.0, "r3": 100.0}, {}, seed=0)
    assert sorted(splits.values()) == ["test", "train", "validation"]
    assert assign_splits({"only": 50.0}, {}, seed=0) == {"only": "train"}


def test_unknown_existing_split_is_an_error():
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        assign_splits({"r1": 1.0}, {"r1": "dev"})


def test_shares_must_leave_room_for_train():
    with pytest.raises(ValueError, match="leave room for train"):
        SplitTargets(test=0.5, validation=0.5)


def test_train_subset_names_are_valid_datasets_split_names():
    from datasets.naming import _split_re

    assert train_subset_name(12) == "train_12"
    assert re.match(_split_re, train_subset_name(12))
    assert not re.match(_split_re, "train-12")  # why the original split name could not be used


def test_a_shard_at_a_time_the_split_totals_alone_give_the_same_assignments_and_shares_near_target():
    from speechdata.hf.splits import SPLITS, assign_new_splits

    targets = SplitTargets(test=0.01, validation=0.01)
    batches = [synthetic_durations(40, seed=10 + b, prefix=f"s{b}-") for b in range(50)]
    assigned: dict[str, str] = {}
    durations: dict[str, float] = {}
    for batch in batches:
        totals = {
            split: (
                sum(1 for s in assigned.values() if s == split),
                sum(durations[r] for r, s in assigned.items() if s == split),
            )
            for split in SPLITS
        }
        new = assign_new_splits(batch, totals, targets, seed=5)
        # The same as from every recording assigned so far: only the totals matter.
        assert new == assign_splits({**durations, **batch}, assigned, targets, seed=5)
        assert not set(new) & set(assigned)  # nothing assigned before moves
        assigned.update(new)
        durations.update(batch)
    shares = split_shares(durations, assigned)
    tolerance = max(durations.values()) / sum(durations.values())
    assert abs(shares["test"] - 0.01) <= tolerance and abs(shares["validation"] - 0.01) <= tolerance
