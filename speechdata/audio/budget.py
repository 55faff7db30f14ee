"""The per-utterance memory budget: how much audio any stage may decode at once.

Every stage that reads audio decodes one utterance (or, for VAD, one landed file) into memory, and
several copies of it exist while it is processed (resampled, fingerprinted, featurized): memory
grows with its length. One 2-hour recording is hundreds of megabytes per copy and gigabytes in a
stage that keeps a few. So the length is checked *before* anything is decoded, from what the file
header or the container's ``n_samples`` already says, in the two places every read goes through:

* :func:`speechdata.audio.codec.read_segment_from`, which decodes a landed file or a segment of it
  (``normalized_audio``, ``asr_flac``, the Hugging Face dataset; ``vad_segments`` checks its files
  with :func:`check_audio_budget` before reading them);
* :func:`speechdata.audio.codec.decode_audio` and :func:`~speechdata.audio.codec.decode_pcm16`, which
  decode an utterance of ``audio_24k.parquet`` (every stage after ingest).

Past the budget it raises :class:`OverMemoryBudget`, whose ``reason`` (``audio_over_memory_budget``)
the stage records as the utterance's reject. A recording past the budget but within the long-form
limit is read another way, never through these: ingest streams it in chunks
(:mod:`speechdata.landing.long_form`) and the stages after it slice it window by window
(:class:`speechdata.audio.streamed.StreamedAudio`). A stage added later that decodes whole meets
the check, which is what keeps it honest.
"""

from __future__ import annotations

import os

MAX_UTTERANCE_SECONDS = float(os.environ.get("SPEECHDATA_MAX_UTTERANCE_SECONDS", 1800.0))
"""30 minutes: the whole-decode budget. An utterance up to this is decoded whole by every stage
(stored at 24 kHz it decodes to 173 MB of float32); a longer one (up to :data:`MAX_LONG_FORM_SECONDS`)
is a long-form recording, which no stage decodes whole: each reads it in windows
(docs/long-form-alignment.md, "The whole pipeline"). ``SPEECHDATA_MAX_UTTERANCE_SECONDS`` sets it
(lower on a small machine; the tests lower it to exercise the windowed paths in seconds)."""

MAX_LONG_FORM_SECONDS = float(os.environ.get("SPEECHDATA_MAX_LONG_FORM_SECONDS", 4 * 3600.0))
"""4 hours: the long-form limit. Ingest streams such a recording into the container in chunks; the
alignment stage aligns it window by window in memory that grows with ``sqrt(T)`` x its tokens (a
2-hour recording: 1.4 GB peak, docs/performance.md); the other stages read it in windows or by its
aligned segments. Past it a recording is rejected ``audio_over_memory_budget`` from its header,
before anything is decoded. ``SPEECHDATA_MAX_LONG_FORM_SECONDS`` sets it."""

MAX_LANDED_LONG_FORM_SECONDS = float(os.environ.get("SPEECHDATA_MAX_LANDED_LONG_FORM_SECONDS", MAX_LONG_FORM_SECONDS))
"""How long a landed recording ingest stores: by default the long-form limit (4 hours), so a long
recording lands and every stage reads it in windows (30 minutes within 1.8 GB a stage: docs/performance.md,
"Long-form recordings through the whole pipeline"). Past it a landed recording is rejected
``audio_over_memory_budget`` from its header, its length and the limit in the detail.
``SPEECHDATA_MAX_LANDED_LONG_FORM_SECONDS`` lowers it (down to :data:`MAX_UTTERANCE_SECONDS` stores
only what every stage may decode whole); above :data:`MAX_LONG_FORM_SECONDS` it has no effect."""

MAX_DECODED_BYTES = 1 << 30
"""1 GiB of float32 source samples: bounds a short segment at an absurd rate or channel count."""

OVER_BUDGET_REASON = "audio_over_memory_budget"

_FLOAT32_BYTES = 4


class OverMemoryBudget(ValueError):
    """Audio longer than the per-utterance budget; nothing of it was decoded."""

    reason = OVER_BUDGET_REASON


def audio_budget_problem(
    frames: int,
    sample_rate: int,
    channels: int = 1,
    *,
    max_seconds: float | None = None,
    max_decoded_bytes: int | None = None,
) -> str | None:
    """Why decoding ``frames`` frames would break the budget (default: this module's limits), or None."""
    max_seconds = MAX_UTTERANCE_SECONDS if max_seconds is None else max_seconds
    max_decoded_bytes = MAX_DECODED_BYTES if max_decoded_bytes is None else max_decoded_bytes
    seconds = frames / sample_rate if sample_rate > 0 else 0.0
    if seconds > max_seconds:
        return f"{seconds:.1f} s of audio, over the per-utterance memory budget of {max_seconds:.0f} s"
    decoded = frames * max(channels, 1) * _FLOAT32_BYTES
    if decoded > max_decoded_bytes:
        return (
            f"{frames} frames x {channels} channels decode to {decoded} bytes, over the per-utterance "
            f"memory budget of {max_decoded_bytes} bytes"
        )
    return None


def check_audio_budget(
    frames: int, sample_rate: int, channels: int = 1, *, what: str = "audio", max_seconds: float | None = None
) -> None:
    """Raise :class:`OverMemoryBudget` (naming ``what``) when the audio is over the budget."""
    problem = audio_budget_problem(frames, sample_rate, channels, max_seconds=max_seconds)
    if problem is not None:
        raise OverMemoryBudget(f"{what}: {problem}")
