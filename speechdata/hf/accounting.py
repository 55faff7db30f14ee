"""The Hugging Face dataset's ledger, per shard: every landed utterance has a row in the country's state.

This is the gate ``hf_dataset`` passes before it writes anything; once it has written, the ``hf``
product line counts the same truth from the shards' published indexes and ``hf_dataset`` rejects
(:mod:`speechdata.hf.published_index`), in ``shard_ledgers`` and the catalog.

A segment is identified by ``(shard_id, utt_id)``. For one country, a shard's ledger counts as
produced the utterances the country's state records (written, filtered with a reason, failed with
a message, pending) plus the shard's utterances of other countries (their own country's ledger
covers them); ``raw_shards``' rejects make up the rest. An utterance of the country that the state
does not know is unaccounted: the refresh lost it, and the country is not published.
"""

from __future__ import annotations

from pathlib import PurePosixPath

import pyarrow.compute as pc

from speechdata.accounting.ledger_gate import UnbalancedLedger
from speechdata.accounting.ledgers import Ledger, landed_utterances, product_ledger
from speechdata.bridge.segments import utterance_of_key
from speechdata.hf.shard_paths import HF_STAGE
from speechdata.hf.state import execute_many, state_connection
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.products import product_line


def state_gate_stages() -> tuple[str, ...]:
    """The stages whose rejects the gate counts: it runs before ``hf_dataset`` and counts the state's
    filtered segments as its own (the ``hf_dataset`` ledger on disk is the previous build's)."""
    return tuple(stage for stage in product_line("hf").stages if stage != HF_STAGE)


def country_ledgers(data_root: DataRoot, dataset: str, country: str) -> dict[str, Ledger]:
    """The ``hf`` ledger of every shard whose segments of ``country`` changed since its ledger last
    balanced (the state's ``shards.needs_gate``: read by the refresh with rows of the country, or
    named by the state), by shard id. An unchanged shard's ledger balanced before and nothing it
    counts has changed (a re-run of ``raw_shards`` rewrites its index, so the refresh reads it again)."""
    with state_connection(data_root, layout.hf_state_database(dataset, country)) as db:
        # A shard whose recorded segments no longer number its rows of the country (a state that lost
        # one) is checked too: one aggregate over the state, no shard read.
        db.execute(
            "UPDATE shards SET needs_gate = true, needs_index = true FROM ("
            "  SELECT sh.shard_id FROM shards sh LEFT JOIN ("
            "    SELECT shard_id, count(*) AS n FROM segments WHERE status <> 'withdrawn' GROUP BY shard_id"
            "  ) c USING (shard_id) WHERE sh.segments IS NOT NULL AND coalesce(c.n, 0) <> sh.segments"
            ") lost WHERE shards.shard_id = lost.shard_id"
        )
        shards = sorted(s for (s,) in db.execute("SELECT shard_id FROM shards WHERE needs_gate").fetchall())
        recorded: dict[str, set[str]] = {}
        for shard_id, key in db.execute(
            "SELECT shard_id, key FROM segments WHERE status <> 'withdrawn' AND shard_id IN (SELECT unnest(?::VARCHAR[]))",
            [shards],
        ).fetchall():
            recorded.setdefault(shard_id, set()).add(key)
    ledgers = {}
    for shard_id in shards:
        if not data_root.exists(layout.utterance_index(shard_id)):
            continue
        index = data_root.read_parquet(layout.utterance_index(shard_id), columns=None)
        if "country" not in index.column_names:
            continue
        in_country = pc.equal(index["country"], country)
        if not pc.any(in_country).as_py() and shard_id not in recorded:
            continue
        elsewhere = set(index.filter(pc.invert(pc.fill_null(in_country, False)))["utt_id"].to_pylist())
        # A long recording's segments (``<utt_id>+<index>``) account for the recording.
        produced = {utterance_of_key(key) for key in recorded.get(shard_id, set())} | elsewhere
        ledgers[shard_id] = product_ledger(data_root, shard_id, "hf", produced, stages=state_gate_stages())
    return ledgers


def mark_balanced(data_root: DataRoot, dataset: str, country: str, shard_ids: list[str]) -> None:
    """The gate passed for ``shard_ids``: their ledgers are checked again only once they change."""
    with state_connection(data_root, layout.hf_state_database(dataset, country)) as db:
        execute_many(db, "UPDATE shards SET needs_gate = false WHERE shard_id = ?", [[s] for s in shard_ids])


def require_balanced_country(data_root: DataRoot, dataset: str, country: str) -> dict[str, Ledger]:
    """:func:`country_ledgers`, raising :class:`UnbalancedLedger` for the first shard that does not balance."""
    ledgers = country_ledgers(data_root, dataset, country)
    for shard_id, ledger in ledgers.items():
        if not ledger.balanced:
            landed, _ = landed_utterances(data_root, shard_id)
            raise UnbalancedLedger(shard_id, ledger, sorted(_recorded(data_root, dataset, country, shard_id) - landed))
    with state_connection(data_root, layout.hf_state_database(dataset, country)) as db:
        checked = [s for (s,) in db.execute("SELECT shard_id FROM shards WHERE needs_gate").fetchall()]
    mark_balanced(data_root, dataset, country, checked)
    return ledgers


def _recorded(data_root: DataRoot, dataset: str, country: str, shard_id: str) -> set[str]:
    with state_connection(data_root, layout.hf_state_database(dataset, country)) as db:
        return {
            key
            for (key,) in db.execute(
                "SELECT key FROM segments WHERE shard_id = ? AND status <> 'withdrawn'", [shard_id]
            ).fetchall()
        }


def published_utterances(data_root: DataRoot, dataset: str, shard_id: str) -> set[str]:
    """The shard's utterance ids that some country's state accounts for (any status but ``withdrawn``):
    the ``hf`` product's produced and ``hf_dataset``-rejected ids together, read from the states (a
    long recording's, by any of its segments)."""
    produced: set[str] = set()
    for path in sorted(data_root.glob(layout.hf_state_database(dataset, "*"))):
        country = PurePosixPath(path).name.removesuffix(".duckdb")
        with state_connection(data_root, layout.hf_state_database(dataset, country)) as db:
            produced |= {
                utterance_of_key(key)
                for (key,) in db.execute(
                    "SELECT key FROM segments WHERE shard_id = ? AND status <> 'withdrawn'", [shard_id]
                ).fetchall()
            }
    return produced
