"""One ledger per product line: landed = that product's outputs + distinct rejects of its stages.

Each stage writes ``shards/<shard>/rejects/<stage>.parquet``. A product counts only the ledgers of
the stages it depends on (its :class:`~speechdata.products.ProductLine`'s ``stages``), so
materializing any selection of a shard's assets (the translation group without its LLM
segmentation, say) never makes another product's accounting fail. Ledgers are opened by their
stage's name, never by a glob: a temp file left by a killed writer (``._tmp-...``) is never read.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from dataclasses import dataclass, field

from speechdata import products
from speechdata.io import layout
from speechdata.io.confinement import confined_landed_shard
from speechdata.io.storage import DataRoot

PRODUCT_STAGES: dict[str, tuple[str, ...]] = {line.name: line.stages for line in products.PRODUCT_LINES}
"""Product line -> the stages (in pipeline order) whose rejects it owns, as registered at import
(:data:`speechdata.products.PRODUCT_LINES`, which the functions here read at call time)."""

PRODUCT_OUTPUTS: dict[str, str] = {
    line.name: f"{line.output('<shard>')} ({line.id_column})" for line in products.PRODUCT_LINES
}
"""Where each product's per-shard outputs are counted (one utterance id per produced utterance)."""


@dataclass(frozen=True)
class Ledger:
    """One product's accounting for one shard."""

    product: str
    landed: int
    produced: int
    rejected: int
    unaccounted: list[str]
    produced_and_rejected: list[str]
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    """Each rejected utterance once, under the reason of the earliest stage that rejected it."""

    @property
    def balanced(self) -> bool:
        return not self.unaccounted and not self.produced_and_rejected and self.landed == self.produced + self.rejected


def landed_utterances(data_root: DataRoot, shard_id: str) -> tuple[set[str], int]:
    """The landed metadata's distinct utt ids and its count of null ids."""
    confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)
    column = data_root.read_parquet(layout.landing_metadata(shard_id), columns=["utt_id"])["utt_id"]
    # Not pyarrow.compute: its first call in a process imports pandas (seconds, for every gate's first shard).
    return {utt_id for utt_id in column.to_pylist() if utt_id is not None}, column.null_count


def product_ledger(
    data_root: DataRoot, shard_id: str, product: str, produced: set[str], stages: tuple[str, ...] | None = None
) -> Ledger:
    """Balance ``produced`` (the product's utterance ids for the shard) against landed and rejected.
    ``stages``: whose rejects count, when not all of the product's (a gate that runs before a stage)."""
    line = products.product_line(product)
    stages = line.stages if stages is None else stages
    if line.id_part_separator:  # a part (a long recording's segment) accounts for its utterance
        produced = {value.split(line.id_part_separator, 1)[0] for value in produced}
    landed_ids, landed_nulls = landed_utterances(data_root, shard_id)
    reason_of: dict[str, str] = {}
    null_reasons: Counter[str] = Counter()
    for stage in stages:
        relative = layout.rejects(shard_id, stage)
        if not data_root.exists(relative):
            continue
        table = data_root.read_parquet(relative, columns=["utt_id", "reason"])
        for utt_id, reason in zip(table["utt_id"].to_pylist(), table["reason"].to_pylist(), strict=True):
            if utt_id is None:
                null_reasons[reason] += 1  # a row without an id stands for itself
            else:
                reason_of.setdefault(utt_id, reason)
    by_reason = Counter(reason_of.values()) + null_reasons
    rejected = set(reason_of)
    # Duplicated landed ids are rejected once per row but are one distinct id here; a row without an
    # id is rejected once per row, so null rows balance against null rejects.
    return Ledger(
        product=product,
        landed=len(landed_ids) + landed_nulls,
        produced=len(produced),
        rejected=len(rejected & landed_ids) + min(sum(null_reasons.values()), landed_nulls),
        unaccounted=sorted(landed_ids - produced - rejected),
        produced_and_rejected=sorted(produced & rejected),
        rejects_by_reason=dict(sorted(by_reason.items())),
    )


def produced_utterances(data_root: DataRoot, shard_id: str, product: str) -> set[str] | None:
    """The product's committed utterance ids for the shard, or None when it has not been built."""
    line = products.product_line(product)
    relative = line.output(shard_id)
    if line.output_has_parts:
        folder = posixpath.dirname(relative)
        parts = sorted(f"{folder}/{posixpath.basename(path)}" for path in data_root.glob(relative))
    else:
        parts = [relative] if data_root.exists(relative) else []
    if not parts:
        return None
    values = [
        value
        for part in parts
        for value in data_root.read_parquet(part, columns=[line.id_column])[line.id_column].to_pylist()
    ]
    if line.ids_are_lists:
        return {u for ids in values for u in (ids or [])}
    if line.id_part_separator:  # every part of an utterance accounts for it
        return {value.split(line.id_part_separator, 1)[0] for value in values}
    return set(values)


def shard_ledgers(data_root: DataRoot, shard_id: str) -> dict[str, Ledger]:
    """Every product line's ledger for the shard, in registry order, for the products it has outputs of."""
    ledgers = {}
    for line in products.product_lines():
        produced = produced_utterances(data_root, shard_id, line.name)
        if produced is not None:
            ledgers[line.name] = product_ledger(data_root, shard_id, line.name, produced)
    return ledgers


def ledger_markdown(ledgers: dict[str, Ledger]) -> str:
    """A markdown table: one row per product and reason, then one row per product's totals."""
    lines = ["| product | landed | produced | rejected | balanced | rejects by reason |", "|---|---|---|---|---|---|"]
    for product, ledger in ledgers.items():
        reasons = ", ".join(f"{reason}: {count}" for reason, count in ledger.rejects_by_reason.items()) or "-"
        lines.append(
            f"| {product} | {ledger.landed} | {ledger.produced} | {ledger.rejected} | "
            f"{'yes' if ledger.balanced else 'NO'} | {reasons} |"
        )
    return "\n".join(lines)


def ledger_numbers(ledgers: dict[str, Ledger]) -> dict[str, int]:
    """The one number that plots the ledgers across partitions: how many products do not balance.

    Per product and per reason counts are in :func:`ledger_markdown`'s table and the catalog's
    ``product_accounting`` view, not in one metadata key each (dozens of keys hide the few that matter)."""
    return {"unbalanced_products": sum(1 for ledger in ledgers.values() if not ledger.balanced)}
