"""WavLM features on Mimi's 12.5 Hz clock (the bridge's ``wavlm.npy``).

24 kHz audio is resampled to 16 kHz on the model's device, normalized per utterance (zero mean,
unit variance, as WavLM-Large's feature extractor does), run through WavLM in length-sorted batches
with attention masks, and the 50 Hz output is average-pooled with kernel 8, stride 4 and 2 frames
of padding each side (padding left out of the average), so output ``i`` is centred on Mimi frame
``i`` (80i + 40 ms); the result is padded by repeating its last row, or trimmed, to exactly ``F``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from speechdata.audio.clock import SAMPLE_RATE
from speechdata.features.gpu_batching import budgeted_batches, run_splitting_on_oom

WAVLM_SAMPLE_RATE = 16_000
SOURCE_SAMPLE_RATE = SAMPLE_RATE


def pool_to_mimi_frames(features: torch.Tensor, n_frames: int) -> torch.Tensor:
    """``[N, D]`` 50 Hz features -> ``[n_frames, D]``: avg-pool k8/s4/pad2 (pads excluded), then fit to F."""
    if features.shape[0] == 0:
        return features.new_zeros((n_frames, features.shape[1]))
    pooled = F.avg_pool1d(features.T.unsqueeze(0), kernel_size=8, stride=4, padding=2, count_include_pad=False)[0].T
    if pooled.shape[0] >= n_frames:
        return pooled[:n_frames]
    repeat = pooled[-1:].expand(n_frames - pooled.shape[0], -1)
    return torch.cat([pooled, repeat], dim=0)


def select_layer(outputs, layer: int | None, layer_weights: Sequence[float] | None) -> torch.Tensor:
    """Last hidden state, one layer of ``hidden_states``, or their weighted sum."""
    if layer_weights is not None:
        states = torch.stack(outputs.hidden_states, dim=0)
        if len(layer_weights) != states.shape[0]:
            raise ValueError(
                f"layer_weights has {len(layer_weights)} entries; the model has {states.shape[0]} hidden states"
            )
        weights = torch.tensor(layer_weights, dtype=states.dtype, device=states.device).view(-1, 1, 1, 1)
        return (states * weights).sum(dim=0)
    if layer is None:
        return outputs.last_hidden_state
    return outputs.hidden_states[layer]


def wavlm_features(
    model,
    audios_24k: Sequence[np.ndarray],
    n_frames: Sequence[int],
    *,
    device: str | torch.device,
    dtype: torch.dtype = torch.float32,
    layer: int | None = None,
    layer_weights: Sequence[float] | None = None,
    max_batch_s: float = 200.0,
    on_batch: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """float16 ``[F_i, hidden]`` per utterance."""
    import torchaudio.functional as AF

    results: list[np.ndarray | None] = [None] * len(audios_24k)
    lengths_16k = [-(-a.shape[0] * WAVLM_SAMPLE_RATE // SOURCE_SAMPLE_RATE) for a in audios_24k]
    need_hidden_states = layer is not None or layer_weights is not None

    def forward(indices: list[int]) -> list[np.ndarray]:
        waves = []
        for i in indices:
            audio = torch.from_numpy(np.ascontiguousarray(audios_24k[i], dtype=np.float32)).to(device)
            wave = AF.resample(audio, SOURCE_SAMPLE_RATE, WAVLM_SAMPLE_RATE)[: lengths_16k[i]]
            waves.append((wave - wave.mean()) / torch.sqrt(wave.var(unbiased=False) + 1e-7))
        width = max(w.shape[0] for w in waves)
        batch = torch.zeros((len(waves), width), device=device)
        mask = torch.zeros((len(waves), width), dtype=torch.long, device=device)
        for row, wave in enumerate(waves):
            batch[row, : wave.shape[0]] = wave
            mask[row, : wave.shape[0]] = 1
        with torch.inference_mode():
            outputs = model(batch.to(dtype), attention_mask=mask, output_hidden_states=need_hidden_states)
            hidden = select_layer(outputs, layer, layer_weights).float()
            valid = model._get_feat_extract_output_lengths(mask.sum(dim=1))
            return [
                pool_to_mimi_frames(hidden[row, : int(valid[row])], n_frames[i]).to(torch.float16).cpu().numpy()
                for row, i in enumerate(indices)
            ]

    max_samples = int(max_batch_s * WAVLM_SAMPLE_RATE)
    for batch in budgeted_batches(lengths_16k, max_samples):
        for i, features in zip(batch, run_splitting_on_oom(batch, forward), strict=True):
            results[i] = features
        if on_batch:
            on_batch(len(batch))
    return results  # type: ignore[return-value]
