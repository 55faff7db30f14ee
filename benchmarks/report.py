"""The one thing every benchmark prints: a JSON line on stdout, and nothing else there.

Libraries (Dagster's loggers, libsndfile's decoders, worker processes) may write to stdout, so each
benchmark runs its measurements inside :func:`stdout_to_stderr` and then :func:`emit`\\s its record.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Point file descriptor 1 at stderr while the block runs (Python, C code and child processes)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def ratio(value: float, baseline: float) -> float | None:
    """``value / baseline`` to four significant digits (None without a baseline)."""
    return float(f"{value / baseline:.4g}") if baseline else None


def machine() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def emit(benchmark: str, params: dict, figures: dict) -> None:
    """Print ``{"benchmark", "params", "machine", **figures}`` as one JSON line."""
    record = {"benchmark": benchmark, "params": params, "machine": machine(), **figures}
    print(json.dumps(record, sort_keys=False), flush=True)


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
