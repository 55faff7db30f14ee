"""The 12.5 Hz grid rule of docs/bridge-tuples.md on hand-computed cases, and its invariants on random input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speechdata.alignment.table import TimedUnit, seconds_to_ms
from speechdata.bridge.frame_grid import (
    SILENCE,
    GridError,
    build_frame_grid,
    check_grid_invariants,
    frame_grid_from_spans,
    n_frames_for,
    token_spans_ms,
)

S = 1920  # samples per frame


def chars(text: str) -> list[tuple[int, int]]:
    """One token per character (a character-level tokenizer)."""
    return [(i, i + 1) for i in range(len(text))]


def test_frame_count_is_ceil_of_samples_over_1920():
    assert n_frames_for(0) == 0
    assert n_frames_for(1) == 1
    assert n_frames_for(S) == 1
    assert n_frames_for(S + 1) == 2


def test_boundary_exactly_on_a_frame_center_goes_to_the_token_starting_there():
    # Centers at 40, 120, 200, 280 ms. Token 1 starts exactly on the center of frame 1.
    grid = frame_grid_from_spans([7, 8], [(0, 120), (120, 320)], 4 * S)
    assert grid.grid.tolist() == [0, 1, 1, 1]
    assert grid.dur.tolist() == [1, 3]


def test_the_2_32_second_case_rounds_instead_of_truncating():
    end_ms = seconds_to_ms(2.32)
    assert end_ms == 2320 and int(2.32 / 0.08) == 28
    grid = frame_grid_from_spans([5], [(0, end_ms)], 3 * 24_000)
    # Centers 40 .. 2280 (k = 0..28) are < 2320: 29 frames.
    assert grid.dur.tolist() == [29]


def test_leading_and_trailing_silence():
    grid = frame_grid_from_spans([3], [(500, 900)], 2 * 24_000)
    assert grid.n_frames == 25
    expected = [SILENCE] * 6 + [0] * 5 + [SILENCE] * 14  # centers 520..840 are in [500, 900)
    assert grid.grid.tolist() == expected
    assert grid.silence_frames == 20


def test_final_partial_frame_counts_and_is_owned_only_if_its_center_is_covered():
    n_samples = 3 * S + 100  # F = 4; the last frame's center is 280 ms
    short = frame_grid_from_spans([1], [(0, 244)], n_samples)
    assert short.n_frames == 4 and short.grid.tolist() == [0, 0, 0, SILENCE]
    long = frame_grid_from_spans([1], [(0, 300)], n_samples)
    assert long.grid.tolist() == [0, 0, 0, 0]


def test_one_token_utterance():
    text = "hi"
    grid = build_frame_grid(text, [TimedUnit("hi", 100, 500)], [42], [(0, 2)], 24_000)
    assert grid.tokens.tolist() == [42]
    assert grid.dur.tolist() == [5]  # centers 120, 200, 280, 360, 440
    assert grid.spans_ms.tolist() == [[100, 500]]


def test_adjacent_tokens_shorter_than_a_frame_may_own_nothing():
    text = "abc"
    grid = build_frame_grid(text, [TimedUnit("abc", 0, 60)], [1, 2, 3], chars(text), S)
    assert grid.spans_ms.tolist() == [[0, 20], [20, 40], [40, 60]]
    assert grid.dur.tolist() == [0, 0, 1]
    assert grid.zero_duration_tokens == 2


def test_empty_transcript_is_rejected():
    with pytest.raises(GridError) as err:
        build_frame_grid("  ", [], [], [], S)
    assert err.value.reason == "empty_transcript"


def test_word_count_mismatch_is_rejected():
    with pytest.raises(GridError) as err:
        build_frame_grid("a b", [TimedUnit("a", 0, 10)], [1, 2], [(0, 1), (2, 3)], S)
    assert err.value.reason == "word_count_mismatch"


def test_characters_map_linearly_inside_their_word_and_tokens_may_cross_words():
    text = "abcd ef"
    words = [TimedUnit("abcd", 0, 400), TimedUnit("ef", 1000, 1200)]
    # "ab" | "cd e" (crosses the space) | "f"
    spans = token_spans_ms(text, words, [(0, 2), (2, 6), (6, 7)])
    assert spans == [(0, 200), (200, 1100), (1100, 1200)]


def test_whitespace_token_gets_zero_length_at_the_next_word_start_or_last_word_end():
    text = "ab  cd "
    words = [TimedUnit("ab", 0, 100), TimedUnit("cd", 300, 500)]
    spans = token_spans_ms(text, words, [(0, 2), (2, 4), (4, 6), (6, 7)])
    assert spans == [(0, 100), (300, 300), (300, 500), (500, 500)]


def test_leading_space_of_a_token_is_not_part_of_its_characters():
    text = "ab cd"
    words = [TimedUnit("ab", 0, 100), TimedUnit("cd", 200, 400)]
    assert token_spans_ms(text, words, [(0, 2), (2, 5)]) == [(0, 100), (200, 400)]


def test_byte_fallback_pieces_of_one_character_split_its_time_equally():
    text = "aé"
    words = [TimedUnit("aé", 0, 300)]
    # "é" is two byte-level pieces that both report the character span (1, 2).
    spans = token_spans_ms(text, words, [(0, 1), (1, 2), (1, 2)])
    assert spans == [(0, 150), (150, 225), (225, 300)]


def test_times_round_half_up_to_integer_ms():
    text = "abc"
    words = [TimedUnit("abc", 0, 5)]  # each char 5/3 ms: 1.666.., 3.333..
    assert token_spans_ms(text, words, chars(text)) == [(0, 2), (2, 3), (3, 5)]
    words = [TimedUnit("ab", 0, 3)]
    assert token_spans_ms("ab", words, chars("ab")) == [(0, 2), (2, 3)]  # 1.5 rounds up


def test_word_that_normalized_to_nothing_keeps_its_zero_length_span():
    text = "a - b"
    words = [TimedUnit("a", 0, 100), TimedUnit("-", 100, 100), TimedUnit("b", 200, 300)]
    grid = build_frame_grid(text, words, [1, 2, 3, 4, 5], chars(text), 4 * S)
    assert grid.spans_ms.tolist() == [[0, 100], [100, 100], [100, 100], [200, 200], [200, 300]]
    assert grid.dur[1] == 0 and check_grid_invariants(grid, 4 * S) == []


@st.composite
def spans_and_samples(draw):
    n_samples = draw(st.integers(0, 20 * S))
    duration_ms = n_samples * 1000 // 24_000 + 200
    cuts = sorted(draw(st.lists(st.integers(0, duration_ms), min_size=0, max_size=40)))
    if len(cuts) % 2:
        cuts = cuts[:-1]
    spans = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)]
    return spans, n_samples


@settings(max_examples=300, deadline=None)
@given(spans_and_samples())
def test_invariants_hold_for_any_non_overlapping_spans(case):
    spans, n_samples = case
    grid = frame_grid_from_spans(list(range(len(spans))), spans, n_samples)
    assert check_grid_invariants(grid, n_samples) == []


@st.composite
def utterances(draw):
    words = draw(st.lists(st.text(alphabet="abcé-", min_size=1, max_size=6), min_size=1, max_size=12))
    separators = draw(st.lists(st.sampled_from([" ", "  ", "\t"]), min_size=len(words), max_size=len(words)))
    text = "".join(w + sep for w, sep in zip(words, separators)).rstrip()
    boundaries = sorted(draw(st.lists(st.integers(0, 5000), min_size=2 * len(words), max_size=2 * len(words))))
    timed = [TimedUnit(w, boundaries[2 * i], boundaries[2 * i + 1]) for i, w in enumerate(words)]
    # Random tokenization: cut points over the text, with some pieces repeated (byte fallback).
    cut_points = sorted(set(draw(st.lists(st.integers(1, len(text)), max_size=len(text)))) | {len(text)})
    offsets, start = [], 0
    for end in cut_points:
        offsets.append((start, end))
        if draw(st.booleans()) and end - start == 1:
            offsets.append((start, end))
        start = end
    n_samples = draw(st.integers(1, 6 * 24_000))
    return text, timed, offsets, n_samples


@settings(max_examples=300, deadline=None)
@given(utterances())
def test_invariants_hold_for_random_transcripts_and_tokenizations(case):
    text, words, offsets, n_samples = case
    grid = build_frame_grid(text, words, list(range(len(offsets))), offsets, n_samples)
    assert check_grid_invariants(grid, n_samples) == []
    starts, ends = grid.spans_ms[:, 0], grid.spans_ms[:, 1]
    assert np.all(ends >= starts)
    assert np.all(starts[1:] >= ends[:-1])  # spans never overlap
