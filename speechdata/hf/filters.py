"""The filters that decide which of a country's segments are published, and the error rate they report.

:func:`filter_reasons` names, per segment, the first reason it is left out (a missing published
field, a number out of range, its length, its CER, a pseudo-label under the confidence threshold, a
near duplicate) or None; :class:`SegmentLimits` holds the thresholds (``hf_dataset_settings``).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

import pyarrow as pa

from speechdata.alignment.formats import aligned_segment_range_problem
from speechdata.alignment.pseudo_labels import TEXT_SOURCE_ASR
from speechdata.bridge.segments import SEGMENT_KEY_SEPARATOR, utterance_of_key
from speechdata.hf.text_sources import is_blank, pseudo_label_reason
from speechdata.quality.decisions import NEAR_DUPLICATE
from speechdata.quality.policy import QualityPolicy

REQUIRED_FIELDS = (
    "language",
    "human_text",
    "asr_text",
    "cer",
    "transcript_id",
    "transcript_start_idx",
    "transcript_end_idx",
)
"""Segment fields every published row fills (``video_id`` falls back to the audio file's name); a
pseudo-labelled row (:mod:`speechdata.hf.text_sources`) has no ``human_text`` and fills ``text`` instead."""

RECORDING_ONLY_FIELDS = ("asr_text", "cer", "transcript_start_idx", "transcript_end_idx")
"""Required fields a segment of a long recording (key ``<utt_id>+<index>``) leaves null: they are the
whole recording's, and no part of them is known to belong to one segment."""


@dataclass(frozen=True)
class SegmentLimits:
    """Which segments a dataset keeps: ``[min_duration_s, max_duration_s]``, ``cer <= max_cer`` and
    pseudo-labels of at least ``min_asr_confidence``."""

    min_duration_s: float = 3.0
    max_duration_s: float = 20.0
    max_cer: float | None = None
    """None keeps every CER (segments without one always pass)."""
    min_asr_confidence: float | None = QualityPolicy.min_asr_confidence
    """A pseudo-label (``text_source`` ``asr``) under this confidence is filtered ``low_asr_confidence``
    (the quality policy's threshold); None keeps every pseudo-label."""

    def __post_init__(self) -> None:
        # A NaN limit compares false with every value: it would keep every segment, silently.
        for name in ("min_duration_s", "max_duration_s", "max_cer", "min_asr_confidence"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"segment limit {name}={value!r} must be a finite number >= 0")


SegmentId = tuple[str, str]
"""``(shard_id, key)``: a segment's identity; ``key`` is the utterance's ``utt_id`` in its shard."""


def recording_id(segment_id: SegmentId) -> SegmentId:
    """``(shard_id, utt_id)`` of the landed utterance a segment is (itself) or is part of (a long
    recording's segment ``<utt_id>+<index>``)."""
    shard_id, key = segment_id
    return (shard_id, key if key is None else utterance_of_key(key))


def segment_ids(segments: pa.Table) -> list[SegmentId]:
    return list(zip(segments["shard_id"].to_pylist(), segments["key"].to_pylist(), strict=True))


def filter_reasons(
    segments: pa.Table, limits: SegmentLimits, near_duplicate_ids: Collection[SegmentId] = frozenset()
) -> list[str | None]:
    """Per segment: None when it is kept, else ``missing_<field>`` (a :data:`REQUIRED_FIELDS` is
    null), ``duration_out_of_range`` (not a finite length >= 0), ``cer_out_of_range`` (not a finite
    rate >= 0), ``transcript_indexes_out_of_range`` (not ``0 <= start <= end``), ``too_short``, ``too_long``, ``cer_above_max``,
    ``low_asr_confidence`` (a pseudo-label under ``limits.min_asr_confidence``) or ``near_duplicate`` (its ``(shard_id,
    key)`` is in ``near_duplicate_ids``), the first that applies: a copy that fails on its own is
    counted under its own reason, as the quality filter does. A blank human text counts as missing;
    a pseudo-labelled row needs ``text`` in its place."""
    reasons: list[str | None] = []
    required = {name: segments[name].to_pylist() for name in REQUIRED_FIELDS}
    texts, sources = segments["text"].to_pylist(), segments["text_source"].to_pylist()
    confidences = segments["asr_confidence"].to_pylist()
    starts, ends = segments["transcript_start_idx"].to_pylist(), segments["transcript_end_idx"].to_pylist()
    copies = set(near_duplicate_ids)
    for row, (duration, cer, segment_id) in enumerate(
        zip(segments["duration_s"].to_pylist(), segments["cer"].to_pylist(), segment_ids(segments), strict=True)
    ):
        labelled = sources[row] == TEXT_SOURCE_ASR
        # A segment of a long recording has no ASR transcript, CER or span of its own.
        part_of_recording = SEGMENT_KEY_SEPARATOR in (segment_id[1] or "")
        missing = next(
            (
                name
                for name, values in required.items()
                if (
                    values[row] is None
                    and not (labelled and name == "human_text")
                    and not (part_of_recording and name in RECORDING_ONLY_FIELDS)
                )
                or (name == "human_text" and not labelled and is_blank(values[row]))
            ),
            None,
        )
        if missing is None and labelled and is_blank(texts[row]):
            missing = "text"
        if missing is not None:
            reasons.append(f"missing_{missing}")
        elif duration is None or not math.isfinite(duration) or duration < 0:
            reasons.append("duration_out_of_range")  # NaN compares false with every limit: never kept
        elif cer is not None and aligned_segment_range_problem(cer, None, None) is not None:
            reasons.append("cer_out_of_range")
        elif aligned_segment_range_problem(None, starts[row], ends[row]) is not None:
            reasons.append("transcript_indexes_out_of_range")
        elif duration < limits.min_duration_s:
            reasons.append("too_short")
        elif duration > limits.max_duration_s:
            reasons.append("too_long")
        elif limits.max_cer is not None and cer is not None and cer > limits.max_cer:
            reasons.append("cer_above_max")
        elif (low := pseudo_label_reason(sources[row], confidences[row], limits.min_asr_confidence)) is not None:
            reasons.append(low)
        elif recording_id(segment_id) in copies:
            reasons.append(NEAR_DUPLICATE)
        else:
            reasons.append(None)
    return reasons


def word_error_rate(reference: str | None, hypothesis: str | None) -> float | None:
    """WER of the ASR transcript against the human one (jiwer, words split on whitespace).

    Both empty: 0.0. An empty reference with a non-empty hypothesis: 1.0 (every word inserted; WER
    is undefined there and 1.0 is the cap a reader expects). No ASR transcript at all: None.
    """
    if hypothesis is None:
        return None
    reference, hypothesis = (reference or "").strip(), hypothesis.strip()
    if not reference:
        return 0.0 if not hypothesis else 1.0
    if not hypothesis:
        return 1.0
    import jiwer  # loaded by the dataset build that scores transcripts, not by the code location

    return float(jiwer.wer(reference, hypothesis))
