"""One country's whole refresh, as ``hf_split_assignments`` then ``hf_dataset`` run it, for callers
outside Dagster (benchmarks, scripts): assign the changed shards' segments, check their ledgers,
write the changed parts, the card, and the changed shards' published indexes."""

from __future__ import annotations

from dataclasses import dataclass

from speechdata.hf.accounting import require_balanced_country
from speechdata.hf.assignment import AssignmentSummary, refresh_split_assignments
from speechdata.hf.card import write_dataset_card
from speechdata.hf.dataset import BuildSummary, DatasetOptions, build_country_dataset
from speechdata.hf.publish import register_card
from speechdata.hf.published_index import write_published_indexes
from speechdata.hf.splits import SplitTargets
from speechdata.io.storage import DataRoot


@dataclass
class CountryBuild:
    assignment: AssignmentSummary
    build: BuildSummary
    shards_checked: int
    """Shards whose ``hf`` ledger the gate checked (the changed ones)."""
    shards_indexed: int
    """Shards whose published index was written (the changed ones)."""


def refresh_country(
    data_root: DataRoot,
    country: str,
    options: DatasetOptions | None = None,
    targets: SplitTargets | None = None,
    seed: int = 0,
) -> CountryBuild:
    """``hf_split_assignments`` and ``hf_dataset`` for ``country``: raises
    :class:`~speechdata.accounting.ledger_gate.UnbalancedLedger` (after writing the indexes) when a shard's
    ``hf`` ledger does not balance."""
    options = options or DatasetOptions()
    targets = targets or SplitTargets()
    assignment = refresh_split_assignments(data_root, options.dataset, country, options.limits, targets, seed)
    try:
        ledgers = require_balanced_country(data_root, options.dataset, country)
    except Exception:
        write_published_indexes(data_root, options.dataset, country)
        raise
    build = build_country_dataset(data_root, country, options)
    write_dataset_card(data_root, options.dataset)
    register_card(data_root, options.dataset, country)
    indexed = write_published_indexes(data_root, options.dataset, country)
    return CountryBuild(assignment, build, len(ledgers), len(indexed))
