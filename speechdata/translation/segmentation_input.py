"""LLM segmentation inputs: per utterance, English/Chinese chunk lists at three latency levels.

The LLM step's format, one JSON file per utterance, landed at
``landing/<shard>/segmentation/<utt_id>.json``
(:func:`speechdata.io.layout.landing_segmentation_dir`)::

    {"low_latency":    {"English": ["which", "sites", ...], "Chinese": ["哪些", "网站", ...]},
     "medium_latency": {"English": [...], "Chinese": [...]},
     "high_latency":   {"English": [...], "Chinese": [...]}}

The two lists of a level are parallel: ``Chinese[i]`` translates ``English[i]``. Pairing is by
position, never through an ``{english: chinese}`` dict as in the original translation script (a
repeated English chunk would take the last translation for every occurrence). Anything else is a
:class:`SegmentationError` with a stable ``reason`` code, which the stage records as a reject.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from speechdata.io.bounded_json import JsonBoundsError, load_bounded_json

LATENCY_LEVELS = ("low_latency", "medium_latency", "high_latency")
SOURCE_LANGUAGE = "English"
TARGET_LANGUAGE = "Chinese"

SEGMENTATION_REJECT_REASONS = (
    "segmentation_malformed_json",
    "segmentation_over_json_limits",
    "segmentation_not_an_object",
    "segmentation_missing_level",
    "segmentation_missing_language",
    "segmentation_not_a_string_list",
    "segmentation_unequal_lengths",
)


class SegmentationError(ValueError):
    """A segmentation file that cannot be used: ``reason`` (one of the codes above) and a detail."""

    def __init__(self, reason: str, source: str, detail: str):
        self.reason = reason
        self.source = source
        self.detail = detail
        super().__init__(f"{source}: {detail}")


@dataclass(frozen=True)
class LevelChunks:
    """One latency level: English chunks and their Chinese translations, position by position."""

    english: tuple[str, ...]
    chinese: tuple[str, ...]


@dataclass(frozen=True)
class Segmentation:
    """All three latency levels of one utterance, keyed by :data:`LATENCY_LEVELS`."""

    levels: dict[str, LevelChunks]


def _string_list(value: object, where: str, source: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise SegmentationError("segmentation_not_a_string_list", source, f"{where} is not a list of strings")
    return tuple(value)


def parse_segmentation(document: object, source: str) -> Segmentation:
    """Validate an already-decoded segmentation document (see the module docstring)."""
    if not isinstance(document, dict):
        raise SegmentationError("segmentation_not_an_object", source, "top level is not a JSON object")
    levels: dict[str, LevelChunks] = {}
    for level in LATENCY_LEVELS:
        entry = document.get(level)
        if not isinstance(entry, dict):
            problem = "missing" if level not in document else "not an object"
            raise SegmentationError("segmentation_missing_level", source, f"{level!r} is {problem}")
        for language in (SOURCE_LANGUAGE, TARGET_LANGUAGE):
            if language not in entry:
                raise SegmentationError(
                    "segmentation_missing_language", source, f"{level}.{language} is missing (have: {sorted(entry)})"
                )
        english = _string_list(entry[SOURCE_LANGUAGE], f"{level}.{SOURCE_LANGUAGE}", source)
        chinese = _string_list(entry[TARGET_LANGUAGE], f"{level}.{TARGET_LANGUAGE}", source)
        if len(english) != len(chinese):
            raise SegmentationError(
                "segmentation_unequal_lengths",
                source,
                f"{level}: {len(english)} {SOURCE_LANGUAGE} chunks but {len(chinese)} {TARGET_LANGUAGE} chunks",
            )
        levels[level] = LevelChunks(english, chinese)
    return Segmentation(levels)


def read_segmentation(data: bytes | str, source: str) -> Segmentation:
    """Decode and validate one segmentation file (UTF-8, a BOM is allowed), its nesting and size
    bounded first (:mod:`speechdata.io.bounded_json`)."""
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
        document = load_bounded_json(text, source)
    except JsonBoundsError as exc:
        raise SegmentationError("segmentation_over_json_limits", source, exc.detail) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SegmentationError("segmentation_malformed_json", source, f"not UTF-8 JSON: {exc}") from exc
    return parse_segmentation(document, source)


def segmentation_json(segmentation: Segmentation) -> str:
    """The original translation script's JSON for a :class:`Segmentation`.

    What an LLM step writes; used by tests and tools."""
    document = {
        level: {SOURCE_LANGUAGE: list(chunks.english), TARGET_LANGUAGE: list(chunks.chinese)}
        for level, chunks in segmentation.levels.items()
    }
    return json.dumps(document, ensure_ascii=False)
