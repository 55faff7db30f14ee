"""Greedy CTC transcripts from the log-probs the aligner already computed (no second forward pass).

Decoding goes through the aligner's vocabulary object (``CtcAligner.vocabulary``: its ``blank_id``,
``separator_id`` and ``token_text``), not through the acoustic model's own tokenizer, so it works for
any model behind the :class:`~speechdata.alignment.stage.CtcAligner` interface. The reference the
hypothesis is compared with is the landed text put through the same vocabulary word by word
(:func:`speechdata.alignment.transcript_units.ctc_targets`), so both sides are normalized exactly as
the aligner normalizes text: NFKC, lower case, numbers spoken, other scripts romanized,
characters the model still cannot emit dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from speechdata.alignment.transcript_units import ctc_targets
from speechdata.io import layout


def greedy_hypotheses_path(shard_id: str) -> str:
    """``shards/<shard>/greedy_hypotheses.parquet``: written by the alignment stage beside its scores."""
    return f"{layout.shard_dir(shard_id)}/greedy_hypotheses.parquet"


SUBWORD_WORD_START = "\u2581"
"""SentencePiece's word-start marker: a piece beginning with it starts a new word."""

GREEDY_HYPOTHESES_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False, metadata={"description": "The utterance."}),
        pa.field(
            "hypothesis",
            pa.string(),
            nullable=False,
            metadata={"description": "Greedy CTC transcript (argmax per frame, repeats merged, blanks dropped)."},
        ),
        pa.field(
            "reference",
            pa.string(),
            nullable=False,
            metadata={"description": "The landed text normalized through the aligner's vocabulary."},
        ),
    ]
)


def greedy_token_ids(log_probs: np.ndarray, blank_id: int) -> list[int]:
    """Argmax per frame, repeated labels merged, blanks dropped (best-path CTC decoding)."""
    if log_probs.shape[0] == 0:
        return []
    best = np.asarray(log_probs).argmax(axis=1)
    keep = np.ones(best.shape[0], dtype=bool)
    keep[1:] = best[1:] != best[:-1]
    return [int(t) for t in best[keep] if t != blank_id]


def tokens_to_text(token_ids: Sequence[int], vocabulary) -> str:
    """Token ids -> words joined by single spaces, through the vocabulary's ``token_text``."""
    words: list[str] = []
    current = ""
    for token_id in token_ids:
        if vocabulary.separator_id is not None and token_id == vocabulary.separator_id:
            words.append(current)
            current = ""
            continue
        text = vocabulary.token_text(token_id)
        if text.startswith(SUBWORD_WORD_START):
            # a piece that starts a word closes the one before: without the reset every word would
            # repeat all before it, a transcript quadratic in its length (2.9 M characters for 5 minutes)
            words.append(current)
            current = ""
            text = text[len(SUBWORD_WORD_START) :]
        current += text.replace(SUBWORD_WORD_START, " ")
    words.append(current)
    return " ".join(" ".join(words).split())


def greedy_transcript(log_probs: np.ndarray, vocabulary) -> str:
    """The best-path transcript of one utterance's ``[T, V]`` log-probs."""
    return tokens_to_text(greedy_token_ids(log_probs, vocabulary.blank_id), vocabulary)


def normalized_reference(text: str, vocabulary, language: str | None = None) -> str:
    """The landed text as the aligner sees it: each word's tokens decoded back, words spaced.

    A vocabulary with no word boundary (letters only, no delimiter) cannot put spaces in its
    greedy transcript, so its reference has none either: the CER then compares letters with letters."""
    targets = ctc_targets(text or "", vocabulary, language)
    words = [tokens_to_text(targets.targets[first:last], vocabulary) for first, last in targets.word_target_ranges]
    joiner = " " if getattr(vocabulary, "marks_word_boundaries", True) else ""
    return joiner.join(word for word in words if word)
