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


def near_duplicate_flags(shard_id: str) -> str:
    """Written by the near-duplicate stage beside ``near_duplicates.parquet``: utterances that match an
    earlier one without being duplicates (another speaker's reading, a container of an earlier
    clip); kept unless a product's policy rejects their kind (docs/near-duplicates.md)."""
    return f"{layout.shard_dir(shard_id)}/near_duplicate_flags.parquet"
