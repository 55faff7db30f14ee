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


WINDOW_FRAMES = 375
"""A long utterance's WavLM runs on windows of this many Mimi frames (30 s) ..."""

CONTEXT_FRAMES = 25
"""... each seen with this many frames (2 s) of its neighbours on either side, whose features are
dropped: WavLM's convolutions and attention see past a window's edge, the kept frames do not."""


def wavlm_features_streamed(
    model,
    audio,
    n_frames: int,
    *,
    device: str | torch.device,
    dtype: torch.dtype = torch.float32,
    layer: int | None = None,
    layer_weights: Sequence[float] | None = None,
    window_frames: int = WINDOW_FRAMES,
    context_frames: int = CONTEXT_FRAMES,
) -> np.ndarray:
    """float16 ``[n_frames, hidden]`` of a long utterance, window by window (never the whole audio).

    ``audio``: the utterance at 24 kHz, sliceable (:class:`~speechdata.audio.streamed.StreamedAudio`,
    or an array). Each window of ``window_frames`` Mimi frames is cut on the frame grid with
    ``context_frames`` on each side, resampled to 16 kHz, normalized with the *whole* utterance's mean
    and variance (measured in a first pass over the same windows, so the level is what
    :func:`wavlm_features` gives), run through WavLM and pooled; its own frames are kept. A window
    covering the whole utterance gives :func:`wavlm_features`'s result to float16 rounding."""
    import torchaudio.functional as AF

    total = audio.shape[0]
    samples_per_frame = SOURCE_SAMPLE_RATE * 2 // 25  # 1920 at 24 kHz: one 80 ms Mimi frame
    per_frame_16k = WAVLM_SAMPLE_RATE * 2 // 25
    need_hidden_states = layer is not None or layer_weights is not None

    def windows():
        for first in range(0, n_frames, window_frames):
            last = min(first + window_frames, n_frames)
            start = max(0, first - context_frames)
            stop = min(n_frames, last + context_frames)
            pcm = np.asarray(audio[start * samples_per_frame : min(stop * samples_per_frame, total)], np.float32)
            with torch.inference_mode():
                wave = AF.resample(
                    torch.from_numpy(np.ascontiguousarray(pcm)).to(device), SOURCE_SAMPLE_RATE, WAVLM_SAMPLE_RATE
                )
            wave = wave[: -(-pcm.shape[0] * WAVLM_SAMPLE_RATE // SOURCE_SAMPLE_RATE)]
            yield first, last, start, stop, wave

    count, total_sum, total_squares = 0, 0.0, 0.0
    for first, last, start, _, wave in windows():
        own = wave[(first - start) * per_frame_16k : (last - start) * per_frame_16k].double()
        count += own.numel()
        total_sum += float(own.sum())
        total_squares += float((own * own).sum())
    mean = total_sum / max(count, 1)
    std = float(np.sqrt(max(total_squares / max(count, 1) - mean * mean, 0.0) + 1e-7))

    pieces = []
    for first, last, start, stop, wave in windows():
        batch = ((wave - mean) / std).unsqueeze(0)
        mask = torch.ones_like(batch, dtype=torch.long)
        with torch.inference_mode():
            outputs = model(batch.to(dtype), attention_mask=mask, output_hidden_states=need_hidden_states)
            hidden = select_layer(outputs, layer, layer_weights).float()[0]
            pooled = pool_to_mimi_frames(hidden, stop - start)
        pieces.append(pooled[first - start : last - start].to(torch.float16).cpu().numpy())
    return np.concatenate(pieces) if pieces else np.zeros((n_frames, model.config.hidden_size), np.float16)
