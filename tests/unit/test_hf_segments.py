"""WER with empty strings, and the segment filters of the published dataset."""

import pyarrow as pa
import pytest

from speechdata.hf.segments import SEGMENT_SCHEMA, SegmentLimits, filter_reasons, word_error_rate


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


def test_filters_name_the_first_reason_that_applies():
    rows = [
        {"duration_s": 2.99, "cer": 0.0},
        {"duration_s": 3.0, "cer": 0.5},
        {"duration_s": 20.01, "cer": 0.0},
        {"duration_s": 10.0, "cer": 0.31},
        {"duration_s": 10.0, "cer": None},
        {"duration_s": 20.0, "cer": 0.3},
    ]
    table = pa.Table.from_pylist(
        rows, schema=pa.schema([SEGMENT_SCHEMA.field("duration_s"), SEGMENT_SCHEMA.field("cer")])
    )
    assert filter_reasons(table, SegmentLimits(3.0, 20.0, max_cer=0.3)) == [
        "too_short",
        "cer_above_max",
        "too_long",
        "cer_above_max",
        None,
        None,
    ]
    assert filter_reasons(table, SegmentLimits(3.0, 20.0, max_cer=None))[1] is None
