"""Alignments made elsewhere, read into the alignments table; and a CTM writer.

Three formats are read, each into :class:`~speechdata.alignment.table.TimedUnit` lists whose times
are integer milliseconds (rounded half up by ``seconds_to_ms``, docs/bridge-tuples.md):

- CTM as NeMo Forced Aligner (NFA) writes it (:func:`read_ctm`, and :func:`write_ctm` back);
- Montreal Forced Aligner (MFA) long-format TextGrids, word tier only (:func:`read_textgrid`);
- per-country aligned-JSON corpora's ``<video_id>_<transcript_id>_aligned.json`` segment lists
  (:func:`read_aligned_json`, in :mod:`speechdata.alignment.aligned_json_format` and re-exported here).

Every malformed input raises :class:`AlignmentFormatError` naming the file and, where known, the
1-based line. Imported units carry no score (``score`` is None: only our own aligner has one).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

from praatio.textgrid import INTERVAL_TIER, IntervalTier
from praatio.utilities import errors as praatio_errors
from praatio.utilities import textgrid_io

from speechdata.alignment.aligned_json_format import (
    ALIGNED_JSON_SUFFIX,
    AlignedSegment,
    aligned_json_ids,
    aligned_json_rows,
    aligned_segment_range_problem,
    read_aligned_json,
    segment_units,
)
from speechdata.alignment.table import LEVELS, AlignmentFormatError, TimedUnit, alignment_rows, seconds_to_ms

__all__ = [
    # Defined in speechdata.alignment.aligned_json_format and speechdata.alignment.table; imported from here.
    "ALIGNED_JSON_SUFFIX",
    "AlignedSegment",
    "AlignmentFormatError",
    "aligned_json_ids",
    "aligned_json_rows",
    "aligned_segment_range_problem",
    "read_aligned_json",
    "segment_units",
    # Defined here.
    "CTM_BLANK",
    "CTM_SPACE",
    "alignment_rows_by_utterance",
    "decode_ctm",
    "decode_textgrid",
    "parse_ctm_line",
    "read_ctm",
    "read_textgrid",
    "write_ctm",
]


def alignment_rows_by_utterance(units_by_utt: Mapping[str, list[TimedUnit]], level: str) -> list[dict]:
    """Alignments-table rows for several utterances at one level, utterances in mapping order."""
    return [row for utt_id, units in units_by_utt.items() for row in alignment_rows(utt_id, level, units)]


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")


# --- CTM (NeMo Forced Aligner) -------------------------------------------------------------------

CTM_BLANK = "<b>"
"""NFA's CTC blank token: time the model spent on no unit, so not a unit."""
CTM_SPACE = "<space>"
"""NFA writes each space in a unit's text as ``<space>`` (keeping columns whitespace-separated); a
token that is only a space is not a unit."""
_CTM_COLUMNS = (5, 8)


def _ctm_seconds(field: str, name: str, source: str, line_no: int) -> float:
    try:
        value = float(field)
    except ValueError:
        raise AlignmentFormatError(source, line_no, f"{name} {field!r} is not a number") from None
    if not math.isfinite(value):
        raise AlignmentFormatError(source, line_no, f"{name} {field!r} is not finite")
    if value < 0:
        raise AlignmentFormatError(source, line_no, f"{name} {field!r} is negative")
    return value


def parse_ctm_line(line: str, source: str, line_no: int) -> tuple[str, TimedUnit | None] | None:
    """One CTM line as ``(utt_id, unit)``; unit None for ``<b>``/``<space>``; None for blank/``;;`` lines.

    Columns: ``<utt_id> <channel> <start_s> <duration_s> <text> [<conf> <type> <speaker>]``; the
    unit spans ``[seconds_to_ms(start_s), seconds_to_ms(start_s + duration_s)]`` ms.
    """
    stripped = line.strip()
    if not stripped or stripped.startswith(";;"):
        return None
    fields = stripped.split()
    if len(fields) not in _CTM_COLUMNS:
        raise AlignmentFormatError(
            source, line_no, f"expected 5 or 8 whitespace-separated columns, found {len(fields)}"
        )
    utt_id, _channel, start_field, duration_field, text = fields[:5]
    start_s = _ctm_seconds(start_field, "start", source, line_no)
    duration_s = _ctm_seconds(duration_field, "duration", source, line_no)
    if text in (CTM_BLANK, CTM_SPACE):
        return utt_id, None
    unit = TimedUnit(text.replace(CTM_SPACE, " "), seconds_to_ms(start_s), seconds_to_ms(start_s + duration_s))
    return utt_id, unit


