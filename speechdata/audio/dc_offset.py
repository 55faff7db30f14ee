"""DC offset: measured, and removed during normalization where subtracting one mean is safe.

A recording chain's bias shifts every sample by the same amount; subtracting the utterance's mean
restores it exactly. That is safe only when the offset is constant (block means agree) and no
sample sits at full scale: a drifting or stepping offset is not one number, and flat tops at the
rail mean the offset drove the audio into clipping, which subtracting cannot undo. Those are left
as they are and the quality stage rejects them as ``dc_offset`` (docs/quality.md).
"""

from __future__ import annotations

import numpy as np

REMOVE_ABOVE_RATIO = 0.02
"""Offsets smaller than this share of the RMS are left alone: inaudible, and leaving them keeps
ordinary audio's normalized bytes what they were."""
BLOCK_S = 0.5
MAX_BLOCK_SPREAD_RATIO = 0.1
"""A constant offset: every 0.5 s block's mean is within this share of the RMS of the whole mean."""
FULL_SCALE = 1.0


def dc_ratio(mono: np.ndarray) -> float:
    """``|mean| / RMS`` (0 for audio centred on zero, 1 for a constant)."""
    if mono.size == 0:
        return 0.0
    values = mono.astype(np.float64)
    rms = float(np.sqrt(np.mean(values**2)))
    return abs(float(values.mean())) / rms if rms > 1e-12 else 0.0


def removable_offset(mono: np.ndarray, sample_rate: int) -> float | None:
    """The constant offset to subtract from ``mono``, or None: too small to matter, not constant, or
    the audio touches full scale."""
    if mono.size == 0 or dc_ratio(mono) < REMOVE_ABOVE_RATIO:
        return None
    values = mono.astype(np.float64)
    mean = float(values.mean())
    rms = float(np.sqrt(np.mean(values**2)))
    if float(np.max(np.abs(values))) >= FULL_SCALE or float(np.max(np.abs(values - mean))) >= FULL_SCALE:
        return None
    block = max(1, int(BLOCK_S * sample_rate))
    n_blocks = values.size // block
    if n_blocks >= 2:
        means = values[: n_blocks * block].reshape(n_blocks, block).mean(axis=1)
        if float(np.max(np.abs(means - mean))) > MAX_BLOCK_SPREAD_RATIO * rms:
            return None
    return mean


def remove_dc_offset(mono: np.ndarray, sample_rate: int) -> np.ndarray:
    """``mono`` less its offset where :func:`removable_offset` finds one; otherwise ``mono`` itself."""
    offset = removable_offset(mono, sample_rate)
    if offset is None:
        return mono
    return (mono - np.asarray(offset, mono.dtype)).astype(mono.dtype, copy=False)
