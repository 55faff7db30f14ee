"""The production models and the revisions the platform is pinned to.

A pin is part of the code version of every asset whose output depends on that model, so moving a
pin (a new revision) marks exactly those partitions stale in the Dagster UI, and a backfill of the
stale set recomputes them and nothing else. A deployment may try another revision with
``SPEECHDATA_QWEN_REVISION`` / ``SPEECHDATA_WAVLM_REVISION``; production pins a commit sha.
"""

import os
from dataclasses import dataclass

from speechdata.profiles import Profile, profile_from_env, runs_tiny_models


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

    Code versions name this, so the tiny profile's assets never claim ``Qwen/Qwen3-1.7B@main``. The code
    location passes its profile (:func:`model_code_version`); ``profile`` None reads the environment."""
    return TINY_MODELS[pin.model_id] if runs_tiny_models(profile or profile_from_env()) else pin


MODEL_BOUND_ASSETS: dict[str, ModelPin] = {}
"""Asset name -> the pin its output depends on: the code location appends what runs to its code version."""


def model_bound(asset_name: str, base_code_version: str, pin: ModelPin) -> str:
    """Register ``asset_name`` as depending on ``pin``; its code version as the environment's profile gives it.

    The code location rewrites it for the profile it was built with (:func:`model_code_version`), so
    ``build_definitions(profile=X)`` records what X runs, whatever ``SPEECHDATA_PROFILE`` says."""
    MODEL_BOUND_ASSETS[asset_name] = pin
    return model_code_version(base_code_version, pin, profile_from_env())


def model_code_version(base_code_version: str, pin: ModelPin, profile: Profile) -> str:
    return f"{base_code_version}{model_that_runs(pin, profile).identity}"


def base_code_version(code_version: str, pin: ModelPin) -> str:
    """``code_version`` without the model identity :func:`model_bound` appended (for either profile)."""
    for ran in (pin, TINY_MODELS[pin.model_id]):
        if code_version.endswith(ran.identity):
            return code_version[: -len(ran.identity)]
    raise ValueError(f"code version {code_version!r} names neither {pin.identity} nor its tiny stand-in")
