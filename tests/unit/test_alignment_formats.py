import json
from pathlib import Path

import pytest

from speechdata.alignment.formats import (
    AlignmentFormatError,
    aligned_json_ids,
    aligned_json_rows,
    alignment_rows_by_utterance,
    read_aligned_json,
    read_ctm,
    read_textgrid,
    segment_units,
    write_ctm,
)
from speechdata.alignment.table import TimedUnit, alignments_table

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "alignments"
ALIGNED_JSON = "xk_9a_B-c3_t0042_aligned.json"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def spans(units: list[TimedUnit]) -> list[tuple[str, int, int]]:
    return [(u.text, u.start_ms, u.end_ms) for u in units]


# --- CTM -------------------------------------------------------------------------------------------


def test_nfa_word_ctm_gives_exact_ms():
    units = read_ctm(fixture_text("nfa_words.ctm"), "nfa_words.ctm", "word")
    assert list(units) == ["en_0001"]
    assert spans(units["en_0001"]) == [("hello", 320, 560), ("world", 640, 1040), ("again", 2325, 2405)]
    assert all(u.score is None for u in units["en_0001"])


def test_five_column_ctm_rounds_half_up_skips_comments_and_groups_in_file_order():
    units = read_ctm(fixture_text("words_5col.ctm"), "words_5col.ctm", "word")
    assert list(units) == ["utt_a", "utt_b"]
    # 0.0005 s -> 1 ms and 0.0015 s -> 2 ms: half up, not half to even.
    assert spans(units["utt_a"]) == [("oh", 1, 2), ("yes", 1235, 1735)]
    assert spans(units["utt_b"]) == [("no", 3000, 3250)]


def test_nfa_token_ctm_skips_blank_and_space_tokens():
    units = read_ctm(fixture_text("nfa_tokens.ctm"), "nfa_tokens.ctm", "token")
    assert spans(units["en_0002"]) == [
        ("h", 80, 160),
        ("i", 160, 240),
        ("y", 480, 560),
        ("o", 560, 640),
        ("u", 640, 720),
    ]


def test_nfa_segment_ctm_turns_space_marker_back_into_spaces():
    units = read_ctm(fixture_text("nfa_segments.ctm"), "nfa_segments.ctm", "segment")
    assert spans(units["en_0001"]) == [("hello world", 320, 1040)]


def test_ctm_with_six_columns_names_file_and_line():
    with pytest.raises(AlignmentFormatError) as caught:
        read_ctm(fixture_text("bad_columns.ctm"), "bad_columns.ctm", "word")
    error = caught.value
    assert isinstance(error, ValueError)
    assert (error.source, error.line) == ("bad_columns.ctm", 3)
    assert "found 6" in error.message
    assert str(error).startswith("bad_columns.ctm:3: ")


def test_ctm_negative_duration_names_line_counting_blank_lines():
    with pytest.raises(AlignmentFormatError) as caught:
        read_ctm(fixture_text("negative_duration.ctm"), "negative_duration.ctm", "word")
    assert (caught.value.source, caught.value.line) == ("negative_duration.ctm", 3)
    assert "duration" in caught.value.message and "negative" in caught.value.message


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("u 1 -0.10 0.20 w", "start '-0.10' is negative"),
        ("u 1 abc 0.20 w", "start 'abc' is not a number"),
        ("u 1 0.10 nan w", "duration 'nan' is not finite"),
        ("u 1 0.10", "found 3"),
        ("u 1 0.10 0.20 w NA lex NA extra", "found 9"),
    ],
)
def test_bad_ctm_lines_name_the_line(line, problem):
    text = ";; header\nu 1 0.00 0.10 ok\n" + line + "\n"
    with pytest.raises(AlignmentFormatError) as caught:
        read_ctm(text, "x.ctm", "word")
    assert caught.value.line == 3
    assert problem in caught.value.message


def test_ctm_interleaved_utterances_group_by_first_appearance():
    text = "b 1 0.00 0.10 one\na 1 0.00 0.20 two\nb 1 0.10 0.10 three\n"
    units = read_ctm(text, "x.ctm", "word")
    assert list(units) == ["b", "a"]
    assert [u.text for u in units["b"]] == ["one", "three"]


