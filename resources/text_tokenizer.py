import dagster as dg
from pydantic import Field, PrivateAttr

from resources.model_pins import QWEN, TINY_QWEN, ModelPin
from resources.settings import ResourceSettings
from speechdata.bridge.text_tokens import load_text_tokenizer, tiny_tokenizer
from speechdata.profiles import Profile, runs_tiny_models


class TextTokenizerResource(dg.ConfigurableResource):
    """The text model's tokenizer (Qwen3's in production), with character offsets.

    The ``tiny`` and ``small`` profiles train the tiny twin's tokenizer instead: the small Qwen-style
    byte-level BPE of ``tiny-qwen3``.
    """

    profile: Profile = Field("full", description="full loads model_id's tokenizer; tiny and small train the tiny BPE.")
    model_id: str = Field(QWEN.model_id, description="Hugging Face Hub id (or local folder) the full profile loads.")
    revision: str | None = None
    local_files_only: bool = Field(False, description="Never download: use the Hugging Face cache only.")

    _tokenizer: object = PrivateAttr(default=None)

    def get(self):
        if self._tokenizer is None:
            if runs_tiny_models(self.profile):
                self._tokenizer = tiny_tokenizer()
            else:
                self._tokenizer = load_text_tokenizer(self.model_id, self.revision, self.local_files_only)
        return self._tokenizer

    @property
    def identity(self) -> str:
        """The model whose tokenizer runs, recorded in metadata so a tokenizer change is visible."""
        return self.model_that_runs.identity

    @property
    def model_that_runs(self) -> ModelPin:
        return TINY_QWEN if runs_tiny_models(self.profile) else ModelPin(self.model_id, self.revision or "default")


def text_tokenizer_resource(settings: ResourceSettings) -> TextTokenizerResource:
    return TextTokenizerResource(profile=settings.profile, model_id=QWEN.model_id, revision=QWEN.revision)
