"""Per-country aligned-JSON corpora: ``<video_id>_<transcript_id>_aligned.json`` segment lists, read
into :class:`AlignedSegment` rows (one ``segment`` unit each in the alignments table).

Every malformed input raises :class:`~speechdata.alignment.table.AlignmentFormatError` naming the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import PurePath

from speechdata.alignment.table import AlignmentFormatError, TimedUnit, alignment_rows, seconds_to_ms
from speechdata.io.bounded_json import JsonBoundsError, load_bounded_json

ALIGNED_JSON_SUFFIX = "_aligned.json"
_SEGMENT_FIELDS = {
    "start": (int, float),
    "end": (int, float),
    "asr_text": str,
    "human_text": str,
    "cer": (int, float),
    "start_idx": int,
    "end_idx": int,
}


@dataclass(frozen=True)
class AlignedSegment:
    """One segment of an ``*_aligned.json``: a span of the long recording ``audio_file``.

    ``start_ms``/``end_ms`` are integer ms from the start of the LONG recording; ``start_idx``/
    ``end_idx`` are character offsets into the original full human transcript; ``index`` is the
    segment's 0-based position in the file's ``segments``.
    """

    key: str
    country: str
    video_id: str
    transcript_id: str
    audio_file: str
    index: int
    start_ms: int
    end_ms: int
    asr_text: str
    human_text: str
    cer: float
    start_idx: int
    end_idx: int


def aligned_json_ids(source: str) -> tuple[str, str]:
    """``(video_id, transcript_id)`` from a ``<video_id>_<transcript_id>_aligned.json`` file name.

    The name without ``_aligned.json`` splits at its LAST underscore: video ids may hold
    underscores (YouTube ids do), transcript ids are taken not to.
    """
    name = PurePath(source).name
    stem = name[: -len(ALIGNED_JSON_SUFFIX)] if name.endswith(ALIGNED_JSON_SUFFIX) else ""
    video_id, _, transcript_id = stem.rpartition("_")
    if not video_id or not transcript_id:
        raise AlignmentFormatError(
            source, None, f"file name {name!r} is not <video_id>_<transcript_id>{ALIGNED_JSON_SUFFIX}"
        )
    return video_id, transcript_id


def segment_key(country: str, video_id: str, start_ms: int, end_ms: int) -> str:
    """The manifest key ``<country>_<video_id>_<start_ms>_<end_ms>`` (ms in the long recording)."""
    return f"{country}_{video_id}_{start_ms}_{end_ms}"


def _segment_field(segment: dict, name: str, source: str, index: int):
    if name not in segment:
        raise AlignmentFormatError(source, None, f"segments[{index}]: missing key {name!r}")
    value = segment[name]
    # bool is an int subclass; true/false is never a time, index or rate.
    if isinstance(value, bool) or not isinstance(value, _SEGMENT_FIELDS[name]):
        raise AlignmentFormatError(source, None, f"segments[{index}]: {name!r} has wrong type: {value!r}")
    return value


def parse_aligned_segment(
    segment: object, index: int, source: str, country: str, video_id: str, transcript_id: str, audio_file: str
) -> AlignedSegment:
    """One entry of ``segments`` (``start``/``end`` in seconds) as an :class:`AlignedSegment`."""
    if not isinstance(segment, dict):
        raise AlignmentFormatError(source, None, f"segments[{index}]: not an object")
    values = {name: _segment_field(segment, name, source, index) for name in _SEGMENT_FIELDS}
    if not (math.isfinite(values["start"]) and math.isfinite(values["end"])) or values["start"] < 0:
        raise AlignmentFormatError(
            source, None, f"segments[{index}]: bad times start={values['start']!r} end={values['end']!r}"
        )
    start_ms, end_ms = seconds_to_ms(values["start"]), seconds_to_ms(values["end"])
    if start_ms >= end_ms:
        raise AlignmentFormatError(
            source, None, f"segments[{index}]: start {start_ms} ms is not before end {end_ms} ms"
        )
    range_problem = aligned_segment_range_problem(float(values["cer"]), values["start_idx"], values["end_idx"])
    if range_problem is not None:
        raise AlignmentFormatError(source, None, f"segments[{index}]: {range_problem}")
    return AlignedSegment(
        key=segment_key(country, video_id, start_ms, end_ms),
        country=country,
        video_id=video_id,
        transcript_id=transcript_id,
        audio_file=audio_file,
        index=index,
        start_ms=start_ms,
        end_ms=end_ms,
        asr_text=values["asr_text"],
        human_text=values["human_text"],
        cer=float(values["cer"]),
        start_idx=values["start_idx"],
        end_idx=values["end_idx"],
    )


def aligned_segment_range_problem(cer: float | None, start_idx: int | None, end_idx: int | None) -> str | None:
    """Why an aligned segment's numbers are out of range, or None: ``cer`` a finite rate >= 0 (a
    character error rate has no upper bound: insertions), the transcript indexes ``0 <= start <= end``.
    Checked where the numbers enter (the importer) and again where they leave (the HF dataset)."""
    if cer is not None and not (math.isfinite(cer) and cer >= 0):
        return f"'cer' {cer!r} is not a finite rate >= 0"
    if start_idx is not None and start_idx < 0:
        return f"'start_idx' {start_idx!r} is negative"
    if start_idx is not None and end_idx is not None and start_idx > end_idx:
        return f"'start_idx' {start_idx!r} is after 'end_idx' {end_idx!r}"
    return None


def read_aligned_json(text: str, source: str, country: str) -> list[AlignedSegment]:
    """The segments of an aligned-JSON ``<video_id>_<transcript_id>_aligned.json``, in file order.

    ``source`` is the file name (or path): it names the file in errors and gives ``video_id`` and
    ``transcript_id`` (see :func:`aligned_json_ids`). Two segments with the same key are an error.
    """
    if not country:
        raise ValueError("country must be non-empty")
    video_id, transcript_id = aligned_json_ids(source)
    try:
        document = load_bounded_json(text, source)
    except JsonBoundsError as exc:
        raise AlignmentFormatError(source, None, exc.detail) from exc
    except json.JSONDecodeError as exc:
        raise AlignmentFormatError(source, exc.lineno, f"malformed JSON: {exc.msg}") from exc
    if not isinstance(document, dict):
        raise AlignmentFormatError(source, None, "top level is not a JSON object")
    for name, kind in (("audio_file", str), ("segments", list)):
        if not isinstance(document.get(name), kind):
            problem = "missing" if name not in document else f"not a {kind.__name__}"
            raise AlignmentFormatError(source, None, f"{name!r} {problem}")
    segments = [
        parse_aligned_segment(seg, i, source, country, video_id, transcript_id, document["audio_file"])
        for i, seg in enumerate(document["segments"])
    ]
    first_index_by_key: dict[str, int] = {}
    for seg in segments:
        earlier = first_index_by_key.setdefault(seg.key, seg.index)
        if earlier != seg.index:
            raise AlignmentFormatError(
                source, None, f"segments[{seg.index}]: key {seg.key!r} repeats segments[{earlier}]"
            )
    return segments


def segment_units(segment: AlignedSegment) -> TimedUnit:
    """The segment as one ``segment``-level unit over its own cut audio: ``[0, end_ms - start_ms]`` ms."""
    return TimedUnit(segment.human_text, 0, segment.end_ms - segment.start_ms)


def aligned_json_rows(segments: list[AlignedSegment]) -> list[dict]:
    """Alignments-table rows, one ``segment`` row per segment, with the segment's key as ``utt_id``."""
    return [row for seg in segments for row in alignment_rows(seg.key, "segment", [segment_units(seg)])]
