import functools
import hashlib
import threading
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field, PrivateAttr

from resources.model_pins import PARAKEET, ModelPin
from resources.settings import ResourceSettings
from speechdata.alignment.acoustic_models import (
    EMISSION_CALIBRATION_FILE,
    SMALL_MODEL_DIR,
    SMALL_MODEL_NAME,
    TINY_MODEL_NAME,
)
from speechdata.alignment.forced import WildcardSettings
from speechdata.alignment.log_probs import LogProbSettings, ctc_model_forward
from speechdata.alignment.long_form import DEFAULT_WILDCARD_PENALTY
from speechdata.alignment.stage import CtcAligner
from speechdata.alignment.transcript_units import vocabulary_of
from speechdata.profiles import SMALL_ALIGNER_LANGUAGES, Profile

DEFAULT_ALIGNMENT_MODELS = {"en": PARAKEET.model_id}
TINY_ALIGNMENT_LANGUAGES = ("en", "de", "fr")
"""The tiny CTC model's character set covers these; other sample languages show the no-model reject."""
TINY_ALIGNER = ModelPin(TINY_MODEL_NAME, "local-random-seed")
"""The tiny twin of the aligner: a 2-layer ParakeetForCTC with random weights, built locally."""
SMALL_MODEL_FILES = ("config.json", "model.safetensors", "processor_config.json", "tokenizer.json")
"""What the ``small`` aligner's weights, front end and vocabulary are read from (its identity hashes them)."""


def profile_alignment_models(profile: Profile) -> dict[str, str]:
    """``{language: model}`` of a profile: ``small`` runs its trained model for the languages it was
    trained on and the tiny one for the rest of the tiny languages (so those still align, meaninglessly)."""
    if profile == "full":
        return dict(DEFAULT_ALIGNMENT_MODELS)
    models = {language: "tiny" for language in TINY_ALIGNMENT_LANGUAGES}
    if profile == "small":
        models.update({language: SMALL_MODEL_NAME for language in SMALL_ALIGNER_LANGUAGES})
    return models


def profile_alignment_revisions(profile: Profile) -> dict[str, str]:
    """``{hub model: revision}`` of a profile: the pinned production aligner for ``full``, none otherwise."""
    return {PARAKEET.model_id: PARAKEET.revision} if profile == "full" else {}


