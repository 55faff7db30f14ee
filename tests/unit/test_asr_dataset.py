"""The map-style ASR dataset and collate_asr_batch: what NeMo's transducer training_step receives."""

import pyarrow as pa
import pytest
import torch

from speechdata.asr.dataset import AsrManifestDataset, collate_asr_batch
from tests.conftest import encode, tone


@pytest.fixture
def manifest(tmp_path):
    (tmp_path / "a.flac").write_bytes(encode(tone(1.0, 16_000), 16_000, "FLAC"))
    (tmp_path / "b.wav").write_bytes(encode(tone(0.5, 24_000, channels=2), 24_000))
    (tmp_path / "bad.flac").write_bytes(b"fLaC but not really")
    return pa.table(
        {
            "audio_filepath": [str(tmp_path / n) for n in ("a.flac", "b.wav", "bad.flac", "missing.flac")],
            "text": ["<|en|> abc", "<|hi|> " + "x" * 40, "<|en|> c", "<|en|> d"],
            "duration": [1.0, 0.5, 1.0, 1.0],
            "lang": ["en", "hi", "en", "en"],
        }
    )


def char_tokenizer(text):
    return [ord(c) % 97 + 1 for c in text]


def test_items_are_mono_16k_with_truncated_tokens_and_bad_files_are_none(manifest, caplog):
    dataset = AsrManifestDataset(manifest, char_tokenizer, max_token_len=16)
    a, b, bad, missing = (dataset[i] for i in range(4))
    assert a["signal"].shape == (16_000,) and a["signal"].dtype == torch.float32
    assert b["signal"].shape == (8_000,)  # 0.5 s of 24 kHz stereo -> 16 kHz mono
    assert a["tokens"].tolist() == char_tokenizer("<|en|> abc") and b["tokens"].shape == (16,)
    assert bad is None and missing is None
    assert "bad.flac" in caplog.text and "missing.flac" in caplog.text
    assert dataset.durations_s.tolist() == [1.0, 0.5, 1.0, 1.0] and dataset.languages.tolist() == [
        "en",
        "hi",
        "en",
        "en",
    ]


def test_collate_drops_none_and_pads(manifest):
    dataset = AsrManifestDataset(manifest, char_tokenizer)
    signal, signal_len, tokens, token_len = collate_asr_batch([dataset[i] for i in range(4)])
    assert signal.shape == (2, 16_000) and signal.dtype == torch.float32
    assert signal_len.tolist() == [16_000, 8_000] and signal_len.dtype == torch.long
    assert tokens.shape == (2, 47) and tokens.dtype == torch.long and token_len.tolist() == [10, 47]
    assert float(signal[1, 8_000:].abs().sum()) == 0.0 and int(tokens[0, 10:].abs().sum()) == 0


def test_collate_of_only_broken_items_is_the_seeds_placeholder():
    signal, signal_len, tokens, token_len = collate_asr_batch([None, None])
    assert (
        signal.shape == (1, 1) and signal_len.tolist() == [1] and tokens.shape == (1, 1) and token_len.tolist() == [0]
    )


def test_nemo_style_tokenizer_object_is_accepted(manifest):
    class Tok:
        def text_to_ids(self, text):
            return [1, 2, 3]

    assert AsrManifestDataset(manifest, Tok())[0]["tokens"].tolist() == [1, 2, 3]
    with pytest.raises(TypeError):
        AsrManifestDataset(manifest, object())
