"""Per-utterance signal measurements from the normalized audio (numpy/scipy DSP, no model).

Every function takes one utterance's mono float32 samples in [-1, 1] and its sample rate, and
returns a plain float with the unit in its name (docs/quality.md defines each one).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

SILENCE_FLOOR_DBFS = -50.0
"""A 30 ms frame whose RMS is below this is silent (well under quiet speech, -35 to -25 dBFS)."""
FRAME_S = 0.03

SPECTRUM_SEGMENT_S = 0.02
"""Welch segments of ~20 ms: about 50 Hz frequency resolution, ample for a cutoff in kHz."""
ENERGY_FLOOR_DB_PER_HZ = -120.0
"""Power spectral density (dB re full scale squared per Hz) above which a frequency holds real energy.

The empty band of resampled audio sits at the 16-bit quantization floor, about -140 dB/Hz; speech,
even its quiet high band, and any real noise are far above it (-100 to -60 dB/Hz at ordinary levels)."""
BANDWIDTH_DYNAMIC_RANGE_DB = 90.0
"""For very loud audio the floor is taken this far below the spectrum's peak instead (16-bit range)."""

_EPS = 1e-10


SIGNAL_BLOCK_SAMPLES = 1 << 20
"""Samples a whole-utterance signal turns into float64 at once (1 M: 8 MB). A 30-minute utterance
at 24 kHz whole in float64 is 345 MB, and the level, WADA-SNR, silence and DC signals each made
one or two such copies; in blocks they hold a few times 8 MB whatever the length."""


def blocked_sum(values: Callable[[int, int], np.ndarray], start: int, stop: int, block: int | None = None) -> float:
    """``float(np.add.reduce(values(start, stop)))`` (a float64 array) without ever holding more than
    ``block`` (:data:`SIGNAL_BLOCK_SAMPLES`) values of it, and bit for bit the same sum.

    numpy adds a contiguous float64 array pairwise: over 128 numbers it splits the array in two
    (the first half's length rounded down to a multiple of 8) and adds the halves' sums. Splitting
    the same way down to halves of at most ``block`` numbers, summed by numpy itself, adds the same
    numbers in the same order; ``tests/unit/test_quality_signal_blocks.py`` checks it against numpy."""
    block = max(128, SIGNAL_BLOCK_SAMPLES if block is None else block)
    size = stop - start
    if size <= block:
        return float(np.add.reduce(values(start, stop)))
    half = size // 2
    half -= half % 8
    return blocked_sum(values, start, start + half, block) + blocked_sum(values, start + half, stop, block)


def level_dbfs(samples: np.ndarray) -> float:
    """RMS level of the whole utterance in dB relative to full scale (a full-scale sine is -3 dBFS)."""
    if samples.size == 0:
        return float("-inf")
    energy = blocked_sum(lambda a, b: np.square(samples[a:b], dtype=np.float64), 0, samples.size)
    rms = float(np.sqrt(energy / samples.size))
    return 20.0 * np.log10(max(rms, _EPS))


