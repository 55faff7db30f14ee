"""Where the quality files of a shard live, relative to the data root (docs/storage-layout.md)."""

from __future__ import annotations

from speechdata.io import layout


def quality_signals(shard_id: str) -> str:
    """One row per indexed utterance: every signal (docs/quality.md)."""
    return f"{layout.shard_dir(shard_id)}/quality.parquet"


def quality_decisions(shard_id: str) -> str:
    """One row per indexed utterance and product: kept, or the quality reason it is rejected for."""
    return f"{layout.shard_dir(shard_id)}/quality_decisions.parquet"


def near_duplicates(shard_id: str) -> str:
    """Written by the near-duplicate stage: every row is an utterance rejected as ``near_duplicate``."""
    return f"{layout.shard_dir(shard_id)}/near_duplicates.parquet"
