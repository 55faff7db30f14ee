"""The small aligner's training data: deterministic text in its alphabet, silence trimming, noise and rooms.

espeak-ng itself is not run here (it is not installed in CI): these are the pure parts of
speechdata.alignment.synthetic_speech and the training script's vocabulary.
"""

import numpy as np

from speechdata.alignment.synthetic_speech import (
    SAMPLE_RATE,
    TRIM_THRESHOLD_DB,
    add_noise,
    reverberate,
    sentence,
    speech_bounds,
)
from speechdata.alignment.train_small import SMALL_ALPHABET, char_tokenizer, text_targets
from speechdata.alignment.transcript_units import normalize_word


def test_sentences_are_deterministic_and_spelled_in_the_small_alphabet():
    for language in ("en", "de"):
        first = [sentence(np.random.default_rng([3, i]), language) for i in range(200)]
        again = [sentence(np.random.default_rng([3, i]), language) for i in range(200)]
        assert first == again
        letters = {c for text in first for c in normalize_word(text) if c != " "}
        assert letters <= set(SMALL_ALPHABET), letters - set(SMALL_ALPHABET)
        assert len(set(first)) == len(first)
    german = " ".join(sentence(np.random.default_rng([3, i]), "de") for i in range(200))
    assert "tausend" in german or "hundert" in german  # numbers written as German words


def test_the_character_tokenizer_spells_words_without_separators_and_ends_with_the_blank():
    tokenizer = char_tokenizer()
    assert len(tokenizer) == len(SMALL_ALPHABET) + 2
    assert tokenizer.pad_token_id == len(tokenizer) - 1
    targets = text_targets("Große Straße", tokenizer)
    assert tokenizer.convert_ids_to_tokens(targets) == list("großestraße")


def test_speech_bounds_trim_silence_at_the_threshold():
    rng = np.random.default_rng(0)
    audio = np.zeros(SAMPLE_RATE, dtype=np.float32)
    audio[4000:12000] = 0.5 * np.sin(np.arange(8000) * 0.3)
    audio[3000:4000] = (
        0.5 * 10 ** ((TRIM_THRESHOLD_DB - 10) / 20) * rng.standard_normal(1000)
    )  # quieter than the threshold
    start, end = speech_bounds(audio)
    assert start == 4000 and end == 12000


def test_noise_is_added_at_the_requested_snr():
    rng = np.random.default_rng(1)
    speech = np.sin(np.arange(SAMPLE_RATE) * 0.05).astype(np.float32)
    for pink in (False, True):
        noisy = add_noise(speech, rng, 20.0, pink=pink)
        snr = 10 * np.log10(np.mean(speech**2) / np.mean((noisy - speech) ** 2))
        assert abs(snr - 20.0) < 0.1


def test_the_room_keeps_length_and_peak_and_adds_a_decaying_tail():
    rng = np.random.default_rng(2)
    click = np.zeros(SAMPLE_RATE, dtype=np.float32)
    click[100] = 1.0
    wet = reverberate(click, rng, rt60_s=0.4)
    assert wet.shape == click.shape and np.isclose(np.abs(wet).max(), 1.0)
    early = np.sqrt(np.mean(wet[200:1800] ** 2))
    late = np.sqrt(np.mean(wet[4800:6400] ** 2))
    assert early > 3 * late > 0
