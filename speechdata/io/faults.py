"""Named fault points for crash-safety tests: ``SPEECHDATA_KILL_AT=<point>`` SIGKILLs the process there.

A kill -9 cannot be caught, so it proves what a real crash leaves behind (temp files, half-staged
outputs) and that the next run cleans it up and reaches exactly the clean result. Unset in
production, each point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

KILL_AT_ENV = "SPEECHDATA_KILL_AT"
POINTS = (
    "ingest",
    "features",
    "packing",
    "commit",
    "commit-index",
    "commit-manifest",
    "commit-stale-tars",
    "asr-flac-files",
    "asr-flac-index",
    "asr-manifest-parquet",
    "asr-manifest-jsonl",
    "asr-manifest-removed",
    "vad-staging",
    "vad-tar",
    "vad-segments",
)


def fault_point(name: str) -> None:
    """Kill this process with SIGKILL when ``SPEECHDATA_KILL_AT`` names ``name``."""
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
