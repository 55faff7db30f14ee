"""The near-duplicate shard list's journal in byte-for-byte comparisons of a data root.

Each reservation and commit appends a record (``index/near_duplicates/order/<seq>.json``) that carries
the reserving run's random token, and a batch pass appends them in another order than shard-by-shard
runs do: the records are history, like a database's log. What they fold to (``read_state``) is the
index's order, and that is what two runs must agree on; every other file must be byte-identical.
The snapshot the records are folded into (``shard_list/``: a head naming the last record folded in
and the rows reserved then, and parts) is compared the same way: where a run folds depends on how
many records it wrote.
"""

from __future__ import annotations

from speechdata.quality.near_dup_index import read_state
from speechdata.quality.near_dup_order_log import ORDER_LOG, SHARD_LIST


def is_order_record(path: str) -> bool:
    """Whether ``path`` (relative to the root or absolute) is one of the shard list's journal records
    or a file of the snapshot they fold into."""
    return any(path.startswith(f"{folder}/") or f"/{folder}/" in path for folder in (ORDER_LOG, SHARD_LIST))


def without_order_records(files: dict) -> dict:
    return {path: content for path, content in files.items() if not is_order_record(path)}


__all__ = ["is_order_record", "read_state", "without_order_records"]
