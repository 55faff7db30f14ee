"""Settings from the environment shared by the CLI and the code location: where the data root is
(``DATA_ROOT``) and how many shards a backfill run carries (``SPEECHDATA_BACKFILL_SHARDS_PER_RUN``)."""

from __future__ import annotations

import os
from pathlib import Path

DATA_ROOT_ENV = "DATA_ROOT"
BACKFILL_SHARDS_PER_RUN_ENV = "SPEECHDATA_BACKFILL_SHARDS_PER_RUN"
DEFAULT_BACKFILL_SHARDS_PER_RUN = 32
"""The one figure for shards per backfill run: the assets' backfill policy, ``speechdata shard backfill
--help`` and the docs all quote it (tests/unit/test_shards_per_run_quoted.py keeps the docs true)."""


def data_root_url(default: str | os.PathLike = ".data") -> str:
    """``DATA_ROOT``: a local path or an fsspec URL; ``default`` (a local directory) when unset.

    A relative local path is resolved now: it would otherwise depend on the working directory of
    each run worker.
    """
    value = os.environ.get(DATA_ROOT_ENV, "").strip()
    if not value:
        return str(Path(default).resolve())
    if "://" in value:
        return value
    return str(Path(value).resolve())


def backfill_shards_per_run() -> int:
    """k of the shard assets' ``BackfillPolicy.multi_run``: ``SPEECHDATA_BACKFILL_SHARDS_PER_RUN``, else
    :data:`DEFAULT_BACKFILL_SHARDS_PER_RUN`."""
    value = os.environ.get(BACKFILL_SHARDS_PER_RUN_ENV, "").strip()
    if not value:
        return DEFAULT_BACKFILL_SHARDS_PER_RUN
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{BACKFILL_SHARDS_PER_RUN_ENV}={value!r}: expected a whole number of shards, at least 1")
    return int(value)
