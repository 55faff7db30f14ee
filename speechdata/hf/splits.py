"""Which split each source recording belongs to: whole recordings, by duration share, stable.

A recording (one long source file) is the unit: all its segments go to one split, so no speaker
session leaks between train and test. Assignments only ever grow: a recording once assigned keeps
its split forever, and recordings that arrive later are assigned so that the duration shares stay
close to the targets.

The rule: new recordings are visited in a seeded pseudo-random order (a hash of seed and recording
id, so the order of one recording never depends on which others exist), and each goes to the split
with the largest duration deficit ``target_share * total_after - assigned``, where ``total_after``
includes the recording. An evaluation split with a positive target that is still empty is served
first once train has a recording, so any country with three or more recordings has non-empty
``test`` and ``validation`` splits.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

TEST = "test"
VALIDATION = "validation"
TRAIN = "train"
SPLITS = (TRAIN, TEST, VALIDATION)


@dataclass(frozen=True)
class SplitTargets:
    """Target duration shares of the evaluation splits; train gets the rest."""

    test: float = 0.01
    validation: float = 0.01

    def __post_init__(self):
        if self.test < 0 or self.validation < 0 or self.test + self.validation >= 1:
            raise ValueError(
                f"split shares must be >= 0 and leave room for train: test={self.test}, validation={self.validation}"
            )

    def shares(self) -> dict[str, float]:
        return {TRAIN: 1.0 - self.test - self.validation, TEST: self.test, VALIDATION: self.validation}


def assignment_order(recording_id: str, seed: int) -> str:
    """The sort key that fixes when a new recording is assigned (seeded, independent of the others)."""
    return hashlib.sha256(f"{seed}:{recording_id}".encode()).hexdigest()


def assign_splits(
    durations_s: Mapping[str, float],
    existing: Mapping[str, str],
    targets: SplitTargets = SplitTargets(),
    seed: int = 0,
) -> dict[str, str]:
    """Splits of the recordings in ``durations_s`` that ``existing`` does not assign yet.

    ``durations_s`` maps every current recording id to its usable duration; ``existing`` maps
    already assigned recording ids to their split (never changed). Returns only new assignments.
    """
    for recording_id, split in existing.items():
        if split not in SPLITS:
            raise ValueError(f"recording {recording_id!r} has unknown split {split!r}; expected one of {SPLITS}")
    totals: dict[str, tuple[int, float]] = {}
    for recording_id, split in existing.items():
        count, seconds = totals.get(split, (0, 0.0))
        totals[split] = (count + 1, seconds + float(durations_s.get(recording_id, 0.0)))
    new = {r: float(d) for r, d in durations_s.items() if r not in existing}
    return assign_new_splits(new, totals, targets, seed)


def assign_new_splits(
    new_durations_s: Mapping[str, float],
    totals: Mapping[str, tuple[int, float]],
    targets: SplitTargets = SplitTargets(),
    seed: int = 0,
) -> dict[str, str]:
    """Splits of the recordings in ``new_durations_s`` (none assigned yet), given what is assigned:
    ``totals`` maps a split to its ``(recordings, seconds)``. Only the totals are needed, never the
    assigned recordings themselves, so assigning a new shard's recordings costs what the shard holds."""
    for split in totals:
        if split not in SPLITS:
            raise ValueError(f"assigned split {split!r} is unknown; expected one of {SPLITS}")
    shares = targets.shares()
    assigned = {split: float(totals.get(split, (0, 0.0))[1]) for split in SPLITS}
    count = {split: int(totals.get(split, (0, 0.0))[0]) for split in SPLITS}
    new_ids = sorted(new_durations_s, key=lambda r: assignment_order(r, seed))
    result: dict[str, str] = {}
    for recording_id in new_ids:
        duration = float(new_durations_s[recording_id])
        total_after = sum(assigned.values()) + duration
        empty_eval = [s for s in (TEST, VALIDATION) if shares[s] > 0 and count[s] == 0]
        if count[TRAIN] > 0 and empty_eval:
            split = empty_eval[0]
        else:
            split = max(SPLITS, key=lambda s: (shares[s] * total_after - assigned[s], -SPLITS.index(s)))
        result[recording_id] = split
        assigned[split] += duration
        count[split] += 1
    return result


def split_shares(durations_s: Mapping[str, float], splits: Mapping[str, str]) -> dict[str, float]:
    """Duration share of each split over the recordings in ``splits``."""
    totals = {split: 0.0 for split in SPLITS}
    for recording_id, split in splits.items():
        totals[split] += float(durations_s[recording_id])
    grand = sum(totals.values()) or 1.0
    return {split: total / grand for split, total in totals.items()}


def train_subset_name(subset_id: int) -> str:
    """``train_<n>``. The original publishing script's ``train-<n>`` is not a valid split name for
    ``datasets`` (split names must match ``\\w+(\\.\\w+)*``), so the hyphen becomes an
    underscore."""
    return f"{TRAIN}_{subset_id}"
