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


def test_the_small_models_word_delimiter_splits_pseudo_labels_and_greedy_transcripts_into_words():
    """The small model's letters carry wav2vec2's ``|`` between words (a token of its tokenizer, not a
    space): targets put it between words, greedy decoding and pseudo-labels split on it."""
    from speechdata.alignment.greedy import greedy_transcript, normalized_reference
    from speechdata.alignment.train_small import char_tokenizer
    from speechdata.alignment.transcript_units import WORD_DELIMITER, SubwordVocabulary, ctc_targets

    tokenizer = char_tokenizer()
    vocabulary = SubwordVocabulary(tokenizer, tokenizer.pad_token_id)
    assert vocabulary.separator_id == tokenizer.convert_tokens_to_ids(WORD_DELIMITER)
    assert vocabulary.marks_word_boundaries and WORD_DELIMITER not in vocabulary.characters
    targets = ctc_targets("Hi, 12 you", vocabulary, "en")
    assert [vocabulary.token_text(t) for t in targets.targets] == list("hi|twelve|you")
    assert targets.word_target_ranges == [(0, 2), (3, 9), (10, 13)]
    assert normalized_reference("Hi, 12 you", vocabulary, "en") == "hi twelve you"

    classes = len(tokenizer)
    frames = [vocabulary.blank_id, *targets.targets[:3], vocabulary.separator_id, *targets.targets[3:]]
    log_probs = np.full((len(frames), classes), np.log(0.1 / (classes - 1)), dtype=np.float32)
    log_probs[np.arange(len(frames)), frames] = np.log(0.9)
    label = pseudo_label(log_probs, vocabulary)
    assert label.words == ["hi", "twelve", "you"]
    assert label.confidence == pytest.approx(0.9, abs=1e-5)
    assert greedy_transcript(log_probs, vocabulary) == "hi twelve you"


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


def test_a_pseudo_labelled_utterance_reaches_the_bridge_and_asr_products_marked_asr(tmp_path):
    import polars as pl

    from speechdata.asr.flac import ASR_FLAC_INDEX_SCHEMA
    from speechdata.asr.manifest import build_asr_manifest
    from speechdata.asr.stage import read_asr_inputs
    from speechdata.bridge.shard_manifest import build_shard_manifest
    from speechdata.bridge.tars import iter_bridge_samples, pack_samples
    from speechdata.testing.packing_inputs import write_packing_inputs

    data_root = DataRoot(str(tmp_path))
    heard, landed = write_packing_inputs(data_root, "s", 2, seconds=2.0, qwen_dim=8, wavlm_dim=8, pool=2)
    index = data_root.read_parquet(layout.utterance_index("s")).to_pylist()
    index[0]["text"] = None  # landed without text
    data_root.write_parquet(layout.utterance_index("s"), pa.Table.from_pylist(index))
    score = {"aligner": "m", "score": -1.0, "n_words": 2, "n_frames": 25}
    scores = [
        {**score, "utt_id": heard, "text_source": "asr", "asr_text": "heard words", "asr_confidence": 0.75},
        {**score, "utt_id": landed, "text_source": "landed"},
    ]
    data_root.write_parquet(layout.alignment_scores("s"), pa.Table.from_pylist(scores, schema=UTTERANCE_SCORES_SCHEMA))

    samples = list(iter_bridge_samples(data_root, "s"))
    info = {s.key: s.info for s in samples}
    assert (info[heard]["text"], info[heard]["text_source"]) == ("heard words", "asr")
    assert info[heard]["asr_confidence"] == pytest.approx(0.75)
    assert info[landed]["text_source"] == "landed" and info[landed]["text"] == index[1]["text"]
    _, packed = pack_samples(data_root, "s", iter(samples), max_tar_bytes=2_000_000)
    manifest = {r["key"]: r for r in build_shard_manifest(data_root, "s", packed).to_pylist()}
    assert (manifest[heard]["text"], manifest[heard]["text_source"]) == ("heard words", "asr")
    assert manifest[heard]["asr_confidence"] == pytest.approx(0.75)
    assert (manifest[landed]["text_source"], manifest[landed]["asr_confidence"]) == ("landed", None)

    flac = [
        {"utt_id": key, "flac_path": f"asr/flac/s/{key}.flac", "sample_rate": 16_000, "n_samples": 32_000}
        for key in (heard, landed)
    ]
    flac = [{**row, "duration_s": 2.0, "audio_sha1": f"sha-{row['utt_id']}"} for row in flac]
    data_root.write_parquet(layout.asr_flac_index("s"), pa.Table.from_pylist(flac, schema=ASR_FLAC_INDEX_SCHEMA))
    utterances, flac_rows = read_asr_inputs(data_root, ["s"])
    build = build_asr_manifest(utterances, flac_rows, audio_root="/")
    rows = pl.concat([build.train, build.validation]).to_dicts()
    assert {r["utt_id"]: r["text_source"] for r in rows} == {heard: "asr", landed: "landed"}
    assert next(r["text"] for r in rows if r["utt_id"] == heard) == "<|en|> heard words"  # tagged like any text


def test_landing_accepts_missing_or_blank_text_and_still_rejects_punctuation_only_text():
    from speechdata.landing.contract import CONTRACT_FIELDS, check_rows

    rows = [
        {"utt_id": "missing", "audio_path": "a.wav", "text": None},
        {"utt_id": "blank", "audio_path": "a.wav", "text": "  "},
        {"utt_id": "dashes", "audio_path": "a.wav", "text": "-- !"},
        {"utt_id": "number", "audio_path": "a.wav", "text": "1984"},
    ]
    checked = check_rows(pa.Table.from_pylist(rows, schema=pa.schema(CONTRACT_FIELDS)), "raw_shards")
    assert [rows[i]["utt_id"] for i in checked.valid_rows] == ["missing", "blank", "number"]
    assert [(r.utt_id, r.reason) for r in checked.rejects] == [("dashes", "no_words")]
