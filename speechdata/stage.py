"""What a per-shard stage reports: rows in and out, its rejects, audio and compute time.

Every stage of every product returns one of these, so assets report their metadata the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speechdata.rejects import Reject, count_by_reason


@dataclass(frozen=True)
class StageSummary:
    """What a per-shard stage did: rows in, rows out, and the rejects it recorded."""

    shard_id: str
    rows_in: int
    rows_out: int
    rejects: list[Reject]
    audio_seconds: float
    compute_seconds: float
    outputs: dict[str, str] = field(default_factory=dict)

    @property
    def rejects_by_reason(self) -> dict[str, int]:
        return count_by_reason(self.rejects)

    @property
    def reject_share(self) -> float:
        return len(self.rejects) / self.rows_in if self.rows_in else 0.0

    @property
    def hours(self) -> float:
        return self.audio_seconds / 3600.0

    @property
    def audio_seconds_per_second(self) -> float:
        return self.audio_seconds / self.compute_seconds if self.compute_seconds > 0 else 0.0
