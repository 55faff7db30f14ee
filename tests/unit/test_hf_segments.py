"""WER with empty strings, the segment filters of the published dataset (near duplicates included)."""

import pyarrow as pa
import pytest

from speechdata.hf.segments import (
    EMPTY_INPUT_FINGERPRINT,
    SEGMENT_SCHEMA,
    SegmentLimits,
    filter_reasons,
    segments_fingerprint,
    word_error_rate,
)


@pytest.mark.parametrize(
    ("reference", "hypothesis", "expected"),
    [
        ("the cat sat", "the cat sat", 0.0),
        ("the cat sat", "the sat", 1 / 3),
        ("the cat sat", "the dog sat down", 2 / 3),
        ("", "", 0.0),
        ("  ", "", 0.0),
        ("", "words appeared", 1.0),
        ("words vanished", "", 1.0),
        (None, "only asr", 1.0),
        ("human only", None, None),
    ],
)
def test_word_error_rate_handles_empty_strings(reference, hypothesis, expected):
    result = word_error_rate(reference, hypothesis)
    assert result == (None if expected is None else pytest.approx(expected))


def segment(**values) -> dict:
    """A segment with every published field filled; ``values`` override."""
    filled = {
        "language": "de",
        "human_text": "hallo welt",
        "asr_text": "hallo welt",
        "cer": 0.0,
        "transcript_id": "t0",
        "transcript_start_idx": 0,
        "transcript_end_idx": 10,
        "duration_s": 10.0,
    }
    return {**filled, **values}


def segments_table(rows: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SEGMENT_SCHEMA)


def test_filters_name_the_first_reason_that_applies():
    rows = [
        segment(duration_s=2.99, cer=0.0),
        segment(duration_s=3.0, cer=0.5),
        segment(duration_s=20.01, cer=0.0),
        segment(duration_s=10.0, cer=0.31),
        segment(duration_s=10.0, cer=None),
        segment(duration_s=20.0, cer=0.3),
    ]
    table = segments_table(rows)
    assert filter_reasons(table, SegmentLimits(3.0, 20.0, max_cer=0.3)) == [
        "too_short",
        "cer_above_max",
        "too_long",
        "cer_above_max",
        "missing_cer",
        None,
    ]
    assert filter_reasons(table, SegmentLimits(3.0, 20.0, max_cer=None))[1] is None


def test_a_segment_lacking_a_published_field_is_filtered_naming_the_field():
    table = segments_table(
        [
            segment(asr_text=None),
            segment(language=None, duration_s=1.0),
            segment(transcript_end_idx=None),
            segment(),
        ]
    )
    assert filter_reasons(table, SegmentLimits()) == [
        "missing_asr_text",
        "missing_language",
        "missing_transcript_end_idx",
        None,
    ]


def test_a_near_duplicate_is_filtered_by_shard_and_key_after_the_reasons_it_fails_on_its_own():
    table = segments_table(
        [
            segment(shard_id="later", key="utt_1"),
            segment(shard_id="earlier", key="utt_1"),  # the same key in another shard is no copy
            segment(shard_id="later", key="utt_2", duration_s=1.0),
            segment(shard_id="later", key="utt_3"),
        ]
    )
    copies = {("later", "utt_1"), ("later", "utt_2"), ("elsewhere", "utt_3")}
    assert filter_reasons(table, SegmentLimits(), copies) == ["near_duplicate", None, "too_short", None]
    assert segments_fingerprint(table, copies) != segments_fingerprint(table)
    assert segments_fingerprint(table, {("elsewhere", "utt_3")}) == segments_fingerprint(table)


def test_the_empty_input_fingerprint_is_that_of_an_empty_segments_table():
    """Computed at import without building a table; a country whose rows are all withdrawn compares
    equal to it, and one with a row does not."""
    assert segments_fingerprint(SEGMENT_SCHEMA.empty_table()) == EMPTY_INPUT_FINGERPRINT
    assert segments_fingerprint(segments_table([segment()])) != EMPTY_INPUT_FINGERPRINT


def test_a_pseudo_label_needs_no_human_text_and_is_filtered_below_the_confidence_threshold():
    rows = [
        segment(human_text=None, text="heard words", text_source="asr", asr_confidence=0.8),
        segment(human_text=None, text="heard words", text_source="asr", asr_confidence=0.69),
        segment(human_text=None, text="heard words", text_source="asr", asr_confidence=None),
        segment(human_text=None, text=" ", text_source="asr", asr_confidence=0.9),
        segment(human_text="  ", text_source="landed"),  # blank and not transcribed (yet)
        segment(human_text=None, text_source="landed"),
        segment(text="hallo welt", text_source="landed", asr_confidence=None),
    ]
    table = segments_table(rows)
    assert filter_reasons(table, SegmentLimits(3.0, 20.0, min_asr_confidence=0.7)) == [
        None,
        "low_asr_confidence",
        "low_asr_confidence",
        "missing_text",
        "missing_human_text",
        "missing_human_text",
        None,
    ]
    assert filter_reasons(table, SegmentLimits(3.0, 20.0, min_asr_confidence=None))[:3] == [None, None, None]
    assert SegmentLimits().min_asr_confidence == 0.7  # the quality policy's threshold
    with pytest.raises(ValueError, match="min_asr_confidence"):
        SegmentLimits(min_asr_confidence=float("nan"))
