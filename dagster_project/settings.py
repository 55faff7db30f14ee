"""Deployment settings read from the environment, with local defaults."""

from __future__ import annotations

from pathlib import Path

from speechdata.io import env
from speechdata.profiles import profile_from_env

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def data_root_url() -> str:
    """``DATA_ROOT``: a local path or an fsspec URL; defaults to ``<project>/.data``."""
    return env.data_root_url(PROJECT_ROOT / ".data")


def model_profile():
    return profile_from_env()
