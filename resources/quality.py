"""The quality stage's models: spoken-language ID, a speech-quality (MOS) estimator, DNSMOS and a speaker encoder.

``full`` loads MMS-LID (``facebook/mms-lid-126``, transformers ``AutoModelForAudioClassification``)
and torchaudio's SQUIM objective model (its PESQ estimate as MOS). ``tiny`` builds models of the
same classes from config with fixed random weights, locally (no network): their outputs are
computed and stored but mean nothing, so the tiny profile's default policy leaves their filters off
(docs/quality.md). DNSMOS P.835 (its ONNX model inside the ``speechmos`` wheel, on onnxruntime's
CPU provider) is the same real model in every profile.
"""

import dagster as dg
from pydantic import Field

from resources.loaded_models import load_once
from resources.model_pins import ModelPin
from resources.settings import ResourceSettings
from resources.torch_device import TorchDeviceResource
from speechdata.profiles import Profile, runs_tiny_models

TINY_LANGUAGES = ("eng", "deu", "fra", "spa")
"""The tiny audio-LID model's labels (ISO 639-3, as MMS-LID names them)."""
TINY_SEED = 0
TINY_AUDIO_LANGUAGE = ModelPin("tiny-wav2vec2-lid", "local-random-seed")
"""The tiny twin of the spoken-language ID model: :func:`tiny_audio_language_model`."""
TINY_MOS = ModelPin("tiny-squim-objective", "local-random-seed")
"""The tiny twin of the MOS estimator: :func:`tiny_squim_objective_model`."""


def tiny_audio_language_model():
    """A 1-layer Wav2Vec2 sequence classifier over :data:`TINY_LANGUAGES`, random weights (fixed seed)."""
    import torch
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2ForSequenceClassification

    config = Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 4, 4),
        conv_kernel=(10, 8, 8),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        classifier_proj_size=16,
        num_labels=len(TINY_LANGUAGES),
        id2label=dict(enumerate(TINY_LANGUAGES)),
        label2id={label: i for i, label in enumerate(TINY_LANGUAGES)},
    )
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = Wav2Vec2ForSequenceClassification(config)
    extractor = Wav2Vec2FeatureExtractor(sampling_rate=16_000, do_normalize=True, return_attention_mask=True)
    return model.eval(), extractor


def tiny_squim_objective_model():
    """torchaudio's SQUIM objective architecture, scaled down, random weights (fixed seed)."""
    import torch
    from torchaudio.models import squim_objective_model

    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = squim_objective_model(
            feat_dim=16, win_len=64, d_model=32, nhead=2, hidden_dim=32, num_blocks=1, rnn_type="LSTM", chunk_size=50
        )
    return model.eval()


class QualityModelsResource(dg.ConfigurableResource):
    """The quality stage's audio models; each loaded once per process."""

    profile: Profile = Field(
        "full", description="full loads the models named below; tiny and small build their tiny twins locally."
    )
    audio_language_model_id: str = Field(
        "facebook/mms-lid-126",
        description="Hugging Face Hub id of a transformers audio classifier (spoken-language ID).",
    )
    audio_language_revision: str | None = None
    mos_model: str = Field("squim_objective", description="squim_objective: torchaudio's pretrained SQUIM.")
    local_files_only: bool = False
    dnsmos_threads: int = Field(
        1, description="onnxruntime intra-op threads for DNSMOS (0: onnxruntime's default, all cores)."
    )

    @property
    def runs_tiny(self) -> bool:
        return runs_tiny_models(self.profile)

    @property
    def audio_language_model(self) -> ModelPin:
        if self.runs_tiny:
            return TINY_AUDIO_LANGUAGE
        return ModelPin(self.audio_language_model_id, self.audio_language_revision or "default")

    @property
    def mos_model_that_runs(self) -> str:
        return TINY_MOS.identity if self.runs_tiny else self.mos_model

    @property
    def identity(self) -> str:
        return f"{self.audio_language_model.identity}+{self.mos_model_that_runs}+dnsmos"

    def audio_language(self, device: TorchDeviceResource):
        from speechdata.quality.audio_models import AudioClassifierLanguageId

        torch_device = device.torch_device()

        def build():
            if self.runs_tiny:
                model, extractor = tiny_audio_language_model()
            else:
                from speechdata.hub_access import hub_model_access

                local_files_only = hub_model_access(
                    self.audio_language_model_id, self.audio_language_revision, local_files_only=self.local_files_only
                )
                from transformers import AutoFeatureExtractor, AutoModelForAudioClassification

                model = AutoModelForAudioClassification.from_pretrained(
                    self.audio_language_model_id,
                    revision=self.audio_language_revision,
                    local_files_only=local_files_only,
                )
                extractor = AutoFeatureExtractor.from_pretrained(
                    self.audio_language_model_id,
                    revision=self.audio_language_revision,
                    local_files_only=local_files_only,
                )
            return AudioClassifierLanguageId(model.eval().to(torch_device), extractor, str(torch_device))

        return load_once(("audio_lid", self.audio_language_model.identity, str(torch_device)), build)

    def speech_quality(self, device: TorchDeviceResource):
        from speechdata.quality.audio_models import SquimObjectiveMos

        torch_device = device.torch_device()

        def build():
            if self.runs_tiny:
                model = tiny_squim_objective_model()
            elif self.mos_model == "squim_objective":
                from torchaudio.pipelines import SQUIM_OBJECTIVE

                model = SQUIM_OBJECTIVE.get_model()
            else:
                raise ValueError(f"quality_models.mos_model {self.mos_model!r}: use squim_objective")
            return SquimObjectiveMos(model.eval().to(torch_device), str(torch_device))

        return load_once(("mos", self.mos_model_that_runs, str(torch_device)), build)

    def dnsmos(self):
        """DNSMOS P.835 (SIG/BAK/OVRL), loaded once per process."""
        from speechdata.quality.dnsmos import Dnsmos

        return load_once(("dnsmos", self.dnsmos_threads), lambda: Dnsmos(self.dnsmos_threads))

    def speaker_encoder(self, device: TorchDeviceResource):
        """Resemblyzer's speaker encoder: its trained weights ship in the wheel (no download), and it
        runs at about 4 % of real time on a CPU, so every profile, ``tiny`` included, uses it."""
        from speechdata.quality.speakers import shipped_speaker_encoder

        # The near-duplicate signals use the same instance: audio it embedded is not embedded again.
        return shipped_speaker_encoder(str(device.torch_device()))


def quality_models_resource(settings: ResourceSettings) -> QualityModelsResource:
    return QualityModelsResource(profile=settings.profile)