def read_ctm(text: str, source: str, level: str) -> dict[str, list[TimedUnit]]:
    """Units per utterance from CTM ``text``, utterances and units in file order.

    ``source`` names the file in errors; ``level`` (``word``/``token``/``segment``) is what the CTM
    holds and is only checked here. An utterance whose lines are all blanks maps to ``[]``.
    """
    _check_level(level)
    units_by_utt: dict[str, list[TimedUnit]] = {}
    for line_no, line in enumerate(text.splitlines(), start=1):
        parsed = parse_ctm_line(line, source, line_no)
        if parsed is None:
            continue
        utt_id, unit = parsed
        units = units_by_utt.setdefault(utt_id, [])
        if unit is not None:
            units.append(unit)
    return units_by_utt


def _centiseconds_to_ctm_seconds(centiseconds: int) -> str:
    return f"{centiseconds // 100}.{centiseconds % 100:02d}"


def write_ctm(utt_id: str, units: list[TimedUnit], level: str) -> str:
    """NFA-style 8-column CTM lines ``<utt> 1 <start_s> <dur_s> <text> NA lex NA`` for one utterance.

    Times are seconds with 2 decimals, as NFA writes them: ms round half up to 10 ms in integer
    arithmetic (``"%.2f" % 2.325`` gives 2.32 from the binary float), and the duration is
    end minus start after rounding, so ``start + duration`` reads back as the rounded end.
    """
    _check_level(level)
    if not utt_id or any(c.isspace() for c in utt_id):
        raise ValueError(f"utt_id must be non-empty without whitespace, got {utt_id!r}")
    lines = []
    for unit in units:
        if not unit.text.strip():
            raise ValueError(f"{utt_id}: unit text must not be empty or only whitespace, got {unit.text!r}")
        if unit.start_ms < 0:
            raise ValueError(f"{utt_id}: {unit.text!r} has negative start_ms {unit.start_ms}")
        start_cs = (unit.start_ms + 5) // 10
        end_cs = (unit.end_ms + 5) // 10
        text = "".join(CTM_SPACE if c.isspace() else c for c in unit.text)
        start_s = _centiseconds_to_ctm_seconds(start_cs)
        duration_s = _centiseconds_to_ctm_seconds(end_cs - start_cs)
        lines.append(f"{utt_id} 1 {start_s} {duration_s} {text} NA lex NA\n")
    return "".join(lines)


# --- TextGrid (Montreal Forced Aligner) ----------------------------------------------------------

WORD_TIER = "words"
SPEAKER_WORD_TIER_SUFFIX = " - words"
"""MFA names tiers ``<speaker> - words`` when it aligned a file with several speakers."""
TEXTGRID_SILENCE = frozenset({"", "<eps>", "sp", "sil"})
TEXTGRID_HEADER = 'File type = "ooTextFile'
"""How both the long and the short Praat text formats begin (the short one adds `` short``)."""

# praatio's parser reports most malformed input as its own errors, but some as plain Python ones
# (a header cut short gives IndexError, a bad number ValueError).
_PRAATIO_PARSE_ERRORS = (praatio_errors.PraatioException, ValueError, IndexError, KeyError, TypeError, AttributeError)


def decode_ctm(data: bytes, source: str) -> str:
    """A CTM file's text; AlignmentFormatError naming the file and the rule when it is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AlignmentFormatError(source, None, f"not utf-8 text: {exc}") from exc


def decode_textgrid(data: bytes, source: str) -> str:
    """A TextGrid's text (UTF-16 with a BOM, as Praat saves, or UTF-8, as MFA writes), or AlignmentFormatError."""
    return _decode_textgrid(data, source)


