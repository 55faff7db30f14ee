"""Decode, cut, downmix, resample and encode audio.

Everything the platform stores is 24 kHz mono (Mimi's rate). Decoding goes through soundfile
(libsndfile reads WAV, FLAC, MP3 and Ogg/Opus). Resampling uses soxr or
torchaudio; ``benchmarks/stages/bench_resample.py`` measures both at every common source rate. soxr's HQ
preset is the default everywhere: it is clearly faster from 48 kHz (Opus and most web audio) and
from 8 kHz, torchaudio's sharpest kernel at comparable cost is close to it at 16-44.1 kHz (which
one leads changes between runs), and soxr's stopband is much deeper (docs/performance.md).
torchaudio stays available for tensors already on a GPU.
"""

from __future__ import annotations

import io
import math
from typing import IO, Literal

import numpy as np
import soundfile as sf
import soxr

from speechdata.audio.budget import check_audio_budget
from speechdata.audio.clock import SAMPLE_RATE

TARGET_SAMPLE_RATE = SAMPLE_RATE
"""Every landed utterance is normalized onto the bridge's clock."""

ResamplerName = Literal["soxr", "torchaudio"]

DEFAULT_RESAMPLER: ResamplerName = "soxr"

# The sharpest Kaiser-windowed sinc that keeps torchaudio near soxr's speed: >80 dB stopband
# rejection. torchaudio's default (Hann, width 6, rolloff 0.99) lets a 13 kHz tone alias at -12 dB.
TORCHAUDIO_HQ = dict(
    lowpass_filter_width=24,
    rolloff=0.945,
    resampling_method="sinc_interp_kaiser",
    beta=12.0,
)


def resampled_length(n_samples: int, source_rate: int, target_rate: int) -> int:
    """The number of output samples for ``n_samples`` inputs: ``ceil(n * target / source)``."""
    return -(-n_samples * target_rate // source_rate)


def _fit_length(samples: np.ndarray, length: int) -> np.ndarray:
    if samples.shape[0] >= length:
        return samples[:length]
    return np.pad(samples, (0, length - samples.shape[0]))


def resample(
    samples: np.ndarray,
    source_rate: int,
    target_rate: int = TARGET_SAMPLE_RATE,
    method: ResamplerName = DEFAULT_RESAMPLER,
) -> np.ndarray:
    """Resample mono float32 ``samples``; the result has exactly ``resampled_length`` samples."""
    if source_rate == target_rate:
        return samples.astype(np.float32, copy=False)
    length = resampled_length(samples.shape[0], source_rate, target_rate)
    if method == "soxr":
        out = soxr.resample(samples.astype(np.float32, copy=False), source_rate, target_rate, quality="HQ")
    elif method == "torchaudio":
        out = _resample_torchaudio(samples, source_rate, target_rate)
    else:
        raise ValueError(f"unknown resampler {method!r}; use 'soxr' or 'torchaudio'")
    return _fit_length(np.asarray(out, dtype=np.float32), length)


def _resample_torchaudio(samples: np.ndarray, source_rate: int, target_rate: int) -> np.ndarray:
    import torch
    import torchaudio.functional as AF

    with torch.inference_mode():
        tensor = torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))
        return AF.resample(tensor, source_rate, target_rate, **TORCHAUDIO_HQ).numpy()


def downmix_to_mono(samples: np.ndarray) -> np.ndarray:
    """Average the channels of a ``[frames, channels]`` array into ``[frames]``."""
    if samples.ndim == 1:
        return samples
    channels = samples.shape[1]
    if channels == 1:
        return samples[:, 0]
    # Column adds, not ``mean(axis=1)``: numpy's strided reduction over a short inner axis is
    # several times slower. The first add allocates the sum (no copy of channel 0 first); same
    # float32 additions in the same order.
    total = np.add(samples[:, 0], samples[:, 1])
    for channel in range(2, channels):
        total += samples[:, channel]
    total *= np.float32(1.0 / channels)
    return total


def read_segment(handle: IO, start_s: float | None = None, end_s: float | None = None) -> tuple[np.ndarray, int]:
    """Decode ``[start_s, end_s)`` of a file as float32 ``[frames, channels]`` and its sample rate.

    Only the segment is decoded where the codec can seek (all libsndfile formats can).
    """
    with sf.SoundFile(handle) as sound:
        return read_segment_from(sound, start_s, end_s), sound.samplerate


def read_segment_from(sound: sf.SoundFile, start_s: float | None, end_s: float | None) -> np.ndarray:
    """Decode ``[start_s, end_s)`` of an open file as float32 ``[frames, channels]``.

    The one place a landed file is decoded: a segment over the per-utterance memory budget raises
    :class:`~speechdata.audio.budget.OverMemoryBudget` from the header's figures, before any sample is read."""
    rate = sound.samplerate
    first = 0 if start_s is None else int(round(start_s * rate))
    last = sound.frames if end_s is None else min(int(round(end_s * rate)), sound.frames)
    check_audio_budget(max(last - first, 0), rate, sound.channels, what="the segment")
    sound.seek(first)
    return sound.read(max(last - first, 0), dtype="float32", always_2d=True)


def to_target_mono(
    samples: np.ndarray,
    source_rate: int,
    target_rate: int = TARGET_SAMPLE_RATE,
    method: ResamplerName = DEFAULT_RESAMPLER,
) -> np.ndarray:
    return resample(downmix_to_mono(samples), source_rate, target_rate, method)


