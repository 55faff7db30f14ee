"""Chunk-to-word matching, the conservative emission timeline and bilingual segments (Granary)."""

import json

import pytest

from speechdata.alignment.table import TimedUnit
from speechdata.translation.segmentation_input import (
    LATENCY_LEVELS,
    LevelChunks,
    Segmentation,
    SegmentationError,
    read_segmentation,
    segmentation_json,
)
from speechdata.translation.segments import (
    emission_step,
    level_segments,
    match_chunks,
    normalize_tokens,
    utterance_document,
    utterance_segments,
)


def words(*spec):
    """``("which", 0, 110), ...`` -> TimedUnits."""
    return [TimedUnit(text, start, end) for text, start, end in spec]


# The original segmenter's worked example: "which sites have you been using ..." with word times such that
# "which" is 0.0-0.11 and "sites" 0.11-0.45 as in its chunk table.
SEED_WORDS = words(
    ("Which", 0, 110),
    ("sites", 110, 450),
    ("have", 450, 600),
    ("you", 600, 720),
    ("been", 720, 980),
    ("using?", 1020, 1500),
    ("How", 2050, 2200),
    ("did", 2200, 2400),
    ("the", 2400, 2600),
)
SEED_CHUNKS = ["which", "sites", "have", "you", "been", "using", "how", "did", "the"]
SEED_CHINESE = ["哪些", "网站", "有", "你", "一直", "在用", "怎么", "是", "那个"]


