"""The production models and the revisions the platform is pinned to.

A pin is part of the code version of every asset whose output depends on that model, so moving a
pin (a new revision) marks exactly those partitions stale in the Dagster UI, and a backfill of the
stale set recomputes them and nothing else. A deployment may try another revision with
``SPEECHDATA_QWEN_REVISION`` / ``SPEECHDATA_WAVLM_REVISION``; production pins a commit sha.
"""

import os
from dataclasses import dataclass

from speechdata.profiles import Profile, profile_from_env


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


TINY_MODELS = {
    QWEN.model_id: ModelPin("tiny-qwen3", "local-random-seed"),
    WAVLM.model_id: ModelPin("tiny-wavlm", "local-random-seed"),
}
"""What the tiny profile runs instead (small random models of the same classes, built locally)."""


def model_that_runs(pin: ModelPin, profile: Profile | None = None) -> ModelPin:
    """The model the code location's profile actually runs: the pin (``full``) or its tiny stand-in.

    Code versions name this, so the tiny profile's assets never claim ``Qwen/Qwen3-1.7B@main``."""
    return pin if (profile or profile_from_env()) == "full" else TINY_MODELS[pin.model_id]
