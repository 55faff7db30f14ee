"""Signals that need to know where the speech is, or that look for one kind of interference.

- :func:`dc_offset_ratio`: the mean of the samples over their RMS (a recording chain's DC bias).
- :func:`mains_hum_share`: the share of the power that sits in narrow peaks at 50 or 60 Hz and
  their harmonics, above the spectrum around them (mains hum; speech's own harmonics wander with
  the pitch and are not narrow over a whole utterance).
- :func:`speech_snr_db`: speech-frame power against non-speech-frame power, using the VAD's
  segments; WADA-SNR assumes Gaussian noise and reads speech babble as speech.

Every function takes one utterance's mono float32 samples in [-1, 1] at ``sample_rate``
(docs/quality.md defines each signal and its unit).
"""

from __future__ import annotations

import numpy as np

_EPS = 1e-12

MAINS_FREQUENCIES_HZ = (50.0, 60.0)
HUM_HARMONICS = 6
"""The fundamental and the next five harmonics (50-300 Hz, 60-360 Hz): where hum's power sits."""
HUM_PEAK_HALF_WIDTH_HZ = 1.5
"""A hum line is narrower than this (the mains frequency drifts by well under 0.5 Hz)."""
HUM_NEIGHBOURHOOD_HZ = (4.0, 12.0)
"""The spectrum this far either side of a line is the level the line is compared with."""
HUM_RESOLUTION_HZ = 0.5
MIN_FUNDAMENTAL_SHARE = 0.005
"""Hum always holds the mains frequency itself; a voice's pitch (70 Hz and up) puts nothing there.
A steady low voice at 100 or 120 Hz has harmonics on the mains' harmonics: without power at 50 or
60 Hz itself, those lines are the voice's, and the share is 0."""

SNR_FRAME_S = 0.02
SPEECH_SNR_RANGE_DB = (-20.0, 100.0)
"""Clamped like WADA-SNR; 100 dB reads as "no measurable noise" (digital silence between phrases)."""
MIN_NOISE_FRAMES_S = 0.2
"""Fewer seconds of non-speech than this and the noise is read from the quietest frames instead."""
NOISE_PERCENTILE = 10.0
"""With too little non-speech, the noise floor is this percentile of every frame's power: noise
fills the gaps between words and the closures of stops, clean speech leaves them near silent."""


def dc_offset_ratio(samples: np.ndarray) -> float:
    """``|mean| / RMS`` of the samples: 0 for audio centred on zero, 1 for a constant."""
    from speechdata.quality.signals import blocked_sum

    if samples.size == 0:
        return 0.0

    def values(start: int, stop: int) -> np.ndarray:
        return samples[start:stop].astype(np.float64)

    # Summed block by block, the same sums as of the whole utterance in float64 (no copy of it).
    rms = float(np.sqrt(blocked_sum(lambda a, b: values(a, b) ** 2, 0, samples.size) / samples.size))
    mean = blocked_sum(values, 0, samples.size) / samples.size
    return abs(mean) / rms if rms > _EPS else 0.0


