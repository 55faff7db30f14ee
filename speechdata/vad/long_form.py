"""Speech segments of a landed file past the whole-decode budget, found window by window.

A long-form recording (past :data:`~speechdata.audio.budget.MAX_UTTERANCE_SECONDS`, up to
:data:`~speechdata.audio.budget.MAX_LONG_FORM_SECONDS`) is never decoded whole: its source audio is
read :data:`READ_S` at a time, downmixed and resampled to 16 kHz with soxr's streaming resampler (the
samples the whole path's resampler gives, to its rounding), cut into windows of :data:`WINDOW_S` (a
whole number of Silero's 32 ms steps, so the windows' probabilities fall on the whole file's grid),
and :data:`WINDOWS_PER_CALL` windows at a time go through the model as a batch. The probabilities
are joined and Silero's own rules (:func:`~speechdata.vad.silero.segments_from_probabilities`) run
once over the whole file, as for any file: a segment crossing a window edge stays one segment. The
model's state starts afresh at each window, which moves a probability for a few steps after an edge.
"""

from __future__ import annotations

import numpy as np
import soundfile as sf
import soxr

from speechdata.audio.codec import downmix_to_mono, resampled_length
from speechdata.vad.silero import (
    VAD_SAMPLE_RATE,
    WINDOW_SAMPLES,
    SpeechSegments,
    VadParams,
    segments_from_probabilities,
    speech_probabilities,
)

READ_S = 10.0
WINDOW_S = 60.0
WINDOWS_PER_CALL = 16
"""16 windows of 60 s at 16 kHz: 61 MB of model input at once."""


def long_file_speech(
    model, sound: sf.SoundFile, params: VadParams = VadParams(), window_s: float | None = None
) -> SpeechSegments:
    """Speech segments of the whole of ``sound``, decoded :data:`READ_S` at a time (module docstring)."""
    rate = sound.samplerate
    window = (
        max(1, int((WINDOW_S if window_s is None else window_s) * VAD_SAMPLE_RATE) // WINDOW_SAMPLES) * WINDOW_SAMPLES
    )
    length = resampled_length(sound.frames, rate, VAD_SAMPLE_RATE)
    stream = None if rate == VAD_SAMPLE_RATE else soxr.ResampleStream(rate, VAD_SAMPLE_RATE, 1, "float32", "HQ")
    probabilities: list[np.ndarray] = []
    pending: list[np.ndarray] = []
    buffered: list[np.ndarray] = []
    buffered_n = produced = read = 0

    def take(n: int) -> np.ndarray:
        nonlocal buffered, buffered_n
        joined = np.concatenate(buffered) if len(buffered) != 1 else buffered[0]
        buffered, buffered_n = ([joined[n:]], joined.size - n) if joined.size > n else ([], 0)
        return joined[:n]

    def flush() -> None:
        nonlocal pending
        if pending:
            probabilities.extend(speech_probabilities(model, pending))
            pending = []

    sound.seek(0)
    block = max(1, int(READ_S * rate))
    while read < sound.frames:
        samples = sound.read(min(block, sound.frames - read), dtype="float32", always_2d=True)
        if samples.shape[0] == 0:
            break
        read += samples.shape[0]
        mono = np.ascontiguousarray(downmix_to_mono(samples), np.float32)
        out = mono if stream is None else stream.resample_chunk(mono, last=read >= sound.frames)
        out = out[: max(0, length - produced)]  # the whole path's length: ceil(frames x 16 kHz / rate)
        produced += out.size
        buffered.append(out)
        buffered_n += out.size
        while buffered_n >= window:
            pending.append(take(window))
            if len(pending) == WINDOWS_PER_CALL:
                flush()
    if produced < length:
        buffered.append(np.zeros(length - produced, np.float32))
        buffered_n += length - produced
    if buffered_n:
        pending.append(take(buffered_n))
    flush()
    joined = np.concatenate(probabilities) if probabilities else np.zeros(0, np.float32)
    return segments_from_probabilities(joined, length, params)
