"""The small aligner's training data: deterministic text in its alphabet, silence trimming, noise and rooms.

espeak-ng itself is not run here (it is not installed in CI): these are the pure parts of
speechdata.alignment.synthetic_speech and the training script's vocabulary.
"""

import numpy as np
import pytest

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


def test_the_character_tokenizer_spells_words_with_the_delimiter_between_them_and_ends_with_the_blank():
    tokenizer = char_tokenizer()
    assert len(tokenizer) == len(SMALL_ALPHABET) + 3
    assert tokenizer.pad_token_id == len(tokenizer) - 1
    targets = text_targets("Große Straße 12", tokenizer)
    assert "".join(tokenizer.convert_ids_to_tokens(targets)) == "große|straße|twelve"


def test_warm_starting_adds_the_delimiter_and_keeps_every_old_row_by_name(tmp_path):
    """A model saved with the letters-only vocabulary gains ``|``: old tokens keep their rows (the blank
    moves to the new last class), the new row is the blank's with a lower bias, so the warm-started
    model's best class on every frame is the saved model's."""
    import torch
    from tokenizers import AddedToken, Tokenizer, models
    from transformers import ParakeetCTCConfig, ParakeetForCTC, ParakeetTokenizer

    from speechdata.alignment.acoustic_models import BLANK_TOKEN
    from speechdata.alignment.train_small import NEW_TOKEN_BIAS_OFFSET, warm_started
    from speechdata.alignment.transcript_units import WORD_DELIMITER

    letters = {c: i for i, c in enumerate(SMALL_ALPHABET)}
    letters["<unk>"] = len(letters)
    old_tokenizer = ParakeetTokenizer(
        tokenizer_object=Tokenizer(models.BPE(vocab=letters, merges=[], unk_token="<unk>"))
    )
    old_tokenizer.add_tokens([AddedToken(BLANK_TOKEN, normalized=False, special=True)])
    old_tokenizer.add_special_tokens({"pad_token": BLANK_TOKEN, "unk_token": "<unk>"})
    encoder = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16}
    torch.manual_seed(0)
    config = ParakeetCTCConfig(
        vocab_size=len(old_tokenizer), pad_token_id=old_tokenizer.pad_token_id, encoder_config=encoder
    )
    old = ParakeetForCTC(config).eval()
    old.save_pretrained(tmp_path)
    old_tokenizer.save_pretrained(tmp_path)

    tokenizer = char_tokenizer()
    new = warm_started(str(tmp_path), tokenizer).eval()
    assert new.config.vocab_size == len(tokenizer) and new.config.pad_token_id == tokenizer.pad_token_id
    old_vocabulary, new_vocabulary = old_tokenizer.get_vocab(), tokenizer.get_vocab()
    for token, old_id in old_vocabulary.items():
        assert torch.equal(new.ctc_head.weight[new_vocabulary[token]], old.ctc_head.weight[old_id]), token
    delimiter, blank = new_vocabulary[WORD_DELIMITER], tokenizer.pad_token_id
    bias = new.ctc_head.bias.detach()
    assert float(bias[delimiter]) == pytest.approx(float(bias[blank]) - NEW_TOKEN_BIAS_OFFSET)
    features = torch.randn(1, 200, 80)
    with torch.no_grad():
        old_best = old(input_features=features).logits.argmax(-1)
        new_best = new(input_features=features).logits.argmax(-1)
    remapped = torch.tensor(
        [new_vocabulary[t] for t in old_tokenizer.convert_ids_to_tokens(list(range(len(old_vocabulary))))]
    )
    assert torch.equal(new_best, remapped[old_best])


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
