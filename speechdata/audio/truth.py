"""Audio that lies: headers whose duration or sample rate the decoded samples do not bear out.

A truncated MP3 can keep a header that promises 3.3 s and decode to 1.4 s; packing it with its
full transcript teaches a model nonsense, so the decoded length is checked against the header. A
WAV header claiming 1000 Hz plays speech slowed to a crawl: rates outside what real recordings use
are rejected before anything is decoded.
"""

from __future__ import annotations

import re

from speechdata.rejects import Reject

MIN_SAMPLE_RATE_HZ = 4_000
MAX_SAMPLE_RATE_HZ = 384_000

TRUNCATION_TOLERANCE_S = 0.1
TRUNCATION_TOLERANCE_SHARE = 0.02
"""Decoded audio may fall short of the header by 0.1 s plus 2 % (encoder delay and padding of lossy
codecs, estimated frame counts) before it counts as truncated."""

_WORD_CHARACTER = re.compile(r"\w")


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
