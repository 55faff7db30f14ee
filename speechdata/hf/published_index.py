"""Write what the Hugging Face dataset holds of each shard, so the ledgers and the catalog count it.

After ``hf_dataset`` builds a country, every shard whose segments of it changed gets its published index
(:func:`~speechdata.hf.shard_paths.published_index`: ``utt_id``, ``country``, ``split``, ``status``
for each segment the country's state holds written, pending or failed) and its ``hf_dataset``
rejects ledger (the segments any country's state filtered out, under the filter's reason). The
``hf`` product line counts the first and owns the second, so its ledger balances exactly when every
landed utterance is in the dataset, filtered with a reason, or rejected at landing.

The shards written are kept in the state (``catalog_unreported_shards``) from before their files are
written until a build naming them is recorded: ``hf_dataset`` names them in its materialization, so
the catalog's next refresh reads those shards alone instead of listing the root
(:func:`shards_to_report_to_the_catalog`).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import PurePosixPath

import duckdb
import pyarrow as pa

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.bridge.segments import SEGMENT_KEY_SEPARATOR, utterance_of_key
from speechdata.hf.shard_paths import HF_STAGE, checked_country, published_index
from speechdata.hf.state import execute_many, read_state, state_connection
from speechdata.io import layout
from speechdata.io.confinement import validate_partition_key
from speechdata.io.storage import DataRoot

PUBLISHED_INDEX_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("country", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
    ]
)

UNREPORTED = "catalog_unreported_shards"
"""The state's table of shards whose published files no recorded build has named to the catalog."""

FILTERED = "filtered"
NOT_PUBLISHED = ("withdrawn", FILTERED)
"""Statuses a published index leaves out: withdrawn rows left the shard, filtered ones are rejects."""


def write_published_indexes(data_root: DataRoot, dataset: str, country: str) -> dict[str, int]:
    """Rewrite the published index of ``country`` and the ``hf_dataset`` rejects of every shard whose
    segments of the country changed since its index was last written (the state's ``shards`` table
    marks them: a shard the refresh read with rows of the country or named by the state, a part
    written, an upload); returns the rows written per shard. A shard whose folder is gone gets none."""
    checked_country(country)
    with state_connection(data_root, layout.hf_state_database(dataset, country)) as db:
        shards = sorted(s for (s,) in db.execute("SELECT shard_id FROM shards WHERE needs_index").fetchall())
        for shard_id in shards:
            validate_partition_key(shard_id)  # a shard id read from a state names a folder
        rows = db.execute(
            "SELECT shard_id, key, split, status FROM segments "
            "WHERE status NOT IN (SELECT unnest(?::VARCHAR[])) AND shard_id IN (SELECT unnest(?::VARCHAR[])) "
            "ORDER BY shard_id, key",
            [list(NOT_PUBLISHED), shards],
        ).fetchall()
        # Committed before any file is written: a build stopped after writing them still has them named.
        execute_many(
            db,
            f"INSERT INTO {UNREPORTED} VALUES (?, NULL) ON CONFLICT (shard_id) DO UPDATE SET reported_by = NULL",
            [[s] for s in shards],
        )
    by_shard: dict[str, list[tuple]] = defaultdict(list)
    for shard_id, key, split, status in rows:
        by_shard[shard_id].append((key, split, status))
    present = [shard_id for shard_id in shards if data_root.exists(layout.utterance_index(shard_id))]
    for shard_id in present:
        found = by_shard.get(shard_id, [])
        table = pa.table(
            {
                "utt_id": [key for key, _, _ in found],
                "country": [country] * len(found),
                "split": [split for _, split, _ in found],
                "status": [status for _, _, status in found],
            },
            schema=PUBLISHED_INDEX_SCHEMA,
        )
        data_root.write_parquet(published_index(shard_id, country), table)
    write_filtered_rejects(data_root, dataset, present)
    with state_connection(data_root, layout.hf_state_database(dataset, country)) as db:
        execute_many(db, "UPDATE shards SET needs_index = false WHERE shard_id = ?", [[s] for s in shards])
    return {shard_id: len(by_shard.get(shard_id, [])) for shard_id in present}


