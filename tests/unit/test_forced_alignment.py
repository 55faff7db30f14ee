"""Word and token spans from a Viterbi path, on log-probs whose best path is known."""

import numpy as np
import pytest

from speechdata.alignment.forced import AlignmentRejected, align_transcript
from speechdata.alignment.transcript_units import CharVocabulary

VOCAB = CharVocabulary(list(" ab"))  # ids: space 0, a 1, b 2; blank 3


def peaked(labels: list[int], classes: int = 4) -> np.ndarray:
    """Log-probs where frame t strongly prefers ``labels[t]``."""
    lp = np.full((len(labels), classes), -10.0, dtype=np.float32)
    lp[np.arange(len(labels)), labels] = -0.01
    return lp


def test_words_and_tokens_get_frame_times_in_ms():
    # frames: blank a a blank <space> b b b blank
    lp = peaked([3, 1, 1, 3, 0, 2, 2, 2, 3])
    result = align_transcript(lp, "a b", VOCAB, frame_ms=80, duration_ms=720)
    assert [(w.text, w.start_ms, w.end_ms) for w in result.words] == [("a", 80, 240), ("b", 400, 640)]
    assert [(t.text, t.start_ms, t.end_ms) for t in result.tokens] == [
        ("a", 80, 240),
        ("<space>", 320, 400),
        ("b", 400, 640),
    ]
    assert result.score == pytest.approx(-0.01, abs=1e-4)
    assert result.n_frames == 9


def test_a_word_with_no_expressible_characters_gets_a_zero_span_at_the_previous_end():
    lp = peaked([1, 1, 0, 2, 2])
    result = align_transcript(lp, "a ?? b", VOCAB, frame_ms=80, duration_ms=400)
    assert [(w.text, w.start_ms, w.end_ms) for w in result.words] == [("a", 0, 160), ("??", 160, 160), ("b", 240, 400)]


def test_times_never_pass_the_end_of_the_audio():
    lp = peaked([1, 1, 1])
    result = align_transcript(lp, "a", VOCAB, frame_ms=80, duration_ms=200)
    assert result.words[0].end_ms == 200


@pytest.mark.parametrize(
    "text, frames, reason",
    [
        ("", 5, "empty_transcript"),
        ("   ", 5, "empty_transcript"),
        ("ééé", 5, "text_not_in_vocabulary"),
        ("abab ab", 3, "audio_too_short_for_text"),
    ],
)
def test_unalignable_utterances_are_rejected_with_a_reason(text, frames, reason):
    with pytest.raises(AlignmentRejected) as err:
        align_transcript(peaked([3] * frames), text, VOCAB, frame_ms=80, duration_ms=frames * 80)
    assert err.value.reason == reason


def test_an_optional_separator_aligns_like_a_blank_and_words_keep_their_tokens():
    """``separator_policy="optional"``: no separator target, so two words with no separator frame
    between them still align (required, they cannot), and words keep their own letters."""
    lp = peaked([3, 1, 1, 2, 2, 3])  # blank a a b b blank: no separator frame
    with pytest.raises(AlignmentRejected):
        align_transcript(peaked([1, 2]), "a b", VOCAB, frame_ms=80, duration_ms=160)
    result = align_transcript(lp, "a b", VOCAB, frame_ms=80, duration_ms=480, separator_policy="optional")
    assert [(w.text, w.start_ms, w.end_ms) for w in result.words] == [("a", 80, 240), ("b", 240, 400)]
    assert [t.text for t in result.tokens] == ["a", "b"]
    # Where the separator does fire, its frame goes to the blank between the words.
    separated = align_transcript(
        peaked([1, 0, 2]), "a ?? b", VOCAB, frame_ms=80, duration_ms=240, separator_policy="optional"
    )
    assert [(w.text, w.start_ms, w.end_ms) for w in separated.words] == [("a", 0, 80), ("??", 80, 80), ("b", 160, 240)]
    with pytest.raises(ValueError, match="separator_policy"):
        align_transcript(lp, "a b", VOCAB, frame_ms=80, duration_ms=480, separator_policy="sometimes")