AudioCodec = Literal["flac16", "flac24", "pcm16"]
AUDIO_CODECS: tuple[AudioCodec, ...] = ("flac16", "flac24", "pcm16")
"""How stored audio is encoded: raw little-endian 16-bit PCM (the default: no encoding or decoding
cost) or FLAC (16- or 24-bit, lossless, fewer bytes; docs/performance.md weighs the two)."""

DEFAULT_AUDIO_CODEC: AudioCodec = "pcm16"
"""docs/performance.md, Ingest: pcm16 takes FLAC's encoding out of ingest and its decoding
out of packing, for 85 MB more disk per audio hour (173 against 88 MB on speech; +16 % over the
container, the feature stores and the tars)."""

PCM16_CODECS: tuple[AudioCodec, ...] = ("flac16", "pcm16")
"""Codecs that store the same 16-bit integers: every product made from them is identical."""

PCM16_FULL_SCALE = np.float32(32768.0)
"""16-bit samples decode as ``v / 32768``: libsndfile's convention (what ``soundfile`` gives for a
FLAC or WAV file), so stored FLAC, stored PCM and the tar's WAV member all read back as the same floats.
Encoding multiplies by 32767 (libsndfile's too), so full scale never wraps."""


def quantize_pcm16(samples: np.ndarray) -> np.ndarray:
    """``rint(clip(x, -1, 1) * 32767)`` as little-endian int16, in one float32 buffer.

    Scaling first and clipping at +-32767 gives the same integers (``x * 32767`` rounds monotonically
    and ``1.0 * 32767`` is exact) with one temporary instead of three: this runs on every stored sample.
    """
    samples = np.asarray(samples)
    dtype = np.float64 if samples.dtype == np.float64 else np.float32
    scaled = np.multiply(samples, dtype(32767.0), dtype=dtype)
    np.clip(scaled, -32767.0, 32767.0, out=scaled)
    np.rint(scaled, out=scaled)
    return scaled.astype("<i2")


def encode_flac(samples: np.ndarray, sample_rate: int, subtype: str = "PCM_16") -> bytes:
    """Encode mono float samples as FLAC; values beyond full scale are clipped, not wrapped."""
    buffer = io.BytesIO()
    # PCM_16 is quantized in numpy: faster than libsndfile's float conversion, and the same rounding as pcm16.
    clipped = quantize_pcm16(samples) if subtype == "PCM_16" else np.clip(samples, -1.0, 1.0)
    sf.write(buffer, clipped, sample_rate, format="FLAC", subtype=subtype, compression_level=0.0)
    return buffer.getvalue()


def encode_audio(samples: np.ndarray, sample_rate: int, codec: AudioCodec) -> bytes:
    """Encode mono float samples with ``codec``; values beyond full scale are clipped, not wrapped."""
    if codec == "flac16":
        return encode_flac(samples, sample_rate, "PCM_16")
    if codec == "flac24":
        return encode_flac(samples, sample_rate, "PCM_24")
    if codec == "pcm16":
        return quantize_pcm16(samples).tobytes()
    raise ValueError(f"unknown audio codec {codec!r}; use one of {', '.join(AUDIO_CODECS)}")


def encode_audio_payload(samples: np.ndarray, sample_rate: int, codec: AudioCodec) -> bytes | np.ndarray:
    """:func:`encode_audio`'s bytes, as a ``bytes`` or a contiguous array holding them: pcm16 gives
    the int16 samples without copying them into a ``bytes`` (a fresh allocation per utterance, which
    cost ingest more than the quantization itself)."""
    if codec == "pcm16":
        return quantize_pcm16(samples)
    return encode_audio(samples, sample_rate, codec)


def stored_frames(data, codec: AudioCodec) -> int:
    """How many samples a stored payload holds, from its size (pcm16) or its header (FLAC)."""
    if codec == "pcm16":
        return memoryview(data).nbytes // 2
    return int(sf.info(io.BytesIO(data)).frames)


def check_stored_audio_budget(data, codec: AudioCodec) -> None:
    """:func:`~speechdata.audio.budget.check_audio_budget` for a payload of ``audio_24k.parquet``."""
    if codec in AUDIO_CODECS:
        check_audio_budget(stored_frames(data, codec), TARGET_SAMPLE_RATE, what="the stored utterance")


def decode_audio(data: bytes, codec: AudioCodec) -> np.ndarray:
    """Decode bytes written by :func:`encode_audio` into mono float32 samples.

    flac16 and pcm16 give identical arrays (:data:`PCM16_FULL_SCALE`). Stored audio is 24 kHz: an
    utterance over the per-utterance memory budget raises before it is decoded.
    """
    check_stored_audio_budget(data, codec)
    if codec == "pcm16":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / PCM16_FULL_SCALE
    if codec in ("flac16", "flac24"):
        samples, _ = sf.read(io.BytesIO(data), dtype="float32")
        return samples
    raise ValueError(f"unknown audio codec {codec!r}; use one of {', '.join(AUDIO_CODECS)}")


def decode_pcm16(data, codec: AudioCodec) -> np.ndarray:
    """The stored 16-bit integers of a flac16 or pcm16 payload, as little-endian int16 ``[n]``.

    No float round trip: pcm16 is a read-only view of ``data`` itself, flac16 decodes straight to int16.
    """
    check_stored_audio_budget(data, codec)
    if codec == "pcm16":
        return np.frombuffer(data, dtype="<i2")
    if codec == "flac16":
        samples, _ = sf.read(io.BytesIO(data), dtype="int16")
        return samples.astype("<i2", copy=False)
    raise ValueError(f"{codec!r} does not store 16-bit samples; use one of {', '.join(PCM16_CODECS)}")


def seconds(n_samples: int, sample_rate: int) -> float:
    return n_samples / sample_rate if sample_rate else math.nan
