from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from resources.settings import ResourceSettings

if TYPE_CHECKING:
    import torch


class TorchDeviceResource(dg.ConfigurableResource):
    """Where GPU models run and how big their batches are.

    ``auto`` picks ``cuda`` when a GPU is visible, else the CPU. Models run in bfloat16 on CUDA and
    float32 on the CPU. Batch limits are in padded tokens (text) and padded audio seconds (speech).
    """

    device: str = Field("auto", description="auto, cpu or cuda:N")
    max_batch_tokens: int = Field(16_384, description="Padded text tokens per Qwen forward.")
    max_batch_audio_s: float = Field(200.0, description="Padded 16 kHz audio seconds per WavLM forward.")

    # torch is imported on use: every Dagster step process loads this module, most never touch a model.
    def torch_device(self) -> "torch.device":
        import torch

        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def dtype(self) -> "torch.dtype":
        import torch

        return torch.bfloat16 if self.torch_device().type == "cuda" else torch.float32

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory window (one per shard when a step computes several)."""
        device = self.torch_device()
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def peak_memory_gb(self) -> float | None:
        device = self.torch_device()
        if device.type != "cuda":
            return None
        import torch

        return torch.cuda.max_memory_allocated(device) / 1e9


def torch_device_resource(settings: ResourceSettings) -> TorchDeviceResource:
    return TorchDeviceResource()
