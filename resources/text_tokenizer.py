import dagster as dg
from pydantic import Field, PrivateAttr

from resources.model_pins import QWEN
from resources.settings import ResourceSettings
from speechdata.bridge.text_tokens import load_text_tokenizer, tiny_tokenizer


class TextTokenizerResource(dg.ConfigurableResource):
    """The text model's tokenizer (Qwen3's in production), with character offsets.

    ``model_id`` ``tiny`` trains the small Qwen-style byte-level BPE of the tiny profile.
    """

    model_id: str = "Qwen/Qwen3-1.7B"
    revision: str | None = None
    local_files_only: bool = Field(False, description="Never download: use the Hugging Face cache only.")

    _tokenizer: object = PrivateAttr(default=None)

    def get(self):
        if self._tokenizer is None:
            if self.model_id == "tiny":
                self._tokenizer = tiny_tokenizer()
            else:
                self._tokenizer = load_text_tokenizer(self.model_id, self.revision, self.local_files_only)
        return self._tokenizer

    @property
    def identity(self) -> str:
        """Model id and revision, recorded in metadata so a tokenizer change is visible."""
        return f"{self.model_id}@{self.revision or 'default'}"


def text_tokenizer_resource(settings: ResourceSettings) -> TextTokenizerResource:
    if settings.tiny:
        return TextTokenizerResource(model_id="tiny", revision=None)
    return TextTokenizerResource(model_id=QWEN.model_id, revision=QWEN.revision)
