"""The aligner's CTC acoustic model through transformers' ParakeetForCTC: the tiny model's real
save/load and forward path, its front end and vocabulary, and the loader's refusals."""

import json
import shutil

import numpy as np
import pytest
import torch

from speechdata.alignment.acoustic_models import (
    TINY_ALPHABET,
    AcousticModelMismatch,
    load_ctc_model,
    parakeet_tokenizer_from_sentencepiece,
    tiny_ctc_model_path,
    train_tiny_sentencepiece,
)
from speechdata.alignment.log_probs import CTC_FRAME_S, MODEL_SAMPLE_RATE, ctc_model_forward
from speechdata.alignment.transcript_units import ctc_targets, normalize_word, vocabulary_of
from speechdata.profiles import TINY_CORPUS

FRAME_SAMPLES = int(CTC_FRAME_S * MODEL_SAMPLE_RATE)


@pytest.fixture(scope="module")
def tiny(model_cache_dir):
    return load_ctc_model("tiny", cache_dir=model_cache_dir)


def noise(seed: int, samples: int) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(samples)).astype(np.float32)


def test_tiny_model_is_a_saved_transformers_directory_with_the_real_models_clock(tiny, model_cache_dir):
    directory = tiny_ctc_model_path(model_cache_dir)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in directory.iterdir()}
    assert type(tiny.model).__name__ == "ParakeetForCTC" and not tiny.model.training
    encoder = tiny.model.config.encoder_config
    assert encoder.num_hidden_layers == 2 and encoder.subsampling_factor == 8
    assert tiny.frame_s == pytest.approx(CTC_FRAME_S)
    # The blank is the last class, after every SentencePiece piece.
    assert tiny.blank_id == tiny.model.config.vocab_size - 1 == len(tiny.tokenizer) - 1
    assert tiny.tokenizer.convert_ids_to_tokens(tiny.blank_id) == "<pad>"


def test_front_end_is_the_models_log_mel(tiny):
    extractor = tiny.feature_extractor
    assert extractor.sampling_rate == MODEL_SAMPLE_RATE
    assert extractor.feature_size == tiny.model.config.encoder_config.num_mel_bins == 80
    assert extractor.hop_length / extractor.sampling_rate == pytest.approx(0.01)
    features = extractor([noise(0, MODEL_SAMPLE_RATE)], sampling_rate=MODEL_SAMPLE_RATE, return_tensors="pt")
    assert tuple(features["input_features"].shape[1:]) == (MODEL_SAMPLE_RATE // extractor.hop_length + 1, 80)


def test_tiny_model_is_rebuilt_identically_from_its_fixed_seed(tiny, tmp_path):
    again = load_ctc_model("tiny", cache_dir=tmp_path)
    ours, theirs = tiny.model.state_dict(), again.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert again.tokenizer.get_vocab() == tiny.tokenizer.get_vocab()


def test_forward_gives_one_log_prob_row_per_80_ms_frame(tiny):
    forward = ctc_model_forward(tiny)
    audios = [noise(1, 25 * FRAME_SAMPLES), noise(2, 7 * FRAME_SAMPLES), noise(3, 7 * FRAME_SAMPLES + 300)]
    log_probs = forward(audios)
    assert [lp.shape[0] for lp in log_probs] == [25, 7, 8]  # a partial frame at the end counts
    for lp in log_probs:
        assert lp.dtype == np.float32 and lp.shape[1] == tiny.model.config.vocab_size
        np.testing.assert_allclose(np.exp(lp).sum(axis=1), 1.0, atol=1e-4)


def test_an_utterance_gets_the_same_log_probs_alone_and_padded_in_a_batch(tiny):
    forward = ctc_model_forward(tiny)
    short, long = noise(4, 9 * FRAME_SAMPLES), noise(5, 40 * FRAME_SAMPLES)
    [alone] = forward([short])
    batched, _ = forward([short, long])
    np.testing.assert_allclose(batched, alone, atol=1e-4)


def test_converted_tokenizer_tokenizes_like_sentencepiece(tmp_path):
    import sentencepiece as spm

    model_file = train_tiny_sentencepiece(tmp_path / "spm")
    processor = spm.SentencePieceProcessor(model_file=str(model_file))
    tokenizer = parakeet_tokenizer_from_sentencepiece(model_file)
    words = {normalize_word(w) for w in TINY_CORPUS.replace(".", " ").split()} | {"zzyzx", "straße", "œuvre"}
    for word in sorted(words):
        assert tokenizer.encode(word, add_special_tokens=False) == processor.encode(word), word
    assert tokenizer.pad_token_id == processor.get_piece_size() == len(tokenizer) - 1


def test_vocabulary_spells_every_sample_letter_and_never_targets_the_blank(tiny):
    vocabulary = vocabulary_of(tiny)
    assert vocabulary.blank_id == tiny.blank_id
    assert set(TINY_ALPHABET) <= vocabulary.characters
    targets = ctc_targets("Über den Straßen — l'œuvre", vocabulary)
    dash_first, dash_end = targets.word_target_ranges[3]
    assert targets.words[3] == "—" and dash_first == dash_end  # a word the vocabulary cannot spell: no tokens
    assert targets.targets and tiny.blank_id not in targets.targets
    assert "".join(targets.token_texts).replace("\u2581", "") == "überdenstraßenl'œuvre"


def test_a_local_transformers_directory_is_a_model_name(tiny, model_cache_dir, tmp_path):
    copy = tmp_path / "my-ctc-model"
    shutil.copytree(tiny_ctc_model_path(model_cache_dir), copy)
    loaded = load_ctc_model(str(copy), cache_dir=tmp_path / "unused")
    assert loaded.name == str(copy) and loaded.blank_id == tiny.blank_id
    audio = noise(6, 12 * FRAME_SAMPLES)
    np.testing.assert_allclose(ctc_model_forward(loaded)([audio])[0], ctc_model_forward(tiny)([audio])[0], atol=1e-6)
    assert not (tmp_path / "unused").exists()  # nothing built for a directory name


def test_a_front_end_that_disagrees_with_the_model_is_refused(tiny, model_cache_dir, tmp_path):
    copy = tmp_path / "bad-front-end"
    shutil.copytree(tiny_ctc_model_path(model_cache_dir), copy)
    [config_path] = [p for p in copy.glob("*processor*config.json")]
    config = json.loads(config_path.read_text())
    extractor = config.get("feature_extractor", config)
    extractor["feature_size"] = 64
    config_path.write_text(json.dumps(config))
    with pytest.raises(AcousticModelMismatch, match="feature_size is 64, expected 80") as caught:
        load_ctc_model(str(copy), cache_dir=tmp_path)
    assert str(copy) in str(caught.value)


def test_a_hub_name_not_in_the_cache_is_not_downloaded_with_local_files_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(OSError):
        load_ctc_model("nvidia/parakeet-ctc-1.1b", cache_dir=tmp_path, local_files_only=True)


def test_a_nemo_checkpoint_is_refused_with_the_way_to_convert_it(tmp_path):
    with pytest.raises(ValueError, match=r"model\.nemo.*transformers directory"):
        load_ctc_model(str(tmp_path / "model.nemo"), cache_dir=tmp_path)
