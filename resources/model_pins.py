"""The production models, the revisions the platform is pinned to, and their tiny twins.

A pin is part of the code version of every asset whose output depends on that model, so moving a
pin (a new revision) marks exactly those partitions stale in the Dagster UI, and a backfill of the
stale set recomputes them and nothing else. A deployment may try another revision with
``SPEECHDATA_QWEN_REVISION`` / ``SPEECHDATA_WAVLM_REVISION`` / ``SPEECHDATA_PARAKEET_REVISION``;
production pins a commit sha.

The ``tiny`` and ``small`` profiles run a tiny twin instead of each pinned model: its own
:class:`ModelPin` (a local name, never a Hub id), so a resource's Hub id field only ever holds a
Hub id and the profile, not a sentinel value, says which of the two runs.
"""

import os
from collections.abc import Callable
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

PARAKEET = _pin("nvidia/parakeet-ctc-1.1b", "SPEECHDATA_PARAKEET_REVISION")
"""Parakeet CTC 1.1B: the ``full`` profile's English forced aligner."""

TINY_QWEN = ModelPin("tiny-qwen3", "local-random-seed")
"""A small random ``Qwen3Model`` and the byte-level BPE trained on ``TINY_CORPUS`` (its tokenizer)."""

TINY_WAVLM = ModelPin("tiny-wavlm", "local-random-seed")
"""A small random ``WavLMModel``."""

TINY_MODELS = {QWEN.model_id: TINY_QWEN, WAVLM.model_id: TINY_WAVLM}
"""What the tiny profile runs instead (small random models of the same classes, built locally)."""


def model_that_runs(pin: ModelPin, profile: Profile | None = None) -> ModelPin:
    """The model the code location's profile actually runs: the pin (``full``) or its tiny twin.

    Code versions name this, so the tiny profile's assets never claim ``Qwen/Qwen3-1.7B@main``. The code
    location passes its profile (:func:`profile_code_version`); ``profile`` None reads the environment."""
    return TINY_MODELS[pin.model_id] if runs_tiny_models(profile or profile_from_env()) else pin


ModelIdentity = Callable[[Profile], str]
"""The identity of the model(s) a profile runs for one asset, as its code version names them."""


@dataclass(frozen=True)
class ModelBoundVersion:
    base: str
    """The code version without the model: the asset's own logic."""
    models_that_run: ModelIdentity

    def for_profile(self, profile: Profile) -> str:
        return f"{self.base}{self.models_that_run(profile)}"


MODEL_BOUND_ASSETS: dict[str, ModelBoundVersion] = {}
"""Asset name -> its code version per profile: the code location records what its profile runs."""


def model_bound(asset_name: str, base_code_version: str, models: ModelPin | ModelIdentity) -> str:
    """Register ``asset_name`` as depending on ``models`` (a pin, or what each profile runs); its code
    version as the environment's profile gives it.

    The code location rewrites it for the profile it was built with (:func:`profile_code_version`), so
    ``build_definitions(profile=X)`` records what X runs, whatever ``SPEECHDATA_PROFILE`` says."""
    models_that_run = (
        (lambda profile: model_that_runs(models, profile).identity) if isinstance(models, ModelPin) else models
    )
    MODEL_BOUND_ASSETS[asset_name] = ModelBoundVersion(base_code_version, models_that_run)
    return MODEL_BOUND_ASSETS[asset_name].for_profile(profile_from_env())


def profile_code_version(asset_name: str, profile: Profile) -> str | None:
    """The code version ``profile`` gives a model-bound asset; None for an asset bound to no model."""
    bound = MODEL_BOUND_ASSETS.get(asset_name)
    return None if bound is None else bound.for_profile(profile)
