"""Quality decisions from constructed inputs: greedy CTC decoding, model filters, presets, near duplicates."""

import numpy as np
import pyarrow as pa
import pytest

from speechdata.alignment.greedy import greedy_transcript, normalized_reference
from speechdata.alignment.transcript_units import CharVocabulary
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.decisions import excluded_utterances
from speechdata.quality.paths import near_duplicates, quality_decisions
from speechdata.quality.policy import PRESETS, QualityPolicy, decide, default_policies, policies_digest
from speechdata.quality.schema import QUALITY_DECISIONS_SCHEMA

VOCABULARY = CharVocabulary(["a", "b", " "])


def one_hot_log_probs(labels: list[int], classes: int = 4) -> np.ndarray:
    log_probs = np.full((len(labels), classes), -10.0, np.float32)
    log_probs[np.arange(len(labels)), labels] = 0.0
    return log_probs


def test_greedy_decoding_merges_repeats_drops_blanks_and_splits_words_on_the_separator():
    blank, a, b, space = VOCABULARY.blank_id, 0, 1, 2
    log_probs = one_hot_log_probs([blank, a, a, blank, b, space, b, blank, a, a])
    assert greedy_transcript(log_probs, VOCABULARY) == "ab ba"
    assert greedy_transcript(one_hot_log_probs([a, blank, a]), VOCABULARY) == "aa"  # a blank separates repeats


class _PieceVocabulary:
    """SentencePiece-style pieces (the word start marked with U+2581, no separator token)."""

    pieces = ["\u2581the", "\u2581ca", "t", "\u2581sat"]
    blank_id = len(pieces)
    separator_id = None

    def token_text(self, token_id: int) -> str:
        return self.pieces[token_id]


def test_greedy_decoding_of_word_pieces_starts_each_word_afresh():
    # a word-start piece closes the word before; the words never accumulate what came before them,
    # which made a 5-minute recording's transcript 2.9 M characters long and the quality stage's CER
    # on it grow without bound
    vocabulary = _PieceVocabulary()
    the, ca, t, sat, blank = 0, 1, 2, 3, vocabulary.blank_id
    labels = [the, blank, ca, t, blank, sat] * 50
    transcript = greedy_transcript(one_hot_log_probs(labels, classes=5), vocabulary)
    assert transcript == " ".join(["the cat sat"] * 50)


def test_the_reference_is_normalized_through_the_aligners_vocabulary():
    assert normalized_reference("AB, Ba!  -", VOCABULARY) == "ab ba"


CLEAN_ROW = {
    "utt_id": "u",
    "language": "en",
    "silence_share": 0.3,
    "speech_share": 0.7,
    "clipped_share": 0.0,
    "bandwidth_hz": 11000.0,
    "snr_db": 40.0,
    "text_language": "en",
    "text_language_confidence": 0.99,
    "text_letters": 40,
    "cer": 0.05,
    "audio_language": "en",
    "audio_language_confidence": 0.9,
    "mos": 4.2,
}


def test_a_clean_row_passes_every_preset_of_both_profiles():
    for profile in ("tiny", "full"):
        for policy in default_policies(profile).values():
            assert decide(CLEAN_ROW, policy) is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"cer": 0.6}, "transcript_mismatch"),
        ({"audio_language": "de", "audio_language_confidence": 0.95}, "audio_language_mismatch"),
        ({"mos": 1.8}, "low_mos"),
    ],
)
def test_model_filters_reject_in_full_and_are_off_in_tiny(change, reason):
    row = {**CLEAN_ROW, **change}
    assert decide(row, default_policies("full")["bridge"])[0] == reason
    assert decide(row, default_policies("tiny")["bridge"]) is None


def test_an_unsure_or_short_text_language_guess_never_rejects():
    wrong, policy = {**CLEAN_ROW, "text_language": "de"}, QualityPolicy().without_model_filters()
    assert decide(wrong, policy)[0] == "language_mismatch"
    assert decide({**wrong, "text_language_confidence": 0.5}, policy) is None
    assert decide({**wrong, "text_letters": 5}, policy) is None
    assert decide({**wrong, "language": "de-AT"}, policy) is None  # the primary subtag is compared