def test_ctm_utterance_of_only_blanks_maps_to_no_units():
    assert read_ctm("u 1 0.00 0.40 <b> NA lex NA\n", "x.ctm", "token") == {"u": []}


def test_read_ctm_rejects_unknown_level():
    with pytest.raises(ValueError, match="level"):
        read_ctm("u 1 0 0.1 w\n", "x.ctm", "phone")


def test_write_ctm_writes_nfa_eight_column_lines():
    units = [TimedUnit("hello", 320, 560), TimedUnit("world", 640, 1040)]
    assert write_ctm("en_0001", units, "word") == (
        "en_0001 1 0.32 0.24 hello NA lex NA\nen_0001 1 0.64 0.40 world NA lex NA\n"
    )


def test_write_ctm_rounds_to_centiseconds_half_up_and_keeps_end_exact():
    # "%.2f" % 2.325 would give 2.32; the end 2.41 is start + duration after rounding.
    assert write_ctm("u", [TimedUnit("w", 2325, 2405)], "word") == "u 1 2.33 0.08 w NA lex NA\n"


def test_write_then_read_ctm_round_trips_ten_ms_multiples():
    units = [TimedUnit(f"w{i}", 10 * i * i, 10 * i * i + 10 * (i % 7)) for i in range(200)]
    back = read_ctm(write_ctm("utt-7", units, "word"), "round_trip.ctm", "word")
    assert back == {"utt-7": units}


def test_write_ctm_escapes_spaces_for_segments_and_reads_them_back():
    text = write_ctm("u", [TimedUnit("hello world", 0, 1000)], "segment")
    assert text == "u 1 0.00 1.00 hello<space>world NA lex NA\n"
    assert spans(read_ctm(text, "u.ctm", "segment")["u"]) == [("hello world", 0, 1000)]


def test_write_ctm_refuses_utt_id_with_whitespace():
    with pytest.raises(ValueError, match="utt_id"):
        write_ctm("a b", [TimedUnit("w", 0, 10)], "word")


def test_ctm_units_become_alignment_table_rows():
    units = read_ctm(fixture_text("words_5col.ctm"), "words_5col.ctm", "word")
    table = alignments_table(alignment_rows_by_utterance(units, "word"))
    assert table.column("utt_id").to_pylist() == ["utt_a", "utt_a", "utt_b"]
    assert table.column("index").to_pylist() == [0, 1, 0]
    assert table.column("start_ms").to_pylist() == [1, 1235, 3000]
    assert table.column("score").null_count == 3


# --- TextGrid --------------------------------------------------------------------------------------


def long_textgrid(tiers: list[tuple[str, list[tuple[float, float, str]]]], xmax: float = 2.0) -> str:
    """A long-format TextGrid as MFA writes it, for edge cases the fixtures don't cover."""
    lines = [
        'File type = "ooTextFile"',
        'Object class = "TextGrid"',
        "",
        "xmin = 0 ",
        f"xmax = {xmax} ",
        "tiers? <exists> ",
        f"size = {len(tiers)} ",
        "item []: ",
    ]
    for t, (name, intervals) in enumerate(tiers, start=1):
        lines += [
            f"    item [{t}]:",
            '        class = "IntervalTier" ',
            f'        name = "{name}" ',
            "        xmin = 0 ",
            f"        xmax = {xmax} ",
            f"        intervals: size = {len(intervals)} ",
        ]
        for i, (start, end, label) in enumerate(intervals, start=1):
            lines += [
                f"        intervals [{i}]:",
                f"            xmin = {start} ",
                f"            xmax = {end} ",
                f'            text = "{label}" ',
            ]
    return "\n".join(lines) + "\n"


def test_mfa_textgrid_one_speaker_from_path():
    units = read_textgrid(FIXTURES / "mfa_one_speaker.TextGrid")
    assert spans(units) == [("the", 310, 740), ("cat", 740, 1235), ("sat", 1500, 2900)]


def test_mfa_textgrid_from_text_gives_same_words():
    text = fixture_text("mfa_one_speaker.TextGrid")
    assert read_textgrid(text, "mfa_one_speaker.TextGrid") == read_textgrid(FIXTURES / "mfa_one_speaker.TextGrid")