def test_seed_worked_example_reproduces_its_emission_timeline():
    result = level_segments("low_latency", LevelChunks(tuple(SEED_CHUNKS), tuple(SEED_CHINESE)), SEED_WORDS)
    timeline = [
        {"second": s.emit_ms // 1000, "emit": SEED_CHUNKS[s.first_chunk : s.last_chunk + 1]} for s in result.segments
    ]
    assert timeline == [
        {"second": 0, "emit": ["which", "sites", "have", "you", "been"]},
        {"second": 1, "emit": ["using"]},
        {"second": 2, "emit": ["how", "did", "the"]},
    ]
    assert [(t.chunk, t.start_ms, t.end_ms) for t in result.timings[:2]] == [("which", 0, 110), ("sites", 110, 450)]
    assert [s.source for s in result.segments] == ["which sites have you been", "using", "how did the"]
    assert [s.target for s in result.segments] == ["哪些网站有你一直", "在用", "怎么是那个"]


def test_emission_rule_is_end_at_or_before_second_plus_step():
    assert [emission_step(end, 1000) for end in (0, 1, 999, 1000, 1001, 2000, 2001)] == [0, 0, 0, 0, 1, 1, 2]
    assert [emission_step(end, 500) for end in (500, 501, 1000, 1001)] == [0, 1, 1, 2]


def test_repeated_words_land_on_their_own_occurrence():
    spoken = words(("the", 0, 200), ("cat", 200, 500), ("saw", 1500, 1800), ("the", 1800, 1900), ("cat", 1900, 2300))
    timings = match_chunks(["the cat", "saw", "the cat"], spoken)
    assert [(t.start_ms, t.end_ms, t.match) for t in timings] == [
        (0, 500, "exact"),
        (1500, 1800, "exact"),
        (1800, 2300, "exact"),
    ]
    # The original segmenter's "any word that matches" would give the second "the cat" the span 0-2300.


def test_normalization_ignores_case_punctuation_and_hyphenation():
    assert normalize_tokens("Well-known, isn't it?!") == ["wellknown", "isnt", "it"]
    spoken = words(("Well-known", 0, 400), ("sites,", 400, 800), ("Right?", 900, 1200))
    timings = match_chunks(["well known sites", "right"], spoken)
    assert [(t.first_word, t.last_word, t.match) for t in timings] == [(0, 1, "exact"), (2, 2, "exact")]


def test_unmatched_chunk_has_no_times_and_is_emitted_with_the_next_matched_chunk():
    spoken = words(("we", 0, 300), ("went", 300, 700), ("home", 1600, 2100), ("today", 2900, 3300))
    chunks = LevelChunks(("we went", "uh well", "home", "today"), ("我们去了", "嗯", "回家", "今天"))
    result = level_segments("low_latency", chunks, spoken)
    unmatched = result.timings[1]
    assert (unmatched.start_ms, unmatched.end_ms, unmatched.match) == (None, None, "none")
    assert result.steps == [0, 2, 2, 3]
    assert [(s.emit_ms, s.source, s.target, s.n_unmatched) for s in result.segments] == [
        (0, "we went", "我们去了", 0),
        (2000, "uh well home", "嗯回家", 1),
        (3000, "today", "今天", 0),
    ]


def test_trailing_unmatched_chunks_wait_for_the_last_aligned_word():
    spoken = words(("hello", 0, 400), ("there", 400, 900), ("friend", 900, 2600))
    result = level_segments("low_latency", LevelChunks(("hello", "pal"), ("你好", "伙计")), spoken)
    assert result.steps == [0, 2]


def test_skipped_filler_words_and_partial_rewrites_still_place_chunks():
    spoken = words(("I", 0, 100), ("um", 100, 400), ("bought", 400, 800), ("2", 800, 900), ("apples", 900, 1400))
    timings = match_chunks(["I", "bought", "two apples"], spoken)
    assert [(t.first_word, t.last_word, t.match) for t in timings] == [
        (0, 0, "exact"),
        (2, 2, "skip"),
        (4, 4, "partial"),
    ]


def test_one_rewritten_chunk_does_not_strand_the_rest_of_the_utterance():
    spoken = words(*[(f"w{i}", 100 * i, 100 * i + 90) for i in range(40)])
    # The LLM rewrote words w2..w11 as ten tokens the transcript does not have: the next chunk lies
    # ten words past the cursor, beyond max_skip_words, and is found because the window widened.
    chunks = ["w0 w1", " ".join(f"x{i}" for i in range(10)), *[f"w{i}" for i in range(12, 40)]]
    timings = match_chunks(chunks, spoken, max_skip_words=4)
    assert timings[1].match == "none"
    assert (timings[2].first_word, timings[2].match) == (12, "skip")
    assert all(t.match == "exact" for t in timings[3:])


def test_chunk_spanning_a_second_boundary_is_emitted_when_it_ends():
    spoken = words(("over", 700, 950), ("the", 950, 1100), ("boundary", 1100, 1700), ("now", 1800, 2000))
    result = level_segments("low_latency", LevelChunks(("over the boundary", "now"), ("越过边界", "现在")), spoken)
    assert (result.timings[0].start_ms, result.timings[0].end_ms) == (700, 1700)
    assert [(s.emit_ms, s.source) for s in result.segments] == [(1000, "over the boundary now")]


def test_empty_utterance_gives_empty_segment_lists():
    empty = Segmentation({level: LevelChunks((), ()) for level in LATENCY_LEVELS})
    levels = utterance_segments(empty, [])
    document = utterance_document("u", "", levels, 1000)
    for level in LATENCY_LEVELS:
        assert document[f"source_{level}"] == document[f"target_{level}"] == document[f"chunks_{level}"] == []


def test_chinese_is_concatenated_without_spaces_and_english_with_single_spaces():
    spoken = words(("good", 0, 300), ("morning", 300, 700), ("everyone", 700, 950))
    chunks = LevelChunks(("good morning ", " everyone"), (" 早上好 ", "，各位"))
    [segment] = level_segments("high_latency", chunks, spoken).segments
    assert segment.source == "good morning everyone"
    assert segment.target == "早上好，各位"
    assert " " not in segment.target


def test_document_has_the_seed_fields_for_every_level():
    seg = Segmentation({level: LevelChunks(tuple(SEED_CHUNKS), tuple(SEED_CHINESE)) for level in LATENCY_LEVELS})
    document = utterance_document(
        "utt_000123", "Which sites have you been using?", utterance_segments(seg, SEED_WORDS), 1000
    )
    for level in LATENCY_LEVELS:
        assert (
            len(document[f"source_{level}"])
            == len(document[f"target_{level}"])
            == len(document[f"emit_s_{level}"])
            == 3
        )
    assert document["chunks_low_latency"][0] == {
        "chunk": "which",
        "translation": "哪些",
        "start": 0.0,
        "end": 0.11,
        "emit_s": 0.0,
        "match": "exact",
    }
    assert json.loads(json.dumps(document, ensure_ascii=False)) == document


@pytest.mark.parametrize(
    "document, reason",
    [
        ("{not json", "segmentation_malformed_json"),
        ("[]", "segmentation_not_an_object"),
        ('{"low_latency": {"English": [], "Chinese": []}}', "segmentation_missing_level"),
        ('{"low_latency": {"English": []}, "medium_latency": {}, "high_latency": {}}', "segmentation_missing_language"),
        (
            '{"low_latency": {"English": "a b", "Chinese": []}, "medium_latency": {}, "high_latency": {}}',
            "segmentation_not_a_string_list",
        ),
        (
            '{"low_latency": {"English": ["a", "b"], "Chinese": ["甲"]}, "medium_latency": {}, "high_latency": {}}',
            "segmentation_unequal_lengths",
        ),
    ],
)
def test_malformed_segmentation_is_an_error_with_a_reason(document, reason):
    with pytest.raises(SegmentationError) as caught:
        read_segmentation(document.encode(), "u.json")
    assert caught.value.reason == reason
    assert "u.json" in str(caught.value)


def test_segmentation_json_round_trips():
    seg = Segmentation({level: LevelChunks(("a", "b"), ("甲", "乙")) for level in LATENCY_LEVELS})
    assert read_segmentation(segmentation_json(seg).encode("utf-8-sig"), "x") == seg