def _file_digest(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


@functools.cache
def small_aligner_identity() -> str:
    """The shipped ``small`` model's content: its weights and vocabulary, and its emission calibration
    (measured apart from training, so re-calibrating alone changes the alignments too)."""
    model = _file_digest(*(SMALL_MODEL_DIR / name for name in SMALL_MODEL_FILES))
    calibration = _file_digest(SMALL_MODEL_DIR / EMISSION_CALIBRATION_FILE)
    return f"{SMALL_MODEL_NAME}@model-{model}+emission_calibration-{calibration}"


def ctc_model_identity(name: str, revision: str | None) -> str:
    """The model an entry of ``CtcAlignerResource.models`` loads, as a code version names it."""
    if name == "tiny":
        return TINY_ALIGNER.identity
    if name == SMALL_MODEL_NAME:
        return small_aligner_identity()
    return f"{name}@{revision or 'default'}"


def aligner_identity(models: dict[str, str], revisions: dict[str, str]) -> str:
    """Every model the aligner runs with the languages it aligns, e.g. ``nvidia/parakeet-ctc-1.1b@main[en]``."""
    languages_by_model: dict[str, list[str]] = {}
    for language, name in sorted(models.items()):
        languages_by_model.setdefault(ctc_model_identity(name, revisions.get(name)), []).append(language)
    return ";".join(f"{model}[{','.join(languages)}]" for model, languages in sorted(languages_by_model.items()))


def profile_aligner_identity(profile: Profile) -> str:
    """What the ``alignments`` code version names: the aligner ``profile`` runs (:func:`aligner_resource`)."""
    return aligner_identity(profile_alignment_models(profile), profile_alignment_revisions(profile))


# One load per model and device per process, however many runs or resource instances ask for it.
_LOADED: dict[tuple[str, str | None, str], CtcAligner] = {}
_LOCK = threading.Lock()


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class CtcAlignerResource(dg.ConfigurableResource):
    """CTC acoustic models (transformers' ParakeetForCTC) for forced alignment, one per language,
    loaded once per process.

    ``models`` maps ISO 639-1 languages to a Hugging Face model name (hub or local cache), a local
    transformers directory, ``tiny`` (the random local model of the tiny profile) or ``small`` (the
    trained model shipped in the package). A language that is not
    in the map is not aligned: its utterances become ``no_aligner_for_language`` rejects.
    """

    models: dict[str, str] = Field(default_factory=lambda: dict(DEFAULT_ALIGNMENT_MODELS))
    revisions: dict[str, str] = Field(
        default_factory=dict, description="Hub revision per model name in models (absent: the hub's default)."
    )
    device: str = Field("auto", description="auto, cpu or cuda:N")
    model_cache_dir: str = Field(".cache/models", description="Where the tiny model's directory is kept.")
    local_files_only: bool = Field(False, description="Never download: use the Hugging Face cache only.")
    max_batch_s: float = Field(240.0, description="Padded audio seconds per forward call.")
    max_window_s: float = Field(40.0, description="Longer utterances are aligned from overlapping windows.")
    context_s: float = Field(4.0, description="Audio context on each side of a window.")
    wildcard: Literal["words", "sentences", "edges", "off"] = Field(
        "words",
        description=(
            "Where a wildcard may absorb audio the transcript does not cover (music, an intro), so the words "
            "around it keep their timing: words (any word boundary), sentences (after a sentence end), edges "
            "(before the first and after the last word) or off. Reported per utterance (alignment_scores)."
        ),
    )
    wildcard_penalty: float = Field(
        DEFAULT_WILDCARD_PENALTY, description="Nats per frame the wildcard costs below the frame's best label."
    )

    _resolved_device: str | None = PrivateAttr(default=None)

    @property
    def identity(self) -> str:
        return aligner_identity(self.models, self.revisions)

    def log_prob_settings(self, frame_s: float) -> LogProbSettings:
        return LogProbSettings(
            frame_s=frame_s, max_batch_s=self.max_batch_s, max_window_s=self.max_window_s, context_s=self.context_s
        )

    def wildcard_settings(self) -> WildcardSettings | None:
        if self.wildcard == "off":
            return None
        return WildcardSettings(placement=self.wildcard, penalty=self.wildcard_penalty)

    def aligner_for(self, language: str | None) -> CtcAligner | None:
        name = self.models.get(language or "")
        if name is None:
            return None
        if self._resolved_device is None:
            self._resolved_device = resolve_device(self.device)
        revision = self.revisions.get(name)
        key = (name, revision, self._resolved_device)
        with _LOCK:
            if key not in _LOADED:
                from speechdata.alignment.acoustic_models import load_ctc_model

                acoustic = load_ctc_model(
                    name,
                    cache_dir=self.model_cache_dir,
                    device=self._resolved_device,
                    local_files_only=self.local_files_only,
                    revision=revision,
                )
                _LOADED[key] = CtcAligner(
                    name=name,
                    forward=ctc_model_forward(acoustic, self._resolved_device),
                    vocabulary=vocabulary_of(acoustic),
                    frame_s=acoustic.frame_s,
                    emission_offsets_ms=acoustic.emission_offsets_ms,
                )
            return _LOADED[key]


def aligner_resource(settings: ResourceSettings) -> CtcAlignerResource:
    return CtcAlignerResource(
        models=profile_alignment_models(settings.profile),
        revisions=profile_alignment_revisions(settings.profile),
        model_cache_dir=settings.model_cache_dir,
    )
