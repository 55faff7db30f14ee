"""The alignments table: word and token time spans per utterance, whoever aligned them.

One row per aligned unit: ``utt_id``, ``level`` (``word``, ``token`` or ``segment``), ``index``
(position within the utterance at that level), ``text``, ``start_ms``/``end_ms`` (integer
milliseconds from the start of the utterance's own audio, ``start_ms <= end_ms``) and ``score``
(mean log-probability of the unit's frames on the Viterbi path, null for imported alignments).

Times are integer milliseconds, rounded half up from seconds, before any grid arithmetic
(docs/bridge-tuples.md: float division misplaces frames).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pyarrow as pa

LEVELS = ("word", "token", "segment")

ALIGNMENTS_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("level", pa.string(), nullable=False),
        pa.field("index", pa.int32(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("start_ms", pa.int32(), nullable=False),
        pa.field("end_ms", pa.int32(), nullable=False),
        pa.field("score", pa.float32()),
    ]
)

UNTRANSCRIBED_STRETCH = pa.struct(
    [pa.field("start_ms", pa.int32(), nullable=False), pa.field("end_ms", pa.int32(), nullable=False)]
)

UTTERANCE_SCORES_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("aligner", pa.string(), nullable=False),
        pa.field("score", pa.float32()),
        pa.field("n_words", pa.int32(), nullable=False),
        pa.field("n_frames", pa.int32(), nullable=False),
        pa.field("untranscribed_ms", pa.int32()),
        pa.field("untranscribed", pa.list_(UNTRANSCRIBED_STRETCH)),
        # Null only in tables written before pseudo-labels existed: read as "landed".
        pa.field("text_source", pa.string()),
        pa.field("asr_text", pa.string()),
        pa.field("asr_confidence", pa.float32()),
        pa.field("asr_word_confidences", pa.list_(pa.float32())),
    ]
)
"""One row per aligned utterance: ``score`` is the mean frame log-prob on the Viterbi path (of the
transcript's own labels); ``untranscribed`` the stretches the alignment's wildcard explained instead
of the transcript (``start_ms``, ``end_ms``; empty without one), ``untranscribed_ms`` their total
(both null in a table written before they existed); ``text_source`` says whether the aligned text is
the landed one (``landed``) or the aligner's own greedy transcript (``asr``,
speechdata.alignment.pseudo_labels), which is then ``asr_text``, with its confidence and one
confidence per word (null for landed text)."""


def seconds_to_ms(seconds: float) -> int:
    """Round seconds to integer milliseconds, half up (``round`` would round half to even)."""
    return int(math.floor(seconds * 1000.0 + 0.5 + 1e-9))


@dataclass(frozen=True)
class TimedUnit:
    """A word, token or segment with its time span in integer ms (relative to the utterance)."""

    text: str
    start_ms: int
    end_ms: int
    score: float | None = None

    def __post_init__(self):
        if self.end_ms < self.start_ms:
            raise ValueError(f"{self.text!r}: end_ms {self.end_ms} < start_ms {self.start_ms}")


def alignment_rows(utt_id: str, level: str, units: list[TimedUnit]) -> list[dict]:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    return [
        {
            "utt_id": utt_id,
            "level": level,
            "index": i,
            "text": u.text,
            "start_ms": u.start_ms,
            "end_ms": u.end_ms,
            "score": u.score,
        }
        for i, u in enumerate(units)
    ]


def alignments_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ALIGNMENTS_SCHEMA)


def words_by_utterance(table: pa.Table) -> dict[str, list[TimedUnit]]:
    """The ``word`` rows of an alignments table, grouped by utterance, in index order."""
    words = table.filter(pa.compute.equal(table["level"], "word")).sort_by(
        [("utt_id", "ascending"), ("index", "ascending")]
    )
    grouped: dict[str, list[TimedUnit]] = {}
    for row in words.to_pylist():
        grouped.setdefault(row["utt_id"], []).append(
            TimedUnit(row["text"], row["start_ms"], row["end_ms"], row["score"])
        )
    return grouped


class AlignmentFormatError(ValueError):
    """An alignment file that cannot be read: ``source`` (file name), ``line`` (1-based or None)."""

    def __init__(self, source: str, line: int | None, message: str):
        self.source = source
        self.line = line
        self.message = message
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {message}")
