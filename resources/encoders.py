"""The bridge's encoders, loaded once per process and injected into the feature assets."""

import dagster as dg
from pydantic import Field

from resources.loaded_models import load_once
from resources.model_pins import QWEN, TINY_QWEN, TINY_WAVLM, WAVLM, ModelPin
from resources.settings import ResourceSettings
from resources.torch_device import TorchDeviceResource
from speechdata.bridge.text_tokens import TINY_VOCAB_SIZE
from speechdata.profiles import Profile, runs_tiny_models


def profile_field():
    return Field(
        "full", description="full loads model_id at revision; tiny and small build the model's tiny twin locally."
    )


class QwenEncoder(dg.ConfigurableResource):
    """Qwen3 hidden states: ``full`` is ``Qwen/Qwen3-1.7B`` via ``AutoModel``; ``tiny`` a small Qwen3Model.

    The model is cut after the layer ``hidden_state_index`` selects (default -2: the un-normed output
    of layer 27 of 28), so the last layer and the LM head are never computed.
    """

    profile: Profile = profile_field()
    model_id: str = Field(QWEN.model_id, description="Hugging Face Hub id (or local folder) the full profile loads.")
    revision: str | None = None
    hidden_state_index: int = -2
    local_files_only: bool = False
    tiny_vocab_size: int = Field(512, description="Vocabulary of the tiny model (the tiny tokenizer's size).")

    @property
    def runs_tiny(self) -> bool:
        return runs_tiny_models(self.profile)

    @property
    def model_that_runs(self) -> ModelPin:
        return TINY_QWEN if self.runs_tiny else ModelPin(self.model_id, self.revision or "default")

    @property
    def identity(self) -> str:
        return f"{self.model_that_runs.identity}#hidden_states[{self.hidden_state_index}]"

    def model(self, device: TorchDeviceResource):
        torch_device, dtype = device.torch_device(), device.dtype()

        def build():
            from speechdata.features.models import load_pretrained, tiny_qwen3
            from speechdata.features.text import keep_layers_through

            if self.runs_tiny:
                model = tiny_qwen3(self.tiny_vocab_size)
            else:
                model = load_pretrained("qwen", self.model_id, self.revision, self.local_files_only, dtype)
            return keep_layers_through(model, self.hidden_state_index).to(torch_device, dtype)

        return load_once(("qwen", self.identity, str(torch_device), str(dtype)), build)


class WavLMEncoder(dg.ConfigurableResource):
    """WavLM features: ``full`` is ``microsoft/wavlm-large``; ``tiny`` a small WavLMModel.

    ``layer`` picks one entry of ``hidden_states`` (default: the last hidden state); ``layer_weights``
    (one weight per hidden state) gives their weighted sum instead.
    """

    profile: Profile = profile_field()
    model_id: str = Field(WAVLM.model_id, description="Hugging Face Hub id (or local folder) the full profile loads.")
    revision: str | None = None
    layer: int | None = None
    layer_weights: list[float] | None = None
    local_files_only: bool = False

    @property
    def identity(self) -> str:
        choice = (
            f"weights{self.layer_weights}"
            if self.layer_weights
            else f"layer{self.layer if self.layer is not None else 'last'}"
        )
        return f"{self.model_that_runs.identity}#{choice}"

    @property
    def runs_tiny(self) -> bool:
        return runs_tiny_models(self.profile)

    @property
    def model_that_runs(self) -> ModelPin:
        return TINY_WAVLM if self.runs_tiny else ModelPin(self.model_id, self.revision or "default")

    def model(self, device: TorchDeviceResource):
        torch_device, dtype = device.torch_device(), device.dtype()

        def build():
            from speechdata.features.models import load_pretrained, tiny_wavlm

            if self.runs_tiny:
                model = tiny_wavlm()
            else:
                model = load_pretrained("wavlm", self.model_id, self.revision, self.local_files_only, dtype)
            return model.to(torch_device, dtype)

        return load_once(("wavlm", self.model_that_runs.identity, str(torch_device), str(dtype)), build)


def qwen_resource(settings: ResourceSettings) -> QwenEncoder:
    return QwenEncoder(
        profile=settings.profile, model_id=QWEN.model_id, revision=QWEN.revision, tiny_vocab_size=TINY_VOCAB_SIZE
    )


def wavlm_resource(settings: ResourceSettings) -> WavLMEncoder:
    return WavLMEncoder(profile=settings.profile, model_id=WAVLM.model_id, revision=WAVLM.revision)
