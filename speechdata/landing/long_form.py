"""Normalize a recording longer than the whole-decode budget in streamed chunks.

An utterance past :data:`~speechdata.audio.budget.MAX_UTTERANCE_SECONDS` (and up to
:data:`~speechdata.audio.budget.MAX_LONG_FORM_SECONDS`) is never decoded whole: two passes over
the landed file, :data:`CHUNK_S` of source audio at a time. The first measures what the whole-file
checks need (non-finite samples, peak, per-channel and downmix energy, clipped samples, the DC
offset's mean and 0.5 s block means); the second downmixes, removes the offset, resamples with
soxr's streaming resampler and encodes chunk by chunk. Memory is one chunk of source audio plus the
encoded payload (a 2-hour recording: ~200 MB of 24 kHz FLAC, 345 MB of pcm16). The stored samples
equal the whole-decode path's to the resampler's rounding (``tests/unit/test_long_form_ingest.py``).
"""

from __future__ import annotations

import io
import math

import numpy as np
import soundfile as sf
import soxr

from speechdata.accounting.rejects import Reject
from speechdata.audio.codec import TARGET_SAMPLE_RATE, AudioCodec, downmix_to_mono, quantize_pcm16, resampled_length
from speechdata.audio.container import EncodedUtterance
from speechdata.audio.dc_offset import BLOCK_S, FULL_SCALE, MAX_BLOCK_SPREAD_RATIO, REMOVE_ABOVE_RATIO
from speechdata.audio.truth import (
    CLIPPING_LEVEL,
    DIGITAL_SILENCE_PEAK,
    DOWNMIX_CANCELLATION_DB,
    MAX_CLIPPED_SHARE,
    clipping_problem,
)

CHUNK_S = 60.0
"""Source audio decoded at once (a whole number of DC-offset blocks): 60 s of 48 kHz stereo is 23 MB."""

_FLAC_SUBTYPES = {"flac16": "PCM_16", "flac24": "PCM_24"}


class _WholeFileMeasures:
    """What the whole-decode checks of ``speechdata.audio.truth`` and ``dc_offset`` need, summed chunk by chunk."""

    def __init__(self, channels: int, block: int):
        self.block = block
        self.frames = 0
        self.non_finite = 0
        self.peak = 0.0
        self.clipped = 0
        self.channel_energy = np.zeros(channels, np.float64)
        self.mono_energy = 0.0
        self.mono_sum = 0.0
        self.mono_min = math.inf
        self.mono_max = -math.inf
        self.block_means: list[np.ndarray] = []

    def add(self, samples: np.ndarray, mono: np.ndarray) -> None:
        finite = np.isfinite(samples)
        self.non_finite += samples.size - int(np.count_nonzero(finite))
        self.frames += samples.shape[0]
        if self.non_finite:
            return
        self.peak = max(self.peak, float(np.max(np.abs(samples))) if samples.size else 0.0)
        self.clipped += int(np.count_nonzero(np.abs(samples) >= CLIPPING_LEVEL))
        wide = samples.astype(np.float64)
        self.channel_energy += np.einsum("ij,ij->j", wide, wide)
        values = mono.astype(np.float64)
        self.mono_energy += float(values @ values)
        self.mono_sum += float(values.sum())
        if values.size:
            self.mono_min = min(self.mono_min, float(values.min()))
            self.mono_max = max(self.mono_max, float(values.max()))
        n_blocks = values.size // self.block
        if n_blocks:
            self.block_means.append(values[: n_blocks * self.block].reshape(n_blocks, self.block).mean(axis=1))

    def problem(self, max_clipped_share: float) -> tuple[str, str] | None:
        """``speechdata.audio.truth.signal_problem`` then ``clipping_problem``, from the sums."""
        size = self.frames * self.channel_energy.size
        if self.non_finite:
            return "non_finite_audio", f"{self.non_finite} of at least {size} decoded samples are NaN or infinite"
        if self.peak < DIGITAL_SILENCE_PEAK:
            return "digital_silence", f"every sample is below one 16-bit step (peak {self.peak:.3g})"
        if self.channel_energy.size > 1 and self.frames:
            loudest_rms = float(np.sqrt(self.channel_energy.max() / self.frames))
            mono_rms = math.sqrt(self.mono_energy / self.frames)
            if mono_rms < loudest_rms * 10 ** (-DOWNMIX_CANCELLATION_DB / 20):
                ratio_db = 20 * np.log10(loudest_rms / mono_rms) if mono_rms > 0 else float("inf")
                return (
                    "cancelled_by_downmix",
                    f"the {self.channel_energy.size} channels cancel when mixed to mono: the mix is {ratio_db:.1f} dB "
                    f"below the loudest channel (limit {DOWNMIX_CANCELLATION_DB:.0f} dB)",
                )
        return clipping_problem(self.clipped_share, max_clipped_share)

    @property
    def clipped_share(self) -> float:
        size = self.frames * self.channel_energy.size
        return self.clipped / size if size else 0.0

    def removable_offset(self) -> float | None:
        """``speechdata.audio.dc_offset.removable_offset`` of the whole downmix."""
        if not self.frames:
            return None
        mean = self.mono_sum / self.frames
        rms = math.sqrt(self.mono_energy / self.frames)
        if rms <= 1e-12 or abs(mean) / rms < REMOVE_ABOVE_RATIO:
            return None
        if max(abs(self.mono_min), abs(self.mono_max)) >= FULL_SCALE:
            return None
        if max(self.mono_max - mean, mean - self.mono_min) >= FULL_SCALE:
            return None
        means = np.concatenate(self.block_means) if self.block_means else np.zeros(0)
        if means.size >= 2 and float(np.max(np.abs(means - mean))) > MAX_BLOCK_SPREAD_RATIO * rms:
            return None
        return mean


