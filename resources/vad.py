import math

import dagster as dg
from pydantic import Field, PrivateAttr

from resources.settings import ResourceSettings
from speechdata.vad.silero import VadParams, load_silero_model


class SileroVadResource(dg.ConfigurableResource):
    """Silero VAD (the model file ships in the ``silero-vad`` package: no download, same in every
    profile) and its segmentation thresholds. The model is loaded once per process."""

    threshold: float = Field(0.5, description="Speech probability that starts a segment.")
    min_speech_duration_ms: int = Field(250, description="Shorter speech is dropped.")
    min_silence_duration_ms: int = Field(100, description="Shorter silence does not end a segment.")
    speech_pad_ms: int = Field(30, description="Padding added to each side of a segment.")
    max_speech_duration_s: float = Field(0.0, description="Split longer segments at their longest silence; 0 = never.")
    batch_files: int = Field(64, description="Files whose windows go through the model together.")

    _model: object = PrivateAttr(default=None)

    def model(self):
        if self._model is None:
            self._model = load_silero_model()
        return self._model

    def params(self) -> VadParams:
        return VadParams(
            threshold=self.threshold,
            min_speech_duration_ms=self.min_speech_duration_ms,
            min_silence_duration_ms=self.min_silence_duration_ms,
            speech_pad_ms=self.speech_pad_ms,
            max_speech_duration_s=self.max_speech_duration_s if self.max_speech_duration_s > 0 else math.inf,
        )


def vad_resource(settings: ResourceSettings) -> SileroVadResource:
    return SileroVadResource()
