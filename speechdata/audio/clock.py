"""Kyutai Mimi's clock: the one definition of the bridge's sample rate, frame size and frame rule.

Frame ``k`` covers samples ``[1920k, 1920(k+1))`` of 24 kHz audio and is centred at ``80k + 40`` ms;
``F = ceil(n_samples / 1920)`` because Mimi pads the last partial frame (docs/bridge-tuples.md).
Every module that needs one of these numbers imports it from here.
"""

from __future__ import annotations

SAMPLE_RATE = 24_000
"""Hz of every normalized utterance and every bridge ``.wav``."""

SAMPLES_PER_FRAME = 1_920
FRAME_MS = 80
FRAME_CENTER_MS = 40
FRAME_RATE_HZ = SAMPLE_RATE / SAMPLES_PER_FRAME
"""12.5 Hz."""


def n_frames_for(n_samples: int) -> int:
    """``F = ceil(n_samples / 1920)``: Mimi pads the last partial frame."""
    return -(-n_samples // SAMPLES_PER_FRAME)


def seconds_of(n_samples: int) -> float:
    """Duration in seconds of ``n_samples`` at the bridge's sample rate."""
    return n_samples / SAMPLE_RATE


def frame_center_ms(k: int) -> int:
    """The centre of frame ``k`` in integer milliseconds: the instant the ownership rule tests."""
    return FRAME_MS * k + FRAME_CENTER_MS