def test_the_detail_names_every_failed_filter_with_value_and_limit():
    reason, detail = decide({**CLEAN_ROW, "bandwidth_hz": 3900.0, "snr_db": 3.0}, PRESETS["bridge"])
    assert reason == "narrowband"
    assert "3900 Hz < 5000 Hz" in detail and "low_snr" in detail and "< 15 dB" in detail


def test_overrides_change_the_digest_and_unknown_names_are_refused():
    changed = {**PRESETS, "bridge": PRESETS["bridge"].with_overrides({"max_cer": 0.5}, ["narrowband"])}
    assert changed["bridge"].max_cer == 0.5 and changed["bridge"].min_bandwidth_hz is None
    assert policies_digest(changed) != policies_digest(PRESETS)
    with pytest.raises(ValueError, match="max_ser"):
        QualityPolicy().with_overrides({"max_ser": 0.1})
    with pytest.raises(ValueError, match="loud"):
        QualityPolicy().with_overrides({}, ["loud"])


def test_excluded_utterances_reads_the_products_decisions_and_the_near_duplicates(tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    rows = [
        {"utt_id": "a", "product": "bridge", "reason": "clipped", "detail": "x", "policy_sha256": "d"},
        {"utt_id": "a", "product": "asr", "reason": None, "detail": None, "policy_sha256": "d"},
        {"utt_id": "b", "product": "bridge", "reason": None, "detail": None, "policy_sha256": "d"},
    ]
    root.write_parquet(quality_decisions("s1"), pa.Table.from_pylist(rows, schema=QUALITY_DECISIONS_SCHEMA))
    assert excluded_utterances(root, "s1", "asr") == {}
    root.write_parquet(
        near_duplicates("s1"),
        pa.Table.from_pylist(
            [
                {
                    "utt_id": "a",
                    "representative_shard": "s0",
                    "representative_utt": "z",
                    "kind": "audio",
                    "similarity": 0.97,
                },
                {
                    "utt_id": "b",
                    "representative_shard": "s0",
                    "representative_utt": "y",
                    "kind": "text",
                    "similarity": 0.91,
                },
            ]
        ),
    )
    bridge = excluded_utterances(root, "s1", "bridge")
    assert bridge["a"][0] == "clipped"  # its own quality reason wins
    assert bridge["b"][0] == "near_duplicate" and "s0/y" in bridge["b"][1]
    assert excluded_utterances(root, "s1", "asr")["a"][0] == "near_duplicate"


def test_a_near_duplicate_list_without_its_columns_is_refused_naming_the_file(tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    root.write_parquet(near_duplicates("s1"), pa.table({"utt_id": ["a"]}))
    with pytest.raises(ValueError, match="near_duplicates.parquet.*representative_shard"):
        excluded_utterances(root, "s1", "bridge")


def test_a_recording_too_long_alone_is_published_as_its_segments_and_any_other_failure_keeps_it_out(tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    too_long = "duration_s 62.33 s > 30 s"
    rows = [
        {"utt_id": u, "product": p, "reason": "too_long", "detail": d, "policy_sha256": "d"}
        for u, d in [("talk", too_long), ("noisy", too_long + " (also low_snr: snr_db 2.0 < 5)"), ("whole", too_long)]
        for p in ("bridge", "asr", "translation")
    ]
    root.write_parquet(quality_decisions("s1"), pa.Table.from_pylist(rows, schema=QUALITY_DECISIONS_SCHEMA))
    assert set(excluded_utterances(root, "s1", "bridge")) == {"talk", "noisy", "whole"}  # not aligned yet
    segments = [
        {"utt_id": u, "level": level, "index": i}
        for u in ("talk", "noisy", "whole")
        for level, i in [("word", 0), ("segment", 0), ("segment", 1)]
        if level == "word" or u != "whole"
    ]
    root.write_parquet(layout.alignments("s1"), pa.Table.from_pylist(segments))
    for product in ("bridge", "asr"):
        assert set(excluded_utterances(root, "s1", product)) == {"noisy", "whole"}
    assert set(excluded_utterances(root, "s1", "translation")) == {"talk", "noisy", "whole"}
