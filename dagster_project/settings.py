"""Deployment settings read from the environment, with local defaults."""

from __future__ import annotations

import os
from pathlib import Path

from speechdata.profiles import profile_from_env

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def data_root_url() -> str:
    """``DATA_ROOT``: a local path or an fsspec URL; defaults to ``<project>/.data``."""
    value = os.environ.get("DATA_ROOT", "").strip()
    if not value:
        return str(PROJECT_ROOT / ".data")
    if "://" in value:
        return value
    # A relative path would otherwise depend on the cwd of each run worker.
    return str(Path(value).resolve())


def model_profile():
    return profile_from_env()