def mains_hum_share(samples: np.ndarray, sample_rate: int) -> float:
    """Share (0-1) of the power (DC removed) in narrow lines at 50 or 60 Hz and harmonics, above
    their neighbourhood's level; the larger of the two mains frequencies."""
    from speechdata.quality.signals import welch_in_blocks

    segment = int(sample_rate / HUM_RESOLUTION_HZ)
    # A constant is all DC: nothing left once it is removed.
    if samples.size < segment // 2 or samples.min() == samples.max():
        return 0.0
    # A power-of-two FFT of at least the resolution's length: an utterance shorter than one segment
    # is zero-padded, and odd lengths would make the FFT many times slower. The DC is removed block
    # by block (no float64 copy of the whole utterance).
    nfft = 1 << (segment - 1).bit_length()
    nperseg = min(segment, samples.size)
    frequencies, power = welch_in_blocks(samples, sample_rate, nperseg, nfft=nfft, offset=float(np.mean(samples)))
    total = float(power.sum())
    if total <= _EPS:
        return 0.0
    shares = []
    for mains in MAINS_FREQUENCIES_HZ:
        excess = 0.0
        for harmonic in range(1, HUM_HARMONICS + 1):
            if harmonic == 2 and excess < MIN_FUNDAMENTAL_SHARE * total:
                break
            line = harmonic * mains
            offset = np.abs(frequencies - line)
            peak = offset <= HUM_PEAK_HALF_WIDTH_HZ
            around = (offset >= HUM_NEIGHBOURHOOD_HZ[0]) & (offset <= HUM_NEIGHBOURHOOD_HZ[1])
            if not peak.any() or not around.any():
                continue
            excess += max(0.0, float(power[peak].sum()) - float(np.median(power[around])) * int(peak.sum()))
        shares.append(excess / total if excess >= MIN_FUNDAMENTAL_SHARE * total else 0.0)
    return float(min(1.0, max(shares)))


def frame_powers(samples: np.ndarray, sample_rate: int, frame_s: float = SNR_FRAME_S) -> np.ndarray:
    """Mean square of each non-overlapping frame (a last partial frame is dropped), computed over
    blocks of whole frames (each frame's mean is its own: no float64 copy of the whole utterance)."""
    from speechdata.quality.signals import SIGNAL_BLOCK_SAMPLES

    size = max(1, int(round(frame_s * sample_rate)))
    n_frames = samples.size // size
    if n_frames == 0:
        return np.zeros(0)
    frames_per_block = max(1, SIGNAL_BLOCK_SAMPLES // size)
    powers = []
    for first in range(0, n_frames, frames_per_block):
        count = min(frames_per_block, n_frames - first)
        framed = samples[first * size : (first + count) * size].astype(np.float64).reshape(count, size)
        powers.append(np.mean(framed**2, axis=1))
    return np.concatenate(powers)


def speech_snr_db(
    samples: np.ndarray, sample_rate: int, start_s: tuple[float, ...], end_s: tuple[float, ...]
) -> float | None:
    """SNR of the speech the VAD found over the rest, dB: ``(P_speech - P_noise) / P_noise``, where
    ``P_speech`` is the mean power of the frames inside speech segments and ``P_noise`` the lower of
    the :data:`NOISE_PERCENTILE` th percentile of all frames and (with at least
    :data:`MIN_NOISE_FRAMES_S` of them) the mean of the frames outside. None when the VAD found no speech.

    Babble (other voices under the speech) is speech to the VAD and fills the pauses with speech-like
    energy, so this reads 0 dB babble as about 7 dB, as WADA-SNR does; the babble-proof signal is
    DNSMOS's background score (docs/quality.md, "Babble")."""
    powers = frame_powers(samples, sample_rate)
    if powers.size == 0 or not start_s:
        return None
    centres = (np.arange(powers.size) + 0.5) * SNR_FRAME_S
    in_speech = np.zeros(powers.size, bool)
    for start, end in zip(start_s, end_s, strict=True):
        in_speech |= (centres >= start) & (centres < end)
    if not in_speech.any():
        return None
    speech = powers[in_speech]
    outside = powers[~in_speech]
    # The VAD's edges are generous: frames just outside a segment still hold its onset or decay, so
    # the quietest frames bound the noise from above as well.
    noise = float(np.percentile(powers, NOISE_PERCENTILE))
    if outside.size * SNR_FRAME_S >= MIN_NOISE_FRAMES_S:
        noise = min(noise, float(outside.mean()))
    signal = max(float(speech.mean()) - noise, 0.0)
    if noise <= _EPS:
        return SPEECH_SNR_RANGE_DB[1] if signal > _EPS else SPEECH_SNR_RANGE_DB[0]
    if signal <= _EPS:
        return SPEECH_SNR_RANGE_DB[0]
    return float(np.clip(10.0 * np.log10(signal / noise), *SPEECH_SNR_RANGE_DB))
