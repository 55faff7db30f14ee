"""Pseudo-labels: the aligner's own transcript of an utterance landed without text, with confidences.

An utterance whose landed text is missing or blank is transcribed from the log-probs the aligner
computed anyway (greedy CTC: argmax per frame, repeats merged, blanks dropped), then aligned to
that transcript like any other. Its confidences come from the same frames:

- a word's confidence is the mean, over the frames whose argmax is one of the word's tokens, of the
  frame's max posterior (``exp`` of the max log-prob);
- the utterance's confidence is the same mean over every such frame of every word (so a long word
  weighs more than a short one). Blank frames and word separators do not count: a model sure of
  silence is not sure of the words.

Every product says where its text came from in ``text_source``: ``landed`` (the text the shard
brought) or ``asr`` (this pseudo-label). The alignment stage records the label, its confidences and
the source in ``alignment_scores.parquet``; the stages after it read the text through
:func:`with_text_sources`, and the quality policy rejects labels below ``min_asr_confidence``
(``low_asr_confidence``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from speechdata.alignment.greedy import SUBWORD_WORD_START, tokens_to_text
from speechdata.io import layout
from speechdata.io.storage import DataRoot

TEXT_SOURCE_LANDED = "landed"
TEXT_SOURCE_ASR = "asr"
TEXT_SOURCES = (TEXT_SOURCE_LANDED, TEXT_SOURCE_ASR)

TEXT_SOURCE_FIELD = pa.field(
    "text_source",
    pa.string(),
    metadata={
        "description": "Where the text came from: 'landed' (the shard's own) or 'asr' (the aligner's pseudo-label)."
    },
)
ASR_CONFIDENCE_FIELD = pa.field(
    "asr_confidence",
    pa.float32(),
    metadata={
        "description": "The pseudo-label's confidence (mean max posterior of its words' frames, 0-1); null for landed text."
    },
)


@dataclass(frozen=True)
class PseudoLabel:
    words: list[str]
    word_confidences: list[float]
    confidence: float
    """Mean max posterior over every frame of every word; 0.0 when no word was recognized."""

    @property
    def text(self) -> str:
        return " ".join(self.words)


def needs_pseudo_label(text: str | None) -> bool:
    """Whether the landed text is missing or has no word at all (blank)."""
    return not (text or "").split()


def pseudo_label(log_probs: np.ndarray, vocabulary) -> PseudoLabel:
    """Greedy CTC transcript of ``log_probs [T, V]`` (log-softmax outputs) with word confidences."""
    log_probs = np.asarray(log_probs)
    if log_probs.shape[0] == 0:
        return PseudoLabel([], [], 0.0)
    best = log_probs.argmax(axis=1)
    posterior = np.exp(log_probs.max(axis=1))
    words: list[tuple[list[int], list[float]]] = []  # (token ids, frame posteriors) per word
    previous = None
    for frame, token_id in enumerate(best.tolist()):
        repeated = token_id == previous
        previous = token_id
        if token_id == vocabulary.blank_id:
            continue
        if vocabulary.separator_id is not None and token_id == vocabulary.separator_id:
            if not repeated:
                words.append(([], []))
            continue
        if not repeated:
            starts_word = not words or vocabulary.token_text(token_id).startswith(SUBWORD_WORD_START)
            if starts_word:
                words.append(([], []))
            words[-1][0].append(token_id)
        words[-1][1].append(float(posterior[frame]))
    decoded = [(tokens_to_text(tokens, vocabulary), frames) for tokens, frames in words if tokens]
    decoded = [(text, frames) for text, frames in decoded if text]
    if not decoded:
        return PseudoLabel([], [], 0.0)
    all_frames = [p for _, frames in decoded for p in frames]
    return PseudoLabel(
        [text for text, _ in decoded],
        [float(np.mean(frames)) for _, frames in decoded],
        float(np.mean(all_frames)),
    )


def with_text_sources(data_root: DataRoot, shard_id: str, table: pa.Table) -> pa.Table:
    """``table`` (rows with ``utt_id`` and ``text``) with each pseudo-labelled utterance's text filled
    in, and ``text_source`` and ``asr_confidence`` columns added (replaced if there).

    The labels are those the shard's last ``alignments`` run recorded in ``alignment_scores.parquet``;
    a shard without that file (imported alignments read no audio; older runs) has landed text only.
    """
    labels = read_pseudo_labels(data_root, shard_id)
    for name in (TEXT_SOURCE_FIELD.name, ASR_CONFIDENCE_FIELD.name):
        if name in table.column_names:
            table = table.drop_columns([name])
    utt_ids = table["utt_id"].to_pylist()
    texts = table["text"].to_pylist() if "text" in table.column_names else [None] * len(utt_ids)
    filled, sources, confidences = [], [], []
    for utt_id, text in zip(utt_ids, texts, strict=True):
        label = labels.get(utt_id)
        if label is not None and needs_pseudo_label(text):
            filled.append(label[0])
            sources.append(TEXT_SOURCE_ASR)
            confidences.append(label[1])
        else:
            filled.append(text)
            sources.append(TEXT_SOURCE_LANDED)
            confidences.append(None)
    if "text" in table.column_names:
        position = table.column_names.index("text")
        table = table.set_column(position, table.schema.field("text"), pa.array(filled, table["text"].type))
    table = table.append_column(TEXT_SOURCE_FIELD, pa.array(sources, pa.string()))
    return table.append_column(ASR_CONFIDENCE_FIELD, pa.array(confidences, pa.float32()))


def read_pseudo_labels(data_root: DataRoot, shard_id: str) -> dict[str, tuple[str, float]]:
    """``{utt_id: (pseudo-label, confidence)}`` of the shard's aligned pseudo-labelled utterances."""
    path = layout.alignment_scores(shard_id)
    if not data_root.exists(path):
        return {}
    scores = data_root.read_parquet(path)
    if "asr_text" not in scores.column_names:
        return {}
    labelled = scores.filter(pc.equal(scores["text_source"], TEXT_SOURCE_ASR))
    return {
        utt_id: (text, confidence)
        for utt_id, text, confidence in zip(
            labelled["utt_id"].to_pylist(),
            labelled["asr_text"].to_pylist(),
            labelled["asr_confidence"].to_pylist(),
            strict=True,
        )
    }
