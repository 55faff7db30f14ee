"""The production models and the revisions the platform is pinned to.

A pin is part of the code version of every asset whose output depends on that model, so moving a
pin (a new revision) marks exactly those partitions stale in the Dagster UI, and a backfill of the
stale set recomputes them and nothing else. A deployment may try another revision with
``SPEECHDATA_QWEN_REVISION`` / ``SPEECHDATA_WAVLM_REVISION``; production pins a commit sha.
"""

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPin:
    model_id: str
    revision: str

    @property
    def identity(self) -> str:
        return f"{self.model_id}@{self.revision}"


def _pin(model_id: str, revision_env: str, default_revision: str = "main") -> ModelPin:
    return ModelPin(model_id, os.environ.get(revision_env, "").strip() or default_revision)


QWEN = _pin("Qwen/Qwen3-1.7B", "SPEECHDATA_QWEN_REVISION")
"""Qwen3-1.7B: its tokenizer gives the grid's tokens, its layer 27 the bridge's ``qwen.npy``."""

WAVLM = _pin("microsoft/wavlm-large", "SPEECHDATA_WAVLM_REVISION")
"""WavLM-Large: the bridge's ``wavlm.npy``."""
