"""Written words in their spoken form (numbers, symbols, other scripts), and aligned back to them."""

import numpy as np
import pytest

from speechdata.alignment.forced import align_transcript
from speechdata.alignment.text_normalization import spoken_form
from speechdata.alignment.transcript_units import CharVocabulary, ctc_targets

LETTERS = set("abcdefghijklmnopqrstuvwxyz'")
VOCAB = CharVocabulary(list(" abcdefghijklmnopqrstuvwxyz'"))


@pytest.mark.parametrize(
    "language, word, spoken",
    [
        ("en", "1984", "nineteen eighty four"),
        ("en", "$25,", "twenty five dollars"),
        ("en", "$3.50", "three dollars fifty cents"),
        ("en", "£3.50", "three pounds fifty pence"),
        ("en", "25€", "twenty five euros"),
        ("en", "EUR", "euros"),
        ("en", "50%", "fifty percent"),
        ("en", "&", "and"),
        ("en", "+", "plus"),
        ("en", "21st", "twenty first"),
        ("en", "1,000", "one thousand"),
        ("en", "3.14", "three point one four"),
        ("en", "10:30", "ten thirty"),
        ("en", "12/25/2024", "december twenty fifth twenty twenty four"),
        ("en", "007", "zero zero seven"),
        ("en", "COVID-19", "covid nineteen"),
        ("en", "(Hello),", "hello"),
        ("de", "12.05.2024", "zwoelfte mai zweitausendvierundzwanzig"),
        ("de", "1.000,5", "eintausend komma fuenf"),
        ("de", "50%", "fuenfzig prozent"),
        ("fr", "1er", "premier"),
        ("fr", "3,5", "trois virgule cinq"),
        ("fr", "1984", "mille neuf cent quatre vingt quatre"),
        ("es", "25€", "veinticinco euros"),
        ("es", "50%", "cincuenta por ciento"),
        ("es", "ñandú", "nandu"),
        ("ru", "Москва", "moskva"),
        ("el", "Αθήνα", "athena"),
        (None, "1984", "nineteen eighty four"),
        ("xx", "7", "seven"),
    ],
)
def test_spoken_form(language, word, spoken):
    assert " ".join(spoken_form(word, language, LETTERS)) == spoken


def test_a_word_the_vocabulary_spells_is_only_normalized():
    assert spoken_form("Don\u2019t", "en", LETTERS) == ["don't"]
    # Letters the vocabulary has are never romanized: a German model keeps its umlauts.
    assert spoken_form("Straße", "de", LETTERS | set("äöüß")) == ["straße"]


def test_a_number_is_one_written_word_with_the_separators_of_its_spoken_words_inside():
    targets = ctc_targets("In 1984 we", VOCAB, "en")
    assert targets.words == ["In", "1984", "we"]
    first, last = targets.word_target_ranges[1]
    spelled = "".join(" " if t == "<space>" else t for t in targets.token_texts[first:last])
    assert spelled == "nineteen eighty four"


def _peaked_path(targets: list[int], blank: int, classes: int) -> np.ndarray:
    """Log-probs whose best path emits each target for two frames, a blank between repeats."""
    labels = []
    for i, t in enumerate(targets):
        if i and targets[i - 1] == t:
            labels.append(blank)
        labels += [t, t]
    lp = np.full((len(labels), classes), -12.0, dtype=np.float32)
    lp[np.arange(len(labels)), labels] = -0.001
    return lp


@pytest.mark.parametrize(
    "text, language",
    [
        ("In 1984 we paid $25.", "en"),
        ("Wir zahlten am 12.05.2024 25€ (50%).", "de"),
        ("Привет, Москва!", "ru"),
        ("Καλημέρα Αθήνα.", "el"),
    ],
)
def test_every_written_word_gets_the_span_of_its_spoken_form(text, language):
    targets = ctc_targets(text, VOCAB, language)
    lp = _peaked_path(targets.targets, VOCAB.blank_id, VOCAB.blank_id + 1)
    result = align_transcript(lp, text, VOCAB, frame_ms=80, duration_ms=lp.shape[0] * 80, language=language)
    assert [w.text for w in result.words] == text.split()  # the written words, punctuation as written
    assert all(w.end_ms > w.start_ms for w in result.words)
    assert all(a.end_ms <= b.start_ms for a, b in zip(result.words, result.words[1:]))
    # A word's span runs from its spoken form's first token to its last.
    for word, (first, last) in zip(result.words, targets.word_target_ranges, strict=True):
        assert (word.start_ms, word.end_ms) == (result.tokens[first].start_ms, result.tokens[last - 1].end_ms)


@pytest.mark.parametrize(
    "word", ["9" * 500, "$" + "9" * 40, "1" * 40 + ".5", "99/99/9999", "12:60:99", "1.2.3.4.5", "$$25", "%%%", "²³"]
)
@pytest.mark.parametrize("language", ["en", "de", "fr", "es", "ru", "ja", None])
def test_odd_numbers_are_spoken_somehow_and_never_raise(word, language):
    spoken = spoken_form(word, language, LETTERS)
    assert all(w and all(c in LETTERS for c in w) for w in spoken)


def test_long_digit_runs_are_read_digit_by_digit():
    assert spoken_form("12345678901234567890", "en", LETTERS)[:3] == ["one", "two", "three"]
    assert spoken_form("10:05", "en", LETTERS) == ["ten", "five"]
