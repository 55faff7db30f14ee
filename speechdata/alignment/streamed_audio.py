"""A long utterance's 16 kHz audio, decoded window by window from its stored payload, never whole.

Two hours at 16 kHz are 460 MB of float32 (and 690 MB at the stored 24 kHz, plus the resampler's
copies): the alignment stage must not hold them. The model never needs them whole either: an
utterance longer than ``max_window_s`` is cut into windows on the frame grid
(:func:`speechdata.alignment.log_probs.windowed_log_probs`). :class:`StreamedAudio` answers exactly the
slices those windows ask for: it keeps the encoded payload (FLAC: a few tens of MB per hour of speech;
pcm16: 173 MB per hour), decodes the slice's span of the stored audio plus a margin (FLAC seeks to
it), resamples that to 16 kHz and trims the margin, so each window costs memory for the window only.

Resampling a window apart from its neighbours changes its samples only within the resampler's
filter length of its edges; the margin (:data:`RESAMPLER_MARGIN_S`) keeps that off the samples
returned, and the window's ``context_s`` keeps the model's edge effects off the frames kept.
"""

from __future__ import annotations

import numpy as np

from speechdata.audio import budget
from speechdata.audio.budget import MAX_LONG_FORM_SECONDS, check_audio_budget
from speechdata.audio.codec import decode_audio, resample
from speechdata.audio.streamed import RESAMPLER_MARGIN_S, StreamedAudio

__all__ = ["RESAMPLER_MARGIN_S", "STREAM_FROM_S", "StreamedAudio", "model_audio"]

STREAM_FROM_S = 300.0
"""Utterances longer than this (5 minutes), or than the whole-decode budget where that is lower, are
streamed in windows for alignment; shorter ones are decoded whole (a few MB), as before."""


def model_audio(
    data: bytes, codec: str, source_rate: int, n_samples: int, target_rate: int
) -> np.ndarray | StreamedAudio:
    """A stored utterance for the model at ``target_rate``: decoded whole when short, else streamed.

    Past :data:`~speechdata.audio.budget.MAX_LONG_FORM_SECONDS` it raises
    :class:`~speechdata.audio.budget.OverMemoryBudget` without decoding anything."""
    if n_samples > min(STREAM_FROM_S, budget.MAX_UTTERANCE_SECONDS) * source_rate:
        check_audio_budget(n_samples, source_rate, what="the stored utterance", max_seconds=MAX_LONG_FORM_SECONDS)
        return StreamedAudio(data, codec, source_rate, n_samples, target_rate)
    return resample(decode_audio(data, codec), source_rate, target_rate)
