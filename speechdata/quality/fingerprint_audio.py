"""Audio identity of an utterance: an exact hash of its samples and a robust binary fingerprint.

The exact hash is a SHA-256 of the 16-bit samples at 24 kHz with leading and trailing digital
silence removed, so the same recording in another container, with other tags or other padding,
hashes the same.

The fingerprint follows Haitsma and Kalker ("A Highly Robust Audio Fingerprinting System", 2002):
the audio at 8 kHz is cut into 256 ms Hann frames every 16 ms; each frame's energy in 33
log-spaced bands from 300 to 2000 Hz gives one 32-bit *sub-fingerprint*, bit m set when the energy
difference of bands m and m+1 grew since the previous frame. Only signs of differences of log
energies are kept, so a gain change leaves the bits as they were; the band range sits below every
common resampling cutoff and where lossy codecs keep most of the signal; the long frames with a
short hop make bits of a copy trimmed by any amount close to the original's at the nearest hop.
Frames quieter than 40 dB below the utterance's loudest are marked inactive: their bits are noise,
and digital silence would make every silent stretch match every other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import soxr

from speechdata.audio.codec import PCM16_FULL_SCALE

FINGERPRINT_SAMPLE_RATE = 8_000
FRAME_SAMPLES = 2_048
"""256 ms at 8 kHz: long frames change slowly from one hop to the next (robust to trimming)."""
HOP_SAMPLES = 128
"""16 ms at 8 kHz: a trimmed copy is never more than 8 ms off the original's frame grid."""
BAND_EDGES_HZ = np.geomspace(300.0, 2_000.0, 34)
"""33 bands, so 32 differences: one 32-bit sub-fingerprint per frame."""
ACTIVE_FLOOR_DB = 40.0
"""Frames this far below the loudest frame of the utterance carry no usable bits."""
BITS_PER_SUB_FINGERPRINT = 32
FRAMES_PER_WINDOW = 1_024
"""Frames transformed at once (16 s of audio): bounds the fingerprint's working memory per utterance."""


@dataclass(frozen=True)
class AudioFingerprint:
    """``sub_fingerprints`` uint32 ``[frames]`` and ``active`` bool ``[frames]`` (frame n starts at
    ``n * HOP_SAMPLES / FINGERPRINT_SAMPLE_RATE`` seconds)."""

    sub_fingerprints: np.ndarray
    active: np.ndarray

    @property
    def frames(self) -> int:
        return len(self.sub_fingerprints)

    def to_bytes(self) -> tuple[bytes, bytes]:
        """``(sub-fingerprints as little-endian uint32, active flags packed 8 per byte)``."""
        return self.sub_fingerprints.astype("<u4").tobytes(), np.packbits(self.active).tobytes()

    @classmethod
    def from_bytes(cls, sub_fingerprints: bytes, active: bytes) -> AudioFingerprint:
        values = np.frombuffer(sub_fingerprints, "<u4").astype(np.uint32)
        flags = np.unpackbits(np.frombuffer(active, np.uint8), count=len(values)).astype(bool)
        return cls(values, flags)


EMPTY_FINGERPRINT = AudioFingerprint(np.zeros(0, np.uint32), np.zeros(0, bool))


def exact_audio_hash(samples: np.ndarray) -> str | None:
    """SHA-256 (hex) of ``samples`` (decoded floats, or the int16 samples themselves) as 16-bit PCM, leading and trailing
    zeros removed; None for audio that is all digital silence (silence is no one's duplicate)."""
    pcm = samples if samples.dtype == np.int16 else _pcm16(samples)
    # First and last non-zero sample from a bool mask (1 byte a sample), not the index of every one.
    nonzero = pcm != 0
    if not nonzero.any():
        return None
    first, end = int(np.argmax(nonzero)), len(pcm) - int(np.argmax(nonzero[::-1]))
    return hashlib.sha256(np.ascontiguousarray(pcm[first:end], "<i2")).hexdigest()


def _pcm16(samples: np.ndarray) -> np.ndarray:
    """The 16-bit integers that decode to ``samples`` (stored audio decodes as ``v / 32768``).
    float32 samples are scaled in float32: multiplying by 2^15 is exact there, so the integers are
    the float64 path's, at a quarter of its memory."""
    wide = np.float32 if samples.dtype == np.float32 else np.float64
    scaled = np.rint(np.asarray(samples, wide) * wide(PCM16_FULL_SCALE))
    np.clip(scaled, -32768, 32767, out=scaled)
    return scaled.astype(np.int16)


def _band_bins() -> tuple[int, int, np.ndarray]:
    """``(first bin, end bin, each band's first bin relative to the first)``: bands are contiguous
    runs of FFT bins, so band energies are one ``reduceat`` over the bins in range."""
    frequencies = np.fft.rfftfreq(FRAME_SAMPLES, 1.0 / FINGERPRINT_SAMPLE_RATE)
    starts = np.searchsorted(frequencies, BAND_EDGES_HZ)
    return int(starts[0]), int(starts[-1]), (starts[:-1] - starts[0]).astype(np.intp)


_FIRST_BIN, _END_BIN, _BAND_STARTS = _band_bins()
_WINDOW = np.hanning(FRAME_SAMPLES).astype(np.float32)
_BIT_WEIGHTS = (np.uint64(1) << np.arange(BITS_PER_SUB_FINGERPRINT, dtype=np.uint64)).astype(np.uint64)


