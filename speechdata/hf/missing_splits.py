"""Why a country's config lacks a split the split rule promises (``test``, ``validation``, a ``train_<n>``).

The rule (docs/hf-splits.md) fills ``test`` and ``validation`` once a country has three recordings
and puts every other recording in train; a config can still lack one: too few recordings, every
segment of a split's recordings filtered, segments not written yet. The card and ``hf_dataset``'s
metadata state the reason, read from the country's state, instead of leaving a reader to guess.
"""

from __future__ import annotations

from speechdata.hf.splits import TEST, TRAIN, VALIDATION
from speechdata.hf.state import read_state
from speechdata.io import layout
from speechdata.io.storage import DataRoot

PROMISED_SPLITS = (TEST, VALIDATION, TRAIN)
"""The splits every config should have; ``train`` stands for its subsets ``train_<n>``."""
RECORDINGS_FOR_EVALUATION_SPLITS = 3
"""From this many recordings the rule always fills ``test`` and ``validation`` (rule 4)."""


def split_kind(split: str) -> str:
    """``train_3`` -> ``train``; ``test`` and ``validation`` are their own kind."""
    return TRAIN if split.startswith(f"{TRAIN}_") else split


def missing_split_reasons(data_root: DataRoot, dataset: str, country: str, present: set[str]) -> dict[str, str]:
    """``{split: why it has no file}`` for each promised split that ``present`` (the country's split names) lacks."""
    kinds = {split_kind(split) for split in present}
    missing = [split for split in PROMISED_SPLITS if split not in kinds]
    if not missing:
        return {}
    state_path = layout.hf_state_database(dataset, country)
    if not data_root.exists(state_path):
        return {split: "the country has not been built" for split in missing}
    with read_state(data_root, state_path) as db:
        recordings = dict(db.execute("SELECT split, count(*) FROM recordings GROUP BY split").fetchall())
        statuses = db.execute(
            "SELECT split, status, coalesce(reason, ''), count(*) FROM segments "
            "WHERE status <> 'withdrawn' GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    total = sum(recordings.values())
    reasons = {}
    for split in missing:
        in_split = [(status, reason, n) for s, status, reason, n in statuses if s == split]
        if not recordings.get(split):
            reasons[split] = _no_recording(split, total)
        elif all(status == "filtered" for status, _, _ in in_split):
            filtered = ", ".join(f"{reason or 'filtered'}: {n}" for _, reason, n in in_split)
            reasons[split] = (
                f"every segment of its {recordings[split]} recording(s) is filtered ({filtered or 'no segment'})"
            )
        else:
            waiting = ", ".join(f"{status}: {n}" for status, _, n in in_split if status != "filtered")
            reasons[split] = f"its segments are not written yet ({waiting})"
    return reasons


def _no_recording(split: str, total: int) -> str:
    if split == TRAIN:
        return f"no recording is assigned to train ({total} recording(s) in the country, all held out for evaluation)"
    return (
        f"no recording is assigned to {split}: the country has {total} recording(s), and the split rule fills "
        f"test and validation from {RECORDINGS_FOR_EVALUATION_SPLITS} (docs/hf-splits.md, rule 4), "
        "or its target share is 0"
    )
