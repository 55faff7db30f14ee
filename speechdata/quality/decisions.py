"""What each product leaves out of a shard for quality: the one function the product stages read.

:func:`excluded_utterances` unions the shard's quality decisions for the product with its
near-duplicate list (``shards/<shard>/near_duplicates.parquet``, written by the near-duplicate
stage; every row is an utterance rejected as ``near_duplicate``). The stage that builds the product
skips these utterances and records each as a reject of its own stage with the reason given here, so
the product's ledger still balances (docs/ledgers.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow.compute as pc

from speechdata.accounting.rejects import Reject
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.paths import near_duplicates, quality_decisions

NEAR_DUPLICATE = "near_duplicate"
NEAR_DUPLICATE_COLUMNS = ("utt_id", "representative_shard", "representative_utt", "kind", "similarity")

Exclusions = Mapping[str, tuple[str, str]]
"""``{utt_id: (reason, detail)}``."""

TOO_LONG = "too_long"
SEGMENTED_PRODUCTS = ("bridge", "asr")
"""Products that publish a long recording as its aligned segments (at most ``MAX_SEGMENT_MS`` each), so
the policy's longest-utterance rule judges the segments, not the recording."""


def excluded_utterances(data_root: DataRoot, shard_id: str, product: str) -> dict[str, tuple[str, str]]:
    """``{utt_id: (reason, detail)}`` of every utterance of the shard ``product`` must leave out.

    Empty for a shard whose decisions and near-duplicate list are not written yet. A quality reason
    wins over ``near_duplicate`` for an utterance that has both (it would fail on its own)."""
    excluded: dict[str, tuple[str, str]] = {}
    relative = quality_decisions(shard_id)
    if data_root.exists(relative):
        table = data_root.read_parquet(relative, columns=["utt_id", "product", "reason", "detail"])
        table = table.filter(pc.and_(pc.equal(table["product"], product), pc.is_valid(table["reason"])))
        for utt_id, reason, detail in zip(
            table["utt_id"].to_pylist(), table["reason"].to_pylist(), table["detail"].to_pylist(), strict=True
        ):
            excluded[utt_id] = (reason, f"quality: {detail}")
        if product in SEGMENTED_PRODUCTS:
            for utt_id in _segmented_for_length_alone(data_root, shard_id, excluded):
                del excluded[utt_id]
    relative = near_duplicates(shard_id)
    if data_root.exists(relative):
        table = data_root.read_parquet(relative)
        missing = [c for c in NEAR_DUPLICATE_COLUMNS if c not in table.column_names]
        if missing:
            raise ValueError(f"{data_root.uri(relative)}: missing column(s) {missing}")
        for row in table.select(list(NEAR_DUPLICATE_COLUMNS)).to_pylist():
            excluded.setdefault(
                row["utt_id"],
                (
                    NEAR_DUPLICATE,
                    f"{row['kind']} near duplicate of {row['representative_shard']}/{row['representative_utt']}"
                    f" (similarity {row['similarity']})",
                ),
            )
    return excluded


def _segmented_for_length_alone(data_root: DataRoot, shard_id: str, excluded: Exclusions) -> set[str]:
    """The utterances failed on their length alone that the ``alignments`` stage cut into ``segment``
    rows: published as those segments."""
    length_only = [u for u, exclusion in excluded.items() if failed_on_length_alone(exclusion)]
    if not length_only or not data_root.exists(layout.alignments(shard_id)):
        return set()
    table = data_root.read_parquet(layout.alignments(shard_id), columns=["utt_id", "level"])
    table = table.filter(pc.equal(table["level"], "segment"))
    return set(length_only) & set(pc.unique(table["utt_id"]).to_pylist())


def failed_on_length_alone(exclusion: tuple[str, str]) -> bool:
    """The quality policy failed the utterance on its length alone (a decision's detail lists every other
    rule that failed as "(also ...)")."""
    reason, detail = exclusion
    return reason == TOO_LONG and "(also " not in detail


def exclusion_rejects(excluded: Exclusions, utt_ids: Iterable[str], stage: str) -> list[Reject]:
    """The rejects ``stage`` records for the utterances of ``utt_ids`` that are excluded, in input order."""
    return [Reject(u, stage, *excluded[u]) for u in utt_ids if u in excluded]
