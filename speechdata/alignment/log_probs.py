"""CTC log-probabilities for many utterances: length-sorted batches, long audio in windows.

Batches are built from utterances sorted by length so that padding stays small, and capped in
padded audio seconds so that memory is bounded whatever the shard. An utterance longer than
``max_window_s`` is never given to the model whole (attention memory grows with the square of its
length): it is cut into windows on the model's frame grid, each with ``context_s`` of audio on
either side, and only each window's central frames are kept.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MODEL_SAMPLE_RATE = 16_000
CTC_FRAME_S = 0.08
"""Output frame of parakeet's CTC models (10 ms stride x 8x subsampling). Equal to Mimi's frame by
coincidence: it is the acoustic model's clock, not the bridge's (speechdata.audio.clock)."""

ForwardFn = Callable[[list[np.ndarray]], list[np.ndarray]]
"""Model forward over a batch of 16 kHz mono float32 arrays; returns log-probs ``[T_i, V]`` each."""


@dataclass(frozen=True)
class LogProbSettings:
    frame_s: float = CTC_FRAME_S
    """Seconds per output frame of the model (window stride x subsampling)."""
    max_batch_s: float = 240.0
    """Padded audio seconds per forward call."""
    max_window_s: float = 40.0
    """Longest audio the model sees in one piece; longer utterances are windowed."""
    context_s: float = 4.0
    """Audio on each side of a window's kept frames, so they see context."""

    @property
    def frame_samples(self) -> int:
        return int(round(self.frame_s * MODEL_SAMPLE_RATE))


def batches_by_length(lengths: Sequence[int], max_batch_samples: int) -> list[list[int]]:
    """Indices grouped into batches of similar length, each at most ``max_batch_samples`` padded."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and lengths[i] * (len(current) + 1) > max_batch_samples:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def windowed_log_probs(forward: ForwardFn, audio: np.ndarray, settings: LogProbSettings) -> np.ndarray:
    """Log-probs of a long utterance from overlapping windows, stitched on the frame grid."""
    step = settings.frame_samples
    context = int(round(settings.context_s / settings.frame_s))
    core = max(1, int(settings.max_window_s / settings.frame_s) - 2 * context)
    total = -(-audio.shape[0] // step)
    # the frames are written into one array as they come: joining a list of pieces would hold the
    # utterance's log-probs twice (2 hours at 1 025 classes: 369 MB each)
    joined: np.ndarray | None = None
    filled = 0
    for core_start in range(0, total, core):
        core_stop = min(core_start + core, total)
        window_start = max(0, core_start - context)
        window_stop = min(total, core_stop + context)
        [window] = forward([audio[window_start * step : window_stop * step]])
        offset = core_start - window_start
        piece = window[offset : offset + (core_stop - core_start)]
        if joined is None:
            joined = np.empty((total, *piece.shape[1:]), dtype=piece.dtype)
        joined[filled : filled + piece.shape[0]] = piece
        filled += piece.shape[0]
    return joined[:filled]


def compute_log_probs(
    forward: ForwardFn, audios: Sequence[np.ndarray], settings: LogProbSettings = LogProbSettings()
) -> list[np.ndarray]:
    """Log-probs ``[T_i, V]`` for each utterance, in input order."""
    results: list[np.ndarray | None] = [None] * len(audios)
    window_limit = int(settings.max_window_s * MODEL_SAMPLE_RATE)
    short = [i for i, a in enumerate(audios) if a.shape[0] <= window_limit]
    for i, audio in enumerate(audios):
        if audio.shape[0] > window_limit:
            results[i] = windowed_log_probs(forward, audio, settings)
    lengths = [audios[i].shape[0] for i in short]
    for batch in batches_by_length(lengths, int(settings.max_batch_s * MODEL_SAMPLE_RATE)):
        indices = [short[j] for j in batch]
        for i, log_probs in zip(indices, forward([audios[i] for i in indices]), strict=True):
            results[i] = log_probs
    return results  # type: ignore[return-value]


def ctc_model_forward(acoustic, device: str = "cpu") -> ForwardFn:
    """A :data:`ForwardFn` over a :class:`~speechdata.alignment.acoustic_models.CtcAcousticModel`.

    The batch goes through the model's own feature extractor (log-mel, per-feature normalization
    over each utterance's real frames, padding masked), then the encoder and the CTC head; each
    utterance's log-probs are trimmed to its own encoder length.
    """
    import torch

    model = acoustic.model

    def forward(batch: list[np.ndarray]) -> list[np.ndarray]:
        features = acoustic.feature_extractor(
            [np.ascontiguousarray(audio, dtype=np.float32) for audio in batch],
            sampling_rate=MODEL_SAMPLE_RATE,
            return_attention_mask=True,
            return_tensors="pt",
            device=device,
        )
        with torch.inference_mode():
            # The encoder, not ParakeetForCTC.forward, so its output mask (each utterance's frames) comes back.
            encoded = model.encoder(
                input_features=features["input_features"].to(device),
                attention_mask=features["attention_mask"].to(device),
            )
            log_probs = torch.log_softmax(model.ctc_head(encoded.last_hidden_state).float(), dim=-1)
        frames = encoded.attention_mask.sum(-1).cpu()
        log_probs = log_probs.cpu().numpy()
        return [log_probs[row, : int(n)] for row, n in enumerate(frames)]

    return forward