def audio_fingerprint(samples: np.ndarray, sample_rate: int) -> AudioFingerprint:
    """The fingerprint of mono float ``samples`` at ``sample_rate``; empty for audio shorter than
    two frames (about 0.3 s)."""
    return _fingerprint_and_changes(samples, sample_rate)[0]


def bit_reliabilities(samples: np.ndarray, sample_rate: int) -> np.ndarray:
    """float ``[frames, 32]``: how far from its threshold each bit of :func:`audio_fingerprint` is
    (the size of the change of log band-energy difference whose sign the bit is; 0 for frame 0).
    A copy flips the bits with the smallest first: Haitsma and Kalker's soft-decision lookup probes
    a key with those bits toggled."""
    return _fingerprint_and_changes(samples, sample_rate)[1]


def _fingerprint_and_changes(samples: np.ndarray, sample_rate: int) -> tuple[AudioFingerprint, np.ndarray]:
    audio = np.asarray(samples, np.float32)
    if sample_rate != FINGERPRINT_SAMPLE_RATE and len(audio):
        audio = soxr.resample(audio, sample_rate, FINGERPRINT_SAMPLE_RATE, quality="HQ").astype(np.float32)
    n_frames = 1 + (len(audio) - FRAME_SAMPLES) // HOP_SAMPLES if len(audio) >= FRAME_SAMPLES else 0
    if n_frames < 2:
        return EMPTY_FINGERPRINT, np.zeros((0, BITS_PER_SUB_FINGERPRINT))
    windows = np.lib.stride_tricks.sliding_window_view(audio, FRAME_SAMPLES)[::HOP_SAMPLES][:n_frames]
    energy = np.empty((n_frames, len(_BAND_STARTS)), np.float64)
    # In windows of frames: the windowed frames and their spectra (about 24 KiB a frame) never exist
    # for the whole utterance at once, only the band energies (264 bytes a frame) do.
    for start in range(0, n_frames, FRAMES_PER_WINDOW):
        spectrum = np.fft.rfft(windows[start : start + FRAMES_PER_WINDOW] * _WINDOW, axis=1)[:, _FIRST_BIN:_END_BIN]
        energy[start : start + FRAMES_PER_WINDOW] = np.add.reduceat(
            spectrum.real**2 + spectrum.imag**2, _BAND_STARTS, axis=1
        )
    total = energy.sum(axis=1)
    loudest = float(total.max())
    if loudest <= 0.0:
        silent = AudioFingerprint(np.zeros(n_frames, np.uint32), np.zeros(n_frames, bool))
        return silent, np.zeros((n_frames, BITS_PER_SUB_FINGERPRINT))
    log_energy = np.log(energy + loudest * 1e-9)
    band_difference = log_energy[:, :-1] - log_energy[:, 1:]
    changes = np.zeros((n_frames, BITS_PER_SUB_FINGERPRINT))
    changes[1:] = band_difference[1:] - band_difference[:-1]
    values = ((changes > 0).astype(np.uint64) @ _BIT_WEIGHTS).astype(np.uint32)
    loud = total >= loudest * 10 ** (-ACTIVE_FLOOR_DB / 10)
    active = np.zeros(n_frames, bool)
    active[1:] = loud[1:] & loud[:-1]  # bits compare a frame with the one before it
    return AudioFingerprint(values, active), np.abs(changes)


_POPCOUNT_8 = np.array([bin(value).count("1") for value in range(256)], np.uint8)


def bit_errors(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Differing bits per pair of uint32 sub-fingerprints (same shape)."""
    differing = np.bitwise_xor(first.astype(np.uint32), second.astype(np.uint32))
    return _POPCOUNT_8[differing.view(np.uint8)].reshape(*differing.shape, 4).sum(axis=-1)


@dataclass(frozen=True)
class AlignedComparison:
    """Two fingerprints compared at one offset (``second``'s frame = ``first``'s frame + offset)."""

    bit_error_rate: float
    compared_frames: int
    overlap_frames: int


def compare_at_offset(first: AudioFingerprint, second: AudioFingerprint, offset: int) -> AlignedComparison:
    """Bit error rate where the two overlap at ``offset``, over the frames active in either: a frame
    active in only one (speech against silence) counts as chance (half its bits differ), so content
    that one has and the other has not is a difference, not left out. 0.5 when no frame is active."""
    start = max(0, -offset)
    end = min(first.frames, second.frames - offset)
    if end <= start:
        return AlignedComparison(0.5, 0, 0)
    first_active, second_active = first.active[start:end], second.active[start + offset : end + offset]
    both = first_active & second_active
    either = int((first_active | second_active).sum())
    if either == 0:
        return AlignedComparison(0.5, 0, end - start)
    errors = bit_errors(
        first.sub_fingerprints[start:end][both], second.sub_fingerprints[start + offset : end + offset][both]
    )
    one_sided = either - int(both.sum())
    bit_error_rate = (float(errors.sum()) + one_sided * BITS_PER_SUB_FINGERPRINT / 2) / (
        either * BITS_PER_SUB_FINGERPRINT
    )
    return AlignedComparison(bit_error_rate, either, end - start)


def similarity_from_bit_error_rate(bit_error_rate: float) -> float:
    """1 for identical bits, 0 at chance (half the bits differ) or worse."""
    return float(min(1.0, max(0.0, 1.0 - 2.0 * bit_error_rate)))
