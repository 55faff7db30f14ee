"""The translation QE scorer: MetricX-24 (mT5-based regression), loaded once per process."""

import threading

import dagster as dg
from pydantic import Field

from resources.model_pins import ModelPin
from resources.settings import ResourceSettings
from resources.torch_device import TorchDeviceResource
from speechdata.profiles import Profile, runs_tiny_models

DEFAULT_METRICX_MODEL = "google/metricx-24-hybrid-xl-v2p6"
DEFAULT_METRICX_TOKENIZER = "google/mt5-xl"
TINY_METRICX = ModelPin("tiny-metricx24", "local-random-seed")
"""The tiny twin: a small random ``MT5ForRegression`` and its tokenizer, built and saved locally."""

_LOADED: dict[tuple, object] = {}
_LOCK = threading.Lock()


class MetricXResource(dg.ConfigurableResource):
    """MetricX-24 in QE mode (source + candidate, no reference): one error score in [0, 25] per pair.

    ``model_path`` / ``tokenizer_path``: hub names or local folders (the original QE script downloads
    ``metricx-24-hybrid-xl-v2p6`` and ``mt5-xl``), loaded by the ``full`` profile. The ``tiny`` and
    ``small`` profiles run the tiny twin instead: a small randomly-initialised ``MT5ForRegression``
    and tokenizer, built and saved under ``model_cache_dir`` and loaded from there (scores not
    meaningful). Runs on ``torch_device``
    (bf16 on CUDA), in length-sorted batches of at most ``max_batch_tokens`` padded tokens.
    """

    profile: Profile = Field("full", description="full loads model_path; tiny and small build the tiny twin.")
    model_path: str = DEFAULT_METRICX_MODEL
    tokenizer_path: str = DEFAULT_METRICX_TOKENIZER
    revision: str | None = None
    max_input_length: int = Field(1536, description="Tokens per input after truncation (MetricX-24's 1536).")
    max_batch_tokens: int = Field(16_384, description="Padded tokens per forward call.")
    local_files_only: bool = Field(False, description="Never download: use the Hugging Face cache only.")
    model_cache_dir: str = Field(".cache/models", description="Where the tiny model and tokenizer are saved.")

    @property
    def runs_tiny(self) -> bool:
        return runs_tiny_models(self.profile)

    @property
    def identity(self) -> str:
        if self.runs_tiny:
            return TINY_METRICX.identity
        return f"{self.model_path}@{self.revision or 'default'} tokenizer={self.tokenizer_path}"

    def _paths(self) -> tuple[str, str, bool]:
        if not self.runs_tiny:
            return self.model_path, self.tokenizer_path, self.local_files_only
        from speechdata.translation.metricx import tiny_metricx_path

        directory = str(tiny_metricx_path(self.model_cache_dir))
        return directory, directory, True

    def scorer(self, device: TorchDeviceResource):
        """A :class:`speechdata.translation.metricx.MetricXScorer` on ``device`` (model loaded once per process)."""
        torch_device, dtype = device.torch_device(), device.dtype()
        with _LOCK:
            key = (self.identity, self.model_cache_dir, str(torch_device), str(dtype))
            if key not in _LOADED:
                from speechdata.translation.metricx import load_metricx

                model_path, tokenizer_path, local_only = self._paths()
                model, tokenizer = load_metricx(
                    model_path,
                    tokenizer_path,
                    revision=None if self.runs_tiny else self.revision,
                    local_files_only=local_only,
                    dtype=dtype,
                )
                _LOADED[key] = (model.to(torch_device), tokenizer)
            model, tokenizer = _LOADED[key]
        from speechdata.translation.metricx import MetricXScorer

        return MetricXScorer(model, tokenizer, torch_device, self.max_input_length, self.max_batch_tokens)


def qe_resource(settings: ResourceSettings) -> MetricXResource:
    return MetricXResource(profile=settings.profile, model_cache_dir=settings.model_cache_dir)
