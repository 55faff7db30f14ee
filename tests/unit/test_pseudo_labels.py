"""Pseudo-labels from synthetic log-probs: greedy words, their confidences, the quality threshold."""

import numpy as np
import pyarrow as pa
import pytest

from speechdata.alignment.pseudo_labels import needs_pseudo_label, pseudo_label, with_text_sources
from speechdata.alignment.table import UTTERANCE_SCORES_SCHEMA
from speechdata.alignment.transcript_units import CharVocabulary
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.policy import QualityPolicy, decide, default_policies

VOCABULARY = CharVocabulary(["a", "b", " "])  # a 0, b 1, separator 2, blank 3
A, B, SPACE, BLANK = 0, 1, 2, 3


def log_probs_with(frames: list[tuple[int, float]]) -> np.ndarray:
    """One frame per ``(label, posterior)``: the label gets ``posterior``, the rest share what is left."""
    rows = []
    for label, posterior in frames:
        row = np.full(4, (1.0 - posterior) / 3)
        row[label] = posterior
        rows.append(np.log(row))
    return np.array(rows, dtype=np.float32)


def test_words_and_confidences_come_from_the_frames_of_each_word():
    log_probs = log_probs_with(
        [(BLANK, 0.99), (A, 0.9), (A, 0.7), (BLANK, 0.99), (B, 0.5), (SPACE, 0.8), (B, 0.6), (BLANK, 0.95)]
    )
    label = pseudo_label(log_probs, VOCABULARY)
    assert label.words == ["ab", "b"]
    assert label.text == "ab b"
    # Blanks and the separator do not count; a word's frames are those of its tokens.
    assert label.word_confidences == pytest.approx([(0.9 + 0.7 + 0.5) / 3, 0.6], abs=1e-5)
    assert label.confidence == pytest.approx((0.9 + 0.7 + 0.5 + 0.6) / 4, abs=1e-5)


def test_a_blank_between_repeats_gives_two_tokens_and_all_blank_gives_no_words():
    assert pseudo_label(log_probs_with([(A, 0.9), (BLANK, 0.9), (A, 0.9)]), VOCABULARY).words == ["aa"]
    empty = pseudo_label(log_probs_with([(BLANK, 0.99)] * 5), VOCABULARY)
    assert (empty.words, empty.confidence) == ([], 0.0)
    assert pseudo_label(np.zeros((0, 4), np.float32), VOCABULARY).words == []


@pytest.mark.parametrize("text, needs", [(None, True), ("", True), ("  \t", True), ("a", False)])
def test_only_missing_or_blank_text_needs_a_pseudo_label(text, needs):
    assert needs_pseudo_label(text) is needs


def test_the_quality_policy_rejects_a_pseudo_label_below_its_confidence_threshold():
    policy = QualityPolicy(min_asr_confidence=0.7)
    confident = pseudo_label(log_probs_with([(A, 0.95), (B, 0.9)]), VOCABULARY).confidence
    unsure = pseudo_label(log_probs_with([(A, 0.4), (B, 0.5)]), VOCABULARY).confidence
    assert decide({"text_source": "asr", "asr_confidence": confident}, policy) is None
    reason, detail = decide({"text_source": "asr", "asr_confidence": unsure}, policy)
    assert reason == "low_asr_confidence" and "asr_confidence 0.45 < 0.7" in detail
    # Landed text has no ASR confidence: the filter never judges it.
    assert decide({"text_source": "landed", "asr_confidence": None}, policy) is None
    # A model filter: the tiny profile's random models would reject every label.
    assert default_policies("tiny")["asr"].min_asr_confidence is None
    assert default_policies("full")["asr"].min_asr_confidence == 0.7


def test_downstream_stages_read_the_pseudo_label_where_no_text_landed(tmp_path):
    data_root = DataRoot(str(tmp_path))
    score = {"aligner": "m", "score": -1.0, "n_words": 1, "n_frames": 9}
    scores = [
        {**score, "utt_id": "heard", "text_source": "asr", "asr_text": "ab", "asr_confidence": 0.8},
        {**score, "utt_id": "landed", "text_source": "landed"},
    ]
    data_root.write_parquet(layout.alignment_scores("s"), pa.Table.from_pylist(scores, schema=UTTERANCE_SCORES_SCHEMA))
    index = pa.table({"utt_id": ["heard", "landed", "unaligned"], "text": [None, "b a", ""]})
    filled = with_text_sources(data_root, "s", index).to_pylist()
    assert filled == [
        {"utt_id": "heard", "text": "ab", "text_source": "asr", "asr_confidence": pytest.approx(0.8)},
        {"utt_id": "landed", "text": "b a", "text_source": "landed", "asr_confidence": None},
        {"utt_id": "unaligned", "text": "", "text_source": "landed", "asr_confidence": None},
    ]
    # A shard aligned before pseudo-labels existed (or imported): landed text only.
    assert with_text_sources(data_root, "other", index)["text_source"].to_pylist() == ["landed"] * 3
