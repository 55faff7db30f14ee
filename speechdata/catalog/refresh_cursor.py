"""When to ask for a catalog refresh: the cursor moves only when a refresh succeeded.

The refresh sensor sees the newest change to an asset the catalog summarizes (an increasing id) and the outcome of the
refresh it requested last. A refresh covers every change up to the id it was requested for only
once it succeeded; a failed or cancelled one is requested again (a new run key): at once after the
first failure, then after a wait that doubles with each further failure in a row (``RETRY_BASE_S``,
at most ``RETRY_MAX_S``), so a refresh that keeps failing shows up as a run now and then instead of
one every tick.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from enum import Enum

RETRY_BASE_S = 30.0
RETRY_MAX_S = 3600.0


class RunOutcome(Enum):
    PENDING = "pending"
    """Not finished, or not seen yet."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class RefreshCursor:
    covered: int = 0
    """The newest change a successful refresh covered."""
    requested: int = 0
    """The change the pending refresh was requested for (with ``run_key``)."""
    run_key: str | None = None
    failures: int = 0
    """Failed refreshes in a row since ``covered`` last moved."""
    retry_after: float = 0.0
    """Unix time before which a failed refresh is not requested again."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> RefreshCursor:
        """The cursor stored by a tick; a bare number (what the sensor stored before) is what it covered."""
        if not text:
            return cls()
        if text.strip().isdigit():
            return cls(covered=int(text))
        return cls(**json.loads(text))


@dataclass(frozen=True)
class RefreshDecision:
    cursor: RefreshCursor
    run_key: str | None
    """The refresh to request now, if any."""
    reason: str


def decide_refresh(cursor: RefreshCursor, latest: int, outcome: RunOutcome | None, now: float) -> RefreshDecision:
    """What to do at a tick that sees ``latest`` as the newest change and ``outcome`` for the
    pending run (``None`` when no refresh is pending)."""
    if cursor.run_key is not None:
        if outcome in (None, RunOutcome.PENDING):
            return RefreshDecision(cursor, None, f"refresh {cursor.run_key} not finished yet")
        if outcome is RunOutcome.SUCCEEDED:
            cursor = RefreshCursor(covered=max(cursor.covered, cursor.requested))
        else:
            failures = cursor.failures + 1
            wait_s = 0.0 if failures == 1 else min(RETRY_BASE_S * 2 ** (failures - 2), RETRY_MAX_S)
            cursor = replace(cursor, run_key=None, requested=0, failures=failures, retry_after=now + wait_s)
    if latest <= cursor.covered:
        return RefreshDecision(cursor, None, "nothing the catalog summarizes changed since the last successful refresh")
    if now < cursor.retry_after:
        return RefreshDecision(
            cursor, None, f"{cursor.failures} refresh(es) failed in a row: next try in {cursor.retry_after - now:.0f} s"
        )
    run_key = f"catalog-{latest}" + (f"-retry-{cursor.failures}" if cursor.failures else "")
    return RefreshDecision(replace(cursor, requested=latest, run_key=run_key), run_key, "catalogued files changed")
