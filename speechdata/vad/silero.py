"""Speech segments with Silero VAD, many files at a time.

The model is the real one, loaded from the ``silero-vad`` package (its TorchScript file ships inside
the wheel, so this works offline). Silero's own ``get_speech_timestamps`` runs the model on one
512-sample window (32 ms at 16 kHz) per call, so Python and call overhead dominate. The model takes
a batch of windows with one recurrent state per row, so here the windows of up to ``batch_files``
files (sorted by length, zero-padded) go through it together, and each file's probabilities are then
cut into segments by silero's own ``get_speech_timestamps_from_probs``. The probabilities agree with
the one-file path to about 1e-5 (``tests/unit/test_vad.py``); ``benchmarks/stages/bench_vad.py`` measures
the speed-up.

Audio is resampled to 16 kHz with soxr before the model sees it; silero's fallback for 32/48 kHz
keeps every n-th sample, which aliases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from speechdata.audio.codec import downmix_to_mono, resample

VAD_SAMPLE_RATE = 16_000
WINDOW_SAMPLES = 512
"""Silero's window at 16 kHz: every probability covers 32 ms."""


@dataclass(frozen=True)
class VadParams:
    """Silero's segmentation thresholds (same names and meanings as ``get_speech_timestamps``)."""

    threshold: float = 0.5
    min_speech_duration_ms: int = 250
    min_silence_duration_ms: int = 100
    speech_pad_ms: int = 30
    max_speech_duration_s: float = math.inf

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SpeechSegments:
    """Speech of one file as ``[start_s, end_s)`` pairs in seconds from the start of the file."""

    start_s: tuple[float, ...]
    end_s: tuple[float, ...]

    @property
    def speech_s(self) -> float:
        return float(sum(e - s for s, e in zip(self.start_s, self.end_s, strict=True)))

    def __len__(self) -> int:
        return len(self.start_s)


def load_silero_model():
    """Silero VAD's TorchScript model from the installed package (no network).

    Importing ``silero_vad`` calls ``torch.set_num_threads(1)`` for the whole process; the previous
    setting is put back so the import does not slow other models in the same process.
    """
    import torch

    threads = torch.get_num_threads()
    try:
        from silero_vad import load_silero_vad

        model = load_silero_vad(onnx=False)
    finally:
        torch.set_num_threads(threads)
    return model


def to_vad_input(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """Decoded ``[frames]`` or ``[frames, channels]`` audio -> mono float32 at 16 kHz."""
    return resample(downmix_to_mono(samples), sample_rate, VAD_SAMPLE_RATE)


def speech_probabilities(model, signals: Sequence[np.ndarray], batch_files: int = 64) -> list[np.ndarray]:
    """One speech probability per 32 ms window for each 16 kHz mono signal (in input order)."""
    import torch

    order = sorted(range(len(signals)), key=lambda i: len(signals[i]))
    probabilities: list[np.ndarray] = [np.zeros(0, np.float32)] * len(signals)
    threads = torch.get_num_threads()
    # One [batch, 512] window per call is far too small to split: extra intra-op threads only spin
    # (on a busy 2-core machine they made a call many times slower). Scale out with processes.
    torch.set_num_threads(1)
    try:
        _fill_probabilities(model, signals, order, batch_files, probabilities)
    finally:
        torch.set_num_threads(threads)
    return probabilities


def _fill_probabilities(model, signals, order, batch_files, probabilities) -> None:
    import torch

    with torch.inference_mode():
        for first in range(0, len(order), batch_files):
            batch = order[first : first + batch_files]
            windows = [-(-len(signals[i]) // WINDOW_SAMPLES) for i in batch]
            n_windows = max(windows)
            if n_windows == 0:
                continue
            padded = np.zeros((len(batch), n_windows * WINDOW_SAMPLES), np.float32)
            for row, i in enumerate(batch):
                padded[row, : len(signals[i])] = signals[i]
            audio = torch.from_numpy(padded)
            model.reset_states()
            columns = [
                model(audio[:, w * WINDOW_SAMPLES : (w + 1) * WINDOW_SAMPLES], VAD_SAMPLE_RATE)[:, 0]
                for w in range(n_windows)
            ]
            probs = torch.stack(columns, dim=1).numpy()
            for row, i in enumerate(batch):
                probabilities[i] = probs[row, : windows[row]].copy()


def segments_from_probabilities(probs: np.ndarray, n_samples: int, params: VadParams) -> SpeechSegments:
    """Silero's own hysteresis, padding and minimum-length rules over one file's probabilities."""
    from silero_vad.utils_vad import get_speech_timestamps_from_probs

    if n_samples == 0:
        return SpeechSegments((), ())
    stamps = get_speech_timestamps_from_probs(
        [float(p) for p in probs],
        sampling_rate=VAD_SAMPLE_RATE,
        threshold=params.threshold,
        min_speech_duration_ms=params.min_speech_duration_ms,
        max_speech_duration_s=params.max_speech_duration_s,
        min_silence_duration_ms=params.min_silence_duration_ms,
        speech_pad_ms=params.speech_pad_ms,
        audio_length_samples=n_samples,
    )
    return SpeechSegments(
        tuple(stamp["start"] / VAD_SAMPLE_RATE for stamp in stamps),
        tuple(stamp["end"] / VAD_SAMPLE_RATE for stamp in stamps),
    )


def detect_speech(
    model, signals: Sequence[np.ndarray], params: VadParams = VadParams(), batch_files: int = 64
) -> list[SpeechSegments]:
    """Speech segments of each 16 kHz mono signal, the files batched through the model together."""
    probabilities = speech_probabilities(model, signals, batch_files)
    return [segments_from_probabilities(p, len(s), params) for p, s in zip(probabilities, signals, strict=True)]