def test_mfa_textgrid_two_speakers_merge_in_time_order_ties_by_speaker():
    units = read_textgrid(fixture_text("mfa_two_speakers.TextGrid"), "two.TextGrid")
    # "morning" (spk1) and "hi" (spk2) both start at 1000 ms: spk1's tier comes first.
    assert spans(units) == [
        ("good", 500, 1000),
        ("morning", 1000, 1500),
        ("hi", 1000, 1400),
        ("there", 1600, 2250),
        ("bye", 3000, 4000),
    ]


def test_textgrid_silence_labels_are_not_units():
    text = long_textgrid([("words", [(0, 0.2, "sil"), (0.2, 0.4, "sp"), (0.4, 0.6, "<eps>"), (0.6, 0.8, "a")])])
    assert spans(read_textgrid(text, "s.TextGrid")) == [("a", 600, 800)]


def test_textgrid_without_words_tier_names_file_and_tiers():
    with pytest.raises(AlignmentFormatError) as caught:
        read_textgrid(FIXTURES / "no_words_tier.TextGrid")
    error = caught.value
    assert error.source == str(FIXTURES / "no_words_tier.TextGrid")
    assert error.line is None
    assert "no 'words'" in error.message and "'phones'" in error.message


@pytest.mark.parametrize("text", ["", "just some words\n", "1 0.0 0.5 hello\n"])
def test_non_textgrid_text_is_an_alignment_format_error(text):
    with pytest.raises(AlignmentFormatError) as caught:
        read_textgrid(text, "junk.TextGrid")
    assert caught.value.source == "junk.TextGrid"
    assert "ooTextFile" in caught.value.message


def test_truncated_textgrid_reports_praatio_problem():
    truncated = fixture_text("mfa_one_speaker.TextGrid").split("intervals [2]:")[0] + "intervals [2]:\n"
    with pytest.raises(AlignmentFormatError) as caught:
        read_textgrid(truncated, "cut.TextGrid")
    assert caught.value.source == "cut.TextGrid"
    assert "ParsingError" in caught.value.message


def test_textgrid_overlapping_words_is_an_error():
    text = long_textgrid([("words", [(0, 0.5, "a"), (0.4, 0.8, "b")])])
    with pytest.raises(AlignmentFormatError, match="overlap") as caught:
        read_textgrid(text, "overlap.TextGrid")
    assert caught.value.source == "overlap.TextGrid"


def test_textgrid_utf16_file_with_bom(tmp_path):
    path = tmp_path / "praat.TextGrid"
    path.write_text(long_textgrid([("words", [(0.1, 0.5, "straße")])]), encoding="utf-16")
    assert spans(read_textgrid(path, "praat.TextGrid")) == [("straße", 100, 500)]


def test_textgrid_text_needs_a_source_name():
    with pytest.raises(TypeError, match="source"):
        read_textgrid(fixture_text("mfa_one_speaker.TextGrid"))


# --- per-country aligned JSON ---------------------------------------------------------------------


def read_fixture_json(country: str = "de"):
    return read_aligned_json(fixture_text(ALIGNED_JSON), ALIGNED_JSON, country)


def test_aligned_json_segments_keep_fields_and_ids_from_file_name():
    first, second = read_fixture_json()
    assert (first.video_id, first.transcript_id) == ("xk_9a_B-c3", "t0042")
    assert first.audio_file == "/data/countries/germany/audio/xk_9a_B-c3.opus"
    assert (first.index, second.index) == (0, 1)
    # 12.3405 s rounds half up to 12341 ms; 24.0005 s to 24001 ms.
    assert (first.start_ms, first.end_ms) == (12341, 17020)
    assert (second.start_ms, second.end_ms) == (17500, 24001)
    assert first.asr_text == "guten morgen zusammen"
    assert first.human_text == "Guten Morgen zusammen."
    assert first.cer == pytest.approx(0.045)
    assert (second.cer, type(second.cer)) == (0.0, float)
    assert (first.start_idx, first.end_idx, second.start_idx, second.end_idx) == (0, 22, 23, 46)