def _decode_textgrid(data: bytes, source: str) -> str:
    # Praat itself saves UTF-16 with a BOM; MFA writes UTF-8.
    encoding = "utf-16" if data[:2] in (b"\xff\xfe", b"\xfe\xff") else "utf-8-sig"
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise AlignmentFormatError(source, None, f"not {encoding} text: {exc}") from exc


def _is_word_tier(name: str) -> bool:
    return name == WORD_TIER or name.endswith(SPEAKER_WORD_TIER_SUFFIX)


def _word_tiers(textgrid: dict, source: str) -> list[IntervalTier]:
    tiers = [tier for tier in textgrid["tiers"] if _is_word_tier(tier["name"])]
    names = [tier["name"] for tier in tiers]
    if not tiers:
        found = ", ".join(repr(t["name"]) for t in textgrid["tiers"]) or "none"
        raise AlignmentFormatError(
            source, None, f"no {WORD_TIER!r} or '<speaker>{SPEAKER_WORD_TIER_SUFFIX}' tier (tiers: {found})"
        )
    if len(set(names)) != len(names):
        raise AlignmentFormatError(source, None, f"duplicate word tier names: {names}")
    word_tiers = []
    for tier in tiers:
        if tier["class"] != INTERVAL_TIER:
            raise AlignmentFormatError(source, None, f"tier {tier['name']!r} is not an IntervalTier")
        try:
            word_tiers.append(IntervalTier(tier["name"], tier["entries"], tier["xmin"], tier["xmax"]))
        except _PRAATIO_PARSE_ERRORS as exc:
            raise AlignmentFormatError(source, None, f"tier {tier['name']!r}: {exc}") from exc
    return word_tiers


def read_textgrid(text_or_path: str | os.PathLike, source: str | None = None) -> list[TimedUnit]:
    """The words of an MFA TextGrid, in time order, times in ms from the start of its audio.

    ``text_or_path``: a ``str`` is the TextGrid's content; a path-like (``Path``) is a file to read.
    ``source`` names the file in errors (default: the path). All ``words`` / ``<speaker> - words``
    tiers are merged by start_ms, ties in tier order (the order MFA wrote the speakers), so
    overlapping speakers give overlapping units. Intervals labelled ``""``, ``<eps>``, ``sp`` or
    ``sil`` are silence, not units. The ``phones`` tiers are not read.
    """
    if isinstance(text_or_path, os.PathLike):
        path = Path(text_or_path)
        source = source if source is not None else str(path)
        content = _decode_textgrid(path.read_bytes(), source)
    elif isinstance(text_or_path, str):
        if source is None:
            raise TypeError("read_textgrid needs a source name when given TextGrid text")
        content = text_or_path
    else:
        raise TypeError(f"text_or_path must be str or path-like, got {type(text_or_path).__name__}")
    if not content.lstrip().startswith(TEXTGRID_HEADER):
        raise AlignmentFormatError(source, None, f"not a Praat text TextGrid: no '{TEXTGRID_HEADER}...' header")
    try:
        textgrid = textgrid_io.parseTextgridStr(content, includeEmptyIntervals=False)
    except _PRAATIO_PARSE_ERRORS as exc:
        raise AlignmentFormatError(source, None, f"unparseable TextGrid: {type(exc).__name__}: {exc}") from exc
    timed = []
    for tier_index, tier in enumerate(_word_tiers(textgrid, source)):
        for start_s, end_s, label in tier.entries:
            if label.strip() in TEXTGRID_SILENCE:
                continue
            timed.append((seconds_to_ms(start_s), tier_index, seconds_to_ms(end_s), label.strip()))
    timed.sort(key=lambda t: t[:2])  # stable: a tier's own order stays as written
    return [TimedUnit(label, start_ms, end_ms) for start_ms, _tier, end_ms, label in timed]
