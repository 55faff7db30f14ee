"""A stored utterance read range by range from its encoded payload, never decoded whole.

Two hours at 24 kHz are 690 MB of float32 (460 MB at 16 kHz): no stage may hold them. The models
never need them whole either; a stage cuts a long utterance into windows and :class:`StreamedAudio`
answers exactly the slices those windows ask for: it keeps the encoded payload (FLAC: a few tens of MB
per hour of speech; pcm16: 173 MB per hour), decodes the slice's span of the stored audio plus a
margin (FLAC seeks to it), resamples that to the target rate and trims the margin, so each window
costs memory for the window only. At the stored rate (24 kHz) a slice is the stored samples themselves.

Resampling a window apart from its neighbours changes its samples only within the resampler's
filter length of its edges; the margin (:data:`RESAMPLER_MARGIN_S`) keeps that off the samples
returned.
"""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import soundfile as sf

from speechdata.audio import budget
from speechdata.audio.codec import PCM16_FULL_SCALE, resample, resampled_length

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


def is_long_form(n_samples: int, sample_rate: int) -> bool:
    """Past the whole-decode budget (:data:`~speechdata.audio.budget.MAX_UTTERANCE_SECONDS`, read
    when called): a stage reads such an utterance in windows (:class:`StreamedAudio`), never whole."""
    return n_samples > budget.MAX_UTTERANCE_SECONDS * sample_rate