def frame_levels_dbfs(samples: np.ndarray, sample_rate: int, frame_s: float = FRAME_S) -> np.ndarray:
    """RMS level of each non-overlapping ``frame_s`` frame (a last partial frame is zero-padded)."""
    size = max(1, int(round(frame_s * sample_rate)))
    n_frames = max(1, -(-samples.size // size))
    framed = np.zeros(n_frames * size, np.float64)
    framed[: samples.size] = samples
    rms = np.sqrt(np.mean(np.square(framed.reshape(n_frames, size)), axis=1))
    return 20.0 * np.log10(np.maximum(rms, _EPS))


def silence_share(samples: np.ndarray, sample_rate: int, floor_dbfs: float = SILENCE_FLOOR_DBFS) -> float:
    """Share of 30 ms frames quieter than ``floor_dbfs``: 1.0 for silence or near-silent hiss.

    Counted over blocks of whole frames (each frame's level is its own: the same levels as framing
    the whole utterance at once)."""
    if samples.size == 0:
        return 1.0
    size = max(1, int(round(FRAME_S * sample_rate)))
    n_frames = -(-samples.size // size)
    frames_per_block = max(1, SIGNAL_BLOCK_SAMPLES // size)
    quiet = 0
    for first in range(0, n_frames, frames_per_block):
        block = samples[first * size : (first + frames_per_block) * size]
        quiet += int(np.count_nonzero(frame_levels_dbfs(block, sample_rate) < floor_dbfs))
    return quiet / n_frames


WELCH_BLOCK_SAMPLES = 1 << 21
"""Samples of the segments Welch transforms at once (2 M: 42 s at 48 kHz). A 30-minute utterance whole
as 180 000 half-overlapping segments of 20 ms takes 700 MB of spectra, and its float64 copy 345 MB
more; blocks keep it to a few tens of MB whatever the length."""


def welch_in_blocks(
    samples: np.ndarray,
    sample_rate: int,
    nperseg: int,
    nfft: int | None = None,
    offset: float = 0.0,
    block_samples: int = WELCH_BLOCK_SAMPLES,
) -> tuple[np.ndarray, np.ndarray]:
    """``scipy.signal.welch(samples.astype(float64) - offset, sample_rate, nperseg=nperseg, nfft=nfft)``
    (Hann window, half-overlapping segments, each segment's mean removed, the mean of their
    periodograms) computed over the segments of about ``block_samples`` samples at a time: each
    segment's periodogram is its own, so the blocks' means weighted by their segments are Welch's
    mean, to float rounding, in memory that does not grow with the utterance. Up to one block it is
    scipy's call itself."""
    from scipy.signal import welch

    step = nperseg - nperseg // 2
    n_segments = (samples.size - nperseg) // step + 1
    segments_per_block = max(1, block_samples // step)
    if n_segments <= segments_per_block:
        return welch(samples.astype(np.float64) - offset, fs=sample_rate, nperseg=nperseg, nfft=nfft)
    frequencies, summed = None, None
    for first in range(0, n_segments, segments_per_block):
        count = min(segments_per_block, n_segments - first)
        block = samples[first * step : (first + count - 1) * step + nperseg].astype(np.float64) - offset
        frequencies, power = welch(block, fs=sample_rate, nperseg=nperseg, nfft=nfft)
        summed = power * count if summed is None else summed + power * count
    return frequencies, summed / n_segments


def effective_bandwidth_hz(samples: np.ndarray, sample_rate: int) -> float:
    """The highest frequency holding real energy: whose (median-smoothed, Welch) power spectral
    density is above :data:`ENERGY_FLOOR_DB_PER_HZ` (or :data:`BANDWIDTH_DYNAMIC_RANGE_DB` under the
    peak, whichever is higher). Resampled audio has an empty band above the source's Nyquist
    frequency, so 8 kHz telephone audio upsampled to 24 kHz reads about 4 kHz, not 12 kHz."""
    # scipy.signal takes seconds to import: every Dagster step process loads this module, few measure.
    from scipy.signal import medfilt

    if samples.size < 64 or not np.any(samples):
        return 0.0
    segment = min(samples.size, max(64, int(SPECTRUM_SEGMENT_S * sample_rate)))
    frequencies, power = welch_in_blocks(samples, sample_rate, segment)
    smoothed = medfilt(10.0 * np.log10(np.maximum(power, 1e-20)), kernel_size=5)
    floor = max(ENERGY_FLOOR_DB_PER_HZ, float(smoothed.max()) - BANDWIDTH_DYNAMIC_RANGE_DB)
    above = np.nonzero(smoothed > floor)[0]
    return float(frequencies[above[-1]]) if above.size else 0.0


WADA_SNR_RANGE_DB = (-20, 100)
"""WADA-SNR estimates are clamped to this range; 100 dB reads as "no measurable noise"."""


@functools.cache
def _wada_curve() -> tuple[np.ndarray, np.ndarray]:
    """``G(SNR) = log E|x| - E log|x|`` for gamma-distributed speech (shape 0.4) in Gaussian noise.

    Kim & Stern (2008) tabulate this curve; it is recomputed here from its definition with a fixed
    random generator (deterministic), so no unexplained table of numbers lives in the code."""
    rng = np.random.default_rng(20080922)
    n = 400_000
    speech = rng.gamma(0.4, 1.0, n) * rng.choice((-1.0, 1.0), n)
    speech /= np.sqrt(np.mean(speech**2))
    noise = rng.standard_normal(n)
    snrs = np.arange(WADA_SNR_RANGE_DB[0], WADA_SNR_RANGE_DB[1] + 1, dtype=np.float64)
    curve = []
    for snr in snrs:
        mixed = np.abs(speech + noise * 10 ** (-snr / 20.0))
        mixed = np.maximum(mixed, _EPS)
        curve.append(np.log(mixed.mean()) - np.log(mixed).mean())
    return snrs, np.maximum.accumulate(np.asarray(curve))


def wada_snr_db(samples: np.ndarray) -> float:
    """Waveform-amplitude-distribution SNR estimate (Kim & Stern 2008), in dB.

    Digital silence (exact zeros between words) counts as noise-free, so clean studio or synthetic
    speech reads high; broadband noise under the speech pulls it down."""
    if samples.size == 0 or not np.any(samples):
        return float(WADA_SNR_RANGE_DB[0])
    # max |x| without an |x| copy of the whole utterance; the sums below go block by block.
    peak = max(float(np.max(samples)), -float(np.min(samples)))

    def magnitude(start: int, stop: int) -> np.ndarray:
        return np.maximum(np.abs(samples[start:stop].astype(np.float64)) / peak, _EPS)

    mean = blocked_sum(magnitude, 0, samples.size) / samples.size
    mean_log = blocked_sum(lambda a, b: np.log(magnitude(a, b)), 0, samples.size) / samples.size
    statistic = np.log(mean) - mean_log
    snrs, curve = _wada_curve()
    return float(np.clip(np.interp(statistic, curve, snrs), *WADA_SNR_RANGE_DB))
