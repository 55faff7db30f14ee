"""Every product's ledger gates its own publishing: an unbalanced shard publishes nothing.

The bridge refuses to commit a shard manifest whose ledger does not balance; the ASR manifests,
the VAD language index, the translation pairs and the Hugging Face dataset do the same through
:func:`require_balanced`. A ledger that does not balance means an utterance was lost or counted
twice somewhere: publishing then would ship a product that disagrees with its accounting.
"""

from __future__ import annotations

from speechdata.accounting.ledgers import Ledger, landed_utterances, product_ledger
from speechdata.io.storage import DataRoot

SHOWN_IDS = 5
"""How many unaccounted ids an error names (the ledger has them all)."""


class UnbalancedLedger(Exception):
    """A product's ledger for a shard does not balance; the message names shard, product and ids."""

    def __init__(self, shard_id: str, ledger: Ledger, not_landed: list[str] = ()):
        self.shard_id, self.ledger, self.not_landed = shard_id, ledger, list(not_landed)
        super().__init__(unbalanced_message(shard_id, ledger, self.not_landed))


def unbalanced_message(shard_id: str, ledger: Ledger, not_landed: list[str] = ()) -> str:
    parts = [
        f"the {ledger.product} ledger of shard {shard_id} does not balance "
        f"(landed {ledger.landed}, produced {ledger.produced}, rejected {ledger.rejected})"
    ]
    if ledger.unaccounted:
        shown = ", ".join(ledger.unaccounted[:SHOWN_IDS])
        more = f" and {len(ledger.unaccounted) - SHOWN_IDS} more" if len(ledger.unaccounted) > SHOWN_IDS else ""
        parts.append(f"{len(ledger.unaccounted)} unaccounted: {shown}{more}")
    if ledger.produced_and_rejected:
        shown = ", ".join(ledger.produced_and_rejected[:SHOWN_IDS])
        parts.append(f"{len(ledger.produced_and_rejected)} both produced and rejected: {shown}")
    if not_landed:
        shown = ", ".join(not_landed[:SHOWN_IDS])
        parts.append(f"{len(not_landed)} produced but no longer landed (a stale output after a re-landing?): {shown}")
    return "; ".join(parts) + ". Nothing of this shard is published until it balances."


def require_balanced(data_root: DataRoot, shard_id: str, product: str, produced: set[str]) -> Ledger:
    """The product's ledger for the shard; raises :class:`UnbalancedLedger` when it does not balance."""
    ledger = product_ledger(data_root, shard_id, product, produced)
    if not ledger.balanced:
        landed, _ = landed_utterances(data_root, shard_id)
        raise UnbalancedLedger(shard_id, ledger, sorted(produced - landed))
    return ledger
