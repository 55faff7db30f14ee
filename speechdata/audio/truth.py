"""Audio that lies: headers whose duration or sample rate the decoded samples do not bear out.

A truncated MP3 can keep a header that promises 3.3 s and decode to 1.4 s; packing it with its
full transcript teaches a model nonsense, so the decoded length is checked against the header. A
WAV header claiming 1000 Hz plays speech slowed to a crawl: rates outside what real recordings use
are rejected before anything is decoded.

Decoded samples can lie too. NaN or infinite samples (a float WAV written by a broken tool) have no
16-bit value; a segment whose every sample is below one 16-bit step stores as zeros; a stereo file
whose channels cancel (one channel phase-inverted) is silence once mixed to mono. Each carries no
speech for its transcript and is rejected with its own reason. Clipping is measured on every
utterance (``clipped_share``, stored in the audio container and the manifest) and rejected above
:data:`MAX_CLIPPED_SHARE`.
"""

from __future__ import annotations

import re

import numpy as np

from speechdata.accounting.rejects import Reject

MIN_SAMPLE_RATE_HZ = 4_000
MAX_SAMPLE_RATE_HZ = 384_000

TRUNCATION_TOLERANCE_S = 0.1
TRUNCATION_TOLERANCE_SHARE = 0.02
"""Decoded audio may fall short of the header by 0.1 s plus 2 % (encoder delay and padding of lossy
codecs, estimated frame counts) before it counts as truncated."""

_WORD_CHARACTER = re.compile(r"\w")

PCM16_STEP = np.float32(1.0 / 32768.0)
DIGITAL_SILENCE_PEAK = np.float32(0.5 / 32767.0)
"""A segment whose peak is below this stores as all-zero 16-bit samples (``quantize_pcm16`` rounds it
to 0): digital silence, whatever the source's bit depth."""

CLIPPING_LEVEL = np.float32(1.0) - PCM16_STEP
"""A sample at or beyond 16-bit full scale (32767 / 32768, libsndfile's largest positive 16-bit
value; 24-bit and float sources reach it too) counts as clipped."""

MAX_CLIPPED_SHARE = 0.05
"""Default: an utterance with more than 5 % of its samples at full scale is rejected
(``audio_clipped``). Speech recorded with headroom has none; a hot but usable recording clips a
fraction of a percent of its samples; at 5 % the peaks of most syllables are flattened."""

DOWNMIX_CANCELLATION_DB = 40.0
"""A multi-channel segment whose mono mix is this many dB quieter (RMS) than its loudest channel has
cancelled in the downmix (channels out of phase): what remains is not the recording."""


def clipped_share(samples: np.ndarray) -> float:
    """The share of samples (all channels) at or beyond full scale."""
    if samples.size == 0:
        return 0.0
    return float(np.count_nonzero(np.abs(samples) >= CLIPPING_LEVEL)) / samples.size


def _rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) if samples.size else 0.0


def signal_problem(samples: np.ndarray, mono: np.ndarray | None = None) -> tuple[str, str] | None:
    """Why decoded ``samples`` ``[frames, channels]`` carry no signal, as ``(reason, detail)``, or None.

    ``mono`` is the downmix of ``samples`` when the caller has it (it is computed otherwise).
    Reasons: ``non_finite_audio``, ``digital_silence``, ``cancelled_by_downmix``.
    """
    finite = np.isfinite(samples)
    if not finite.all():
        bad = samples.size - int(np.count_nonzero(finite))
        return "non_finite_audio", f"{bad} of {samples.size} decoded samples are NaN or infinite"
    peak = float(np.max(np.abs(samples))) if samples.size else 0.0
    if peak < DIGITAL_SILENCE_PEAK:
        return "digital_silence", f"every sample is below one 16-bit step (peak {peak:.3g})"
    if samples.ndim == 2 and samples.shape[1] > 1:
        if mono is None:
            mono = samples.mean(axis=1)
        loudest_rms = max(_rms(samples[:, channel]) for channel in range(samples.shape[1]))
        mono_rms = _rms(mono)
        if mono_rms < loudest_rms * 10 ** (-DOWNMIX_CANCELLATION_DB / 20):
            ratio_db = 20 * np.log10(loudest_rms / mono_rms) if mono_rms > 0 else float("inf")
            return (
                "cancelled_by_downmix",
                f"the {samples.shape[1]} channels cancel when mixed to mono: the mix is {ratio_db:.1f} dB below "
                f"the loudest channel (limit {DOWNMIX_CANCELLATION_DB:.0f} dB)",
            )
    return None


def clipping_problem(share: float, max_share: float = MAX_CLIPPED_SHARE) -> tuple[str, str] | None:
    """``("audio_clipped", detail)`` when more than ``max_share`` of the samples are at full scale."""
    if share > max_share:
        return "audio_clipped", f"{share:.1%} of the samples are at full scale (limit {max_share:.1%})"
    return None


def sample_rate_problem(sample_rate: int) -> tuple[str, str] | None:
    """``("implausible_sample_rate", detail)`` for a rate outside [4 kHz, 384 kHz], else None."""
    if not MIN_SAMPLE_RATE_HZ <= sample_rate <= MAX_SAMPLE_RATE_HZ:
        return (
            "implausible_sample_rate",
            f"header sample rate {sample_rate} Hz is outside [{MIN_SAMPLE_RATE_HZ}, {MAX_SAMPLE_RATE_HZ}] Hz",
        )
    return None


def truncation_reject(utt_id: str, stage: str, audio_path: str, expected_s: float, decoded_s: float) -> Reject | None:
    """A reject ``audio_truncated`` naming both durations when the decode fell short of the header."""
    if expected_s - decoded_s > TRUNCATION_TOLERANCE_S + TRUNCATION_TOLERANCE_SHARE * expected_s:
        return Reject(
            utt_id,
            stage,
            "audio_truncated",
            f"{audio_path}: header promises {expected_s:.3f} s for the segment, decoded {decoded_s:.3f} s",
        )
    return None


def has_words(text: str) -> bool:
    """Whether a transcript holds at least one word character (a letter or digit in any script)."""
    return bool(_WORD_CHARACTER.search(text))
