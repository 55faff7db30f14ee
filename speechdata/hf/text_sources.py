"""Where a published segment's text came from: the human transcript that landed, or our aligner's pseudo-label.

A row of a shard meant for the dataset whose human text is missing or blank was transcribed by the
aligner (:mod:`speechdata.alignment.pseudo_labels`, recorded in the shard's
``alignment_scores.parquet``). It is published with ``text`` = the pseudo-label,
``text_source`` = ``asr`` and its ``asr_confidence``, and no human transcript (``human_transcript``
and ``wer`` null: there is no human reference to score against), when that confidence reaches the
dataset's ``min_asr_confidence`` (the quality policy's threshold); below it the segment is filtered
``low_asr_confidence``. Every other row has ``text`` = its human transcript, ``text_source`` =
``landed`` and a null confidence. A row without text whose shard has no pseudo-label for it (not
aligned yet, or the aligner rejected it) stays filtered ``missing_human_text`` until one is recorded:
the shard's ``alignment_scores.parquet`` is part of its stamp, so the next refresh reads it again.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from speechdata.alignment.pseudo_labels import TEXT_SOURCE_ASR, TEXT_SOURCE_LANDED, with_text_sources
from speechdata.io.storage import DataRoot

LOW_ASR_CONFIDENCE = "low_asr_confidence"
"""The filter reason of a pseudo-label below the threshold: the quality policy's name for it."""


def with_pseudo_labels(data_root: DataRoot, shard_id: str, index: pa.Table) -> pa.Table:
    """The shard's unpacked utterance index with ``text_source`` and ``asr_confidence`` added, and
    ``text`` set to the pseudo-label where it is missing or blank and one is recorded (aligned JSON
    lands ``text`` = ``human_text``)."""
    if "text" not in index.column_names:
        index = index.append_column("text", pa.nulls(index.num_rows, pa.string()))
    return with_text_sources(data_root, shard_id, index)


def text_columns(index: pa.Table, human_text: pa.Array) -> dict[str, pa.Array]:
    """The segment columns ``human_text``, ``text``, ``text_source`` and ``asr_confidence`` of rows of
    :func:`with_pseudo_labels` (``human_text``: the landed human transcript, ``text`` as fallback)."""
    n = index.num_rows
    if "text_source" in index.column_names:
        source = index["text_source"].combine_chunks()
        confidence = index["asr_confidence"].combine_chunks()
    else:
        source, confidence = pa.array([TEXT_SOURCE_LANDED] * n, pa.string()), pa.nulls(n, pa.float32())
    labelled = pc.equal(source, TEXT_SOURCE_ASR)
    nothing = pa.nulls(n, pa.string())
    human = pc.if_else(labelled, nothing, human_text)
    text = pc.if_else(labelled, index["text"].combine_chunks().cast(pa.string()), human)
    return {"human_text": human, "text": text, "text_source": source, "asr_confidence": confidence.cast(pa.float32())}


def pseudo_label_reason(source: str | None, confidence: float | None, min_confidence: float | None) -> str | None:
    """``low_asr_confidence`` for a pseudo-label under ``min_confidence`` (None: no threshold), else None."""
    if source != TEXT_SOURCE_ASR or min_confidence is None:
        return None
    if confidence is None or not confidence >= min_confidence:
        return LOW_ASR_CONFIDENCE
    return None


def is_blank(text: str | None) -> bool:
    return not (text or "").strip()