def shards_to_report_to_the_catalog(db: duckdb.DuckDBPyConnection, recorded_build: str | None, build: str) -> list[str]:
    """The shards whose published index and ``hf_dataset`` rejects were written since a recorded build
    last named them, now marked as named by ``build`` (inside the caller's state transaction).

    ``recorded_build`` is the country's latest build whose report was recorded (its materialization
    stands in the event log): the shards it named and that were not written again since are
    forgotten. Those named by a build that stopped before its report was recorded stay, so the next
    build names them again: whatever point a build stops at, the catalog is told every shard written."""
    if recorded_build is not None:
        db.execute(f"DELETE FROM {UNREPORTED} WHERE reported_by = ?", [recorded_build])
    db.execute(f"UPDATE {UNREPORTED} SET reported_by = ?", [build])
    return sorted(s for (s,) in db.execute(f"SELECT shard_id FROM {UNREPORTED}").fetchall())


def write_filtered_rejects(data_root: DataRoot, dataset: str, shard_ids: list[str]) -> None:
    """Rewrite ``rejects/hf_dataset.parquet`` of each shard from every country's state, as they are now.

    One ledger per stage and shard, fed by every country: each build rewrites it from all states,
    so the last build of any country leaves it whole. The other countries' states are only read."""
    if not shard_ids:
        return
    rejects: dict[str, list[Reject]] = {shard_id: [] for shard_id in shard_ids}
    published: set[tuple[str, str]] = set()
    for path in sorted(data_root.glob(layout.hf_state_database(dataset, "*"))):
        country = PurePosixPath(path).name.removesuffix(".duckdb")
        with read_state(data_root, layout.hf_state_database(dataset, country)) as db:
            filtered = db.execute(
                "SELECT shard_id, key, coalesce(reason, 'filtered'), split FROM segments "
                "WHERE status = ? AND shard_id IN (SELECT unnest(?::VARCHAR[])) ORDER BY shard_id, key",
                [FILTERED, list(shard_ids)],
            ).fetchall()
            published |= {
                (shard_id, utterance_of_key(key))
                for shard_id, key in db.execute(
                    "SELECT shard_id, key FROM segments WHERE status NOT IN (SELECT unnest(?::VARCHAR[])) "
                    "AND shard_id IN (SELECT unnest(?::VARCHAR[])) AND contains(key, ?)",
                    [list(NOT_PUBLISHED), list(shard_ids), SEGMENT_KEY_SEPARATOR],
                ).fetchall()
            }
        for shard_id, key, reason, split in filtered:
            rejects[shard_id].append(Reject(key, HF_STAGE, reason, f"{country} {split}"))
    for shard_id, found in rejects.items():
        found += _recordings_left_out(shard_id, found, published)
        found.sort(key=lambda r: (r.utt_id, r.reason, r.detail))
        data_root.write_parquet(layout.rejects(shard_id, HF_STAGE), rejects_table(found))


def _recordings_left_out(shard_id: str, filtered: list[Reject], published: set[tuple[str, str]]) -> list[Reject]:
    """A long recording none of whose segments is published (all filtered) is rejected under its own
    id too, with its first segment's reason, so the ledger accounts for it; its segments' rejects stay
    under their keys."""
    first: dict[str, Reject] = {}
    for reject in filtered:
        if SEGMENT_KEY_SEPARATOR in reject.utt_id:
            first.setdefault(utterance_of_key(reject.utt_id), reject)
    return [
        Reject(utt_id, HF_STAGE, reject.reason, f"every segment filtered; first {reject.utt_id}: {reject.detail}")
        for utt_id, reject in sorted(first.items())
        if (shard_id, utt_id) not in published
    ]
