"""A long utterance's 16 kHz audio, decoded window by window from its stored payload, never whole.

Two hours at 16 kHz are 460 MB of float32 (and 690 MB at the stored 24 kHz, plus the resampler's
copies): the alignment stage must not hold them. The model never needs them whole either: an
utterance longer than ``max_window_s`` is cut into windows on the frame grid
(:func:`speechdata.alignment.log_probs.windowed_log_probs`). :class:`StreamedAudio` answers exactly the
slices those windows ask for: it keeps the encoded payload (FLAC: a few tens of MB per hour of speech;
pcm16: 173 MB per hour), decodes the slice's span of the stored audio plus a margin (FLAC seeks to
it), resamples that to 16 kHz and trims the margin, so each window costs memory for the window only.

Resampling a window apart from its neighbours changes its samples only within the resampler's
filter length of its edges; the margin (:data:`RESAMPLER_MARGIN_S`) keeps that off the samples
returned, and the window's ``context_s`` keeps the model's edge effects off the frames kept.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import soundfile as sf

from speechdata.audio.budget import MAX_LONG_FORM_SECONDS, check_audio_budget
from speechdata.audio.codec import PCM16_FULL_SCALE, decode_audio, resample, resampled_length

STREAM_FROM_S = 300.0
"""Utterances longer than this (5 minutes) are streamed in windows for alignment; shorter ones are
decoded whole (a few MB), as before."""

RESAMPLER_MARGIN_S = 0.05
"""Stored audio decoded on each side of a window, then trimmed after resampling: longer than the
resampler's filter (soxr HQ: a few ms)."""


class StreamedAudio:
    """Slicable like the 16 kHz float32 array of an encoded utterance: ``audio[a:b]``, ``audio.shape``."""

    def __init__(self, data: bytes | pa.Buffer, codec: str, source_rate: int, n_samples: int, target_rate: int):
        if codec not in ("pcm16", "flac16", "flac24"):
            raise ValueError(f"cannot stream audio stored as {codec!r}")
        self.data, self.codec, self.source_rate, self.n_samples = data, codec, source_rate, n_samples
        self.target_rate = target_rate
        self.shape = (resampled_length(n_samples, source_rate, target_rate),)
        self.dtype = np.dtype(np.float32)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice) or index.step not in (None, 1):
            raise TypeError("StreamedAudio takes contiguous slices only")
        start, stop, _ = index.indices(self.shape[0])
        if stop <= start:
            return np.zeros(0, np.float32)
        margin = int(RESAMPLER_MARGIN_S * self.source_rate)
        # the stored samples [start, stop) covers at the target rate, widened by the margin; `first` on
        # both rates' common grid, so that the window's samples fall on the whole utterance's grid
        step = self.source_rate // int(np.gcd(self.source_rate, self.target_rate))
        first = max(0, start * self.source_rate // self.target_rate - margin)
        first -= first % step
        last = min(self.n_samples, -(-stop * self.source_rate // self.target_rate) + margin)
        window = resample(self._stored(first, last), self.source_rate, self.target_rate)
        offset = start - first * self.target_rate // self.source_rate
        return np.ascontiguousarray(window[offset : offset + (stop - start)], dtype=np.float32)

    def _stored(self, first: int, last: int) -> np.ndarray:
        if self.codec == "pcm16":
            pcm = np.frombuffer(self.data, dtype="<i2", count=last - first, offset=2 * first)
            return pcm.astype(np.float32) / PCM16_FULL_SCALE
        # a BufferReader reads the payload in place (a BytesIO over anything but ``bytes`` would copy it)
        source = io.BytesIO(self.data) if isinstance(self.data, bytes) else pa.BufferReader(self.data)
        with sf.SoundFile(source) as sound:
            sound.seek(first)
            return sound.read(last - first, dtype="float32")


def model_audio(
    data: bytes, codec: str, source_rate: int, n_samples: int, target_rate: int
) -> np.ndarray | StreamedAudio:
    """A stored utterance for the model at ``target_rate``: decoded whole when short, else streamed.

    Past :data:`~speechdata.audio.budget.MAX_LONG_FORM_SECONDS` it raises
    :class:`~speechdata.audio.budget.OverMemoryBudget` without decoding anything."""
    if n_samples > STREAM_FROM_S * source_rate:
        check_audio_budget(n_samples, source_rate, what="the stored utterance", max_seconds=MAX_LONG_FORM_SECONDS)
        return StreamedAudio(data, codec, source_rate, n_samples, target_rate)
    return resample(decode_audio(data, codec), source_rate, target_rate)
