"""Where the data root is, from the environment: ``DATA_ROOT``, shared by the CLI and the code location."""

from __future__ import annotations

import os
from pathlib import Path

DATA_ROOT_ENV = "DATA_ROOT"


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