def _chunks(sound: sf.SoundFile, first: int, last: int, chunk_frames: int):
    sound.seek(first)
    position = first
    while position < last:
        samples = sound.read(min(chunk_frames, last - position), dtype="float32", always_2d=True)
        if samples.shape[0] == 0:
            return
        position += samples.shape[0]
        yield samples


def normalize_long_segment(
    sound: sf.SoundFile,
    utt_id: str,
    audio_path: str,
    first: int,
    last: int,
    codec: AudioCodec,
    stage: str,
    max_clipped_share: float = MAX_CLIPPED_SHARE,
    chunk_s: float | None = None,
) -> EncodedUtterance | Reject:
    """Frames ``[first, last)`` of ``sound`` as a 24 kHz mono utterance, streamed (soxr HQ), or a reject
    (the whole-decode path's reasons). ``last`` is already within the file."""
    rate = sound.samplerate
    block = max(1, int(BLOCK_S * rate))
    chunk_frames = max(block, int((CHUNK_S if chunk_s is None else chunk_s) * rate) // block * block)
    measures = _WholeFileMeasures(sound.channels, block)
    for samples in _chunks(sound, first, last, chunk_frames):
        measures.add(samples, downmix_to_mono(samples))
    if measures.frames == 0:
        return Reject(utt_id, stage, "audio_empty", f"{audio_path}: no samples decoded")
    problem = measures.problem(max_clipped_share)
    if problem is not None:
        reason, detail = problem
        return Reject(utt_id, stage, reason, f"{audio_path}: {detail}")
    offset = measures.removable_offset()
    length = resampled_length(measures.frames, rate, TARGET_SAMPLE_RATE)
    encoder = _StreamedEncoder(codec, length)
    stream = None if rate == TARGET_SAMPLE_RATE else soxr.ResampleStream(rate, TARGET_SAMPLE_RATE, 1, "float32", "HQ")
    read = 0
    for samples in _chunks(sound, first, first + measures.frames, chunk_frames):
        read += samples.shape[0]
        mono = np.ascontiguousarray(downmix_to_mono(samples), np.float32)
        if offset is not None:
            mono = (mono - np.float32(offset)).astype(np.float32, copy=False)
        encoder.write(mono if stream is None else stream.resample_chunk(mono, last=read >= measures.frames))
    return EncodedUtterance(
        utt_id,
        TARGET_SAMPLE_RATE,
        length,
        codec,
        encoder.payload(),
        clipped_share=float(np.float32(measures.clipped_share)),
    )


class _StreamedEncoder:
    """Encode 24 kHz chunks into one payload of exactly ``length`` samples (zero-padded or trimmed, as
    :func:`speechdata.audio.codec.resample` fits its output)."""

    def __init__(self, codec: AudioCodec, length: int):
        self.codec = codec
        self.length = length
        self.written = 0
        if codec == "pcm16":
            self._pcm = np.zeros(length, "<i2")
        elif codec in _FLAC_SUBTYPES:
            self._buffer = io.BytesIO()
            self._flac = sf.SoundFile(
                self._buffer,
                "w",
                TARGET_SAMPLE_RATE,
                1,
                _FLAC_SUBTYPES[codec],
                format="FLAC",
                compression_level=0.0,
            )
        else:
            raise ValueError(f"unknown audio codec {codec!r}")

    def write(self, samples: np.ndarray) -> None:
        samples = samples[: self.length - self.written]
        if not samples.size:
            return
        if self.codec == "pcm16":
            self._pcm[self.written : self.written + samples.size] = quantize_pcm16(samples)
        elif self.codec == "flac16":
            self._flac.write(quantize_pcm16(samples))
        else:
            self._flac.write(np.clip(samples, -1.0, 1.0))
        self.written += samples.size

    def payload(self) -> bytes | np.ndarray:
        if self.codec == "pcm16":
            return self._pcm
        if self.written < self.length:
            self._flac.write(np.zeros(self.length - self.written, "<i2" if self.codec == "flac16" else np.float32))
        self._flac.close()
        return np.frombuffer(self._buffer.getbuffer(), np.uint8)  # the buffer itself, not a copy of it