def test_aligned_json_key_format():
    assert [s.key for s in read_fixture_json("de")] == [
        "de_xk_9a_B-c3_12341_17020",
        "de_xk_9a_B-c3_17500_24001",
    ]


def test_segment_unit_spans_its_own_audio():
    first, second = read_fixture_json()
    assert segment_units(first) == TimedUnit("Guten Morgen zusammen.", 0, 4679)
    assert segment_units(second) == TimedUnit("Wie geht es euch heute?", 0, 6501)


def test_aligned_json_rows_use_key_as_utterance():
    table = alignments_table(aligned_json_rows(read_fixture_json()))
    assert table.column("utt_id").to_pylist() == ["de_xk_9a_B-c3_12341_17020", "de_xk_9a_B-c3_17500_24001"]
    assert table.column("level").to_pylist() == ["segment", "segment"]
    assert table.column("end_ms").to_pylist() == [4679, 6501]


@pytest.mark.parametrize(
    ("source", "ids"),
    [
        ("abc_t1_aligned.json", ("abc", "t1")),
        ("/data/countries/x/Alignment/alignment_output/a_b_c_7_aligned.json", ("a_b_c", "7")),
    ],
)
def test_aligned_json_ids_split_at_last_underscore(source, ids):
    assert aligned_json_ids(source) == ids


@pytest.mark.parametrize("source", ["abc_aligned.json", "abc_t1.json", "_t1_aligned.json", "abc__aligned.json"])
def test_aligned_json_bad_file_names(source):
    with pytest.raises(AlignmentFormatError) as caught:
        aligned_json_ids(source)
    assert caught.value.source == source


def test_aligned_json_missing_segments():
    with pytest.raises(AlignmentFormatError) as caught:
        read_aligned_json(fixture_text("broken_t1_aligned.json"), "broken_t1_aligned.json", "de")
    assert caught.value.source == "broken_t1_aligned.json"
    assert caught.value.message == "'segments' missing"


def test_aligned_json_malformed_reports_json_line():
    with pytest.raises(AlignmentFormatError) as caught:
        read_aligned_json('{\n  "audio_file": "a.opus",\n  "segments": [,]\n}', "v_t_aligned.json", "de")
    assert caught.value.line == 3
    assert "malformed JSON" in caught.value.message


def segment(**overrides) -> dict:
    base = {"start": 1.0, "end": 2.0, "asr_text": "a", "human_text": "A", "cer": 0.1, "start_idx": 0, "end_idx": 1}
    base.update(overrides)
    return {key: value for key, value in base.items() if value is not ...}


def document(*segments: dict) -> str:
    return json.dumps({"audio_file": "v.opus", "segments": list(segments)})


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (segment(cer=...), "segments[1]: missing key 'cer'"),
        (segment(start=2.0), "segments[1]: start 2000 ms is not before end 2000 ms"),
        (segment(start=3.0), "segments[1]: start 3000 ms is not before end 2000 ms"),
        (segment(end=1.0004), "segments[1]: start 1000 ms is not before end 1000 ms"),
        (segment(start="1.0"), "segments[1]: 'start' has wrong type"),
        (segment(start_idx=True), "segments[1]: 'start_idx' has wrong type"),
        (segment(start=-1.0), "segments[1]: bad times"),
        ([1, 2], "segments[1]: not an object"),
    ],
)
def test_aligned_json_bad_segment_names_file_and_index(bad, problem):
    with pytest.raises(AlignmentFormatError) as caught:
        read_aligned_json(document(segment(start=5.0, end=6.0), bad), "v_t_aligned.json", "de")
    assert caught.value.source == "v_t_aligned.json"
    assert caught.value.message.startswith(problem)


def test_aligned_json_duplicate_keys_are_an_error():
    with pytest.raises(AlignmentFormatError, match=r"segments\[1\]: key 'de_v_1000_2000' repeats segments\[0\]"):
        read_aligned_json(document(segment(), segment(asr_text="b")), "v_t_aligned.json", "de")


def test_aligned_json_audio_file_must_be_a_string():
    with pytest.raises(AlignmentFormatError, match="'audio_file' not a str"):
        read_aligned_json(json.dumps({"audio_file": 3, "segments": []}), "v_t_aligned.json", "de")
