"""NeMo CTC acoustic models for forced alignment: the tiny local one and the real loading path.

``tiny`` is a 2-layer Conformer ``EncDecCTCModelBPE`` with 8x subsampling (80 ms output frames,
like parakeet-ctc-1.1b) and a SentencePiece BPE vocabulary trained locally, built from config with a
fixed seed, saved as a ``.nemo`` file and restored from it, so tests exercise NeMo's real
save/restore and forward path. Its weights are random: its alignments are valid paths, not
meaningful ones.

Why subwords and not characters: at 80 ms a CTC model emits 12.5 labels per second at most, and
speech runs at 12-15 characters per second, so a character model at this frame rate cannot align
ordinary speech (``T < L``). parakeet-ctc-1.1b uses a 1024-piece SentencePiece vocabulary for the
same reason. Character models are still supported by the aligner (:class:`speechdata.alignment.transcript_units.CharVocabulary`).
"""

from __future__ import annotations

import os
from pathlib import Path

from speechdata.io.local_cache import build_once

TINY_MODEL_NAME = "tiny-ctc-bpe"
TINY_SEED = 0
TINY_VOCAB_SIZE = 400
# Every letter of the sample languages (en, de, fr) must be in the vocabulary, whatever the corpus says.
TINY_ALPHABET = "abcdefghijklmnopqrstuvwxyz'äöüßàâçéèêëîïôûùœ"


def train_tiny_sentencepiece(directory: Path) -> Path:
    """Train the tiny model's SentencePiece BPE (deterministic: one thread, fixed corpus)."""
    import sentencepiece as spm

    from speechdata.alignment.transcript_units import normalize_word
    from speechdata.profiles import TINY_CORPUS

    directory.mkdir(parents=True, exist_ok=True)
    lines = [" ".join(normalize_word(w) for w in sentence.split()) for sentence in TINY_CORPUS.split(". ")]
    (directory / "corpus.txt").write_text("\n".join([*lines, " ".join(TINY_ALPHABET)]) + "\n")
    spm.SentencePieceTrainer.train(
        input=str(directory / "corpus.txt"),
        model_prefix=str(directory / "tokenizer"),
        vocab_size=TINY_VOCAB_SIZE,
        hard_vocab_limit=False,
        model_type="bpe",
        character_coverage=1.0,
        num_threads=1,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_file=str(directory / "tokenizer.model"))
    # NeMo's BPE models register vocab.txt beside the model as an artifact.
    (directory / "vocab.txt").write_text(
        "\n".join(processor.id_to_piece(i) for i in range(processor.get_piece_size())) + "\n"
    )
    return directory


def mel_preprocessor_config() -> dict:
    """NeMo's 80-band log-mel front end at 16 kHz, 10 ms stride, as parakeet's CTC models use it (no dither)."""
    return {
        "_target_": "nemo.collections.asr.modules.AudioToMelSpectrogramPreprocessor",
        "sample_rate": 16_000,
        "normalize": "per_feature",
        "window_size": 0.025,
        "window_stride": 0.01,
        "window": "hann",
        "features": 80,
        "n_fft": 512,
        "dither": 0.0,
        "pad_to": 0,
    }


def tiny_ctc_config(tokenizer_dir: str) -> dict:
    return {
        "sample_rate": 16_000,
        "tokenizer": {"dir": tokenizer_dir, "type": "bpe"},
        "train_ds": None,
        "validation_ds": None,
        "test_ds": None,
        "preprocessor": mel_preprocessor_config(),
        "encoder": {
            "_target_": "nemo.collections.asr.modules.ConformerEncoder",
            "feat_in": 80,
            "n_layers": 2,
            "d_model": 64,
            "subsampling": "dw_striding",
            "subsampling_factor": 8,
            "subsampling_conv_channels": 64,
            "ff_expansion_factor": 2,
            "self_attention_model": "rel_pos",
            "n_heads": 2,
            "att_context_size": [-1, -1],
            "conv_kernel_size": 9,
            "dropout": 0.0,
            "dropout_pre_encoder": 0.0,
            "dropout_emb": 0.0,
            "dropout_att": 0.0,
        },
        "decoder": {
            "_target_": "nemo.collections.asr.modules.ConvASRDecoder",
            "feat_in": 64,
            "num_classes": -1,
            "vocabulary": [],
        },
    }


def tiny_ctc_model_path(cache_dir: str | os.PathLike) -> Path:
    """Build (once) and save the tiny model under ``cache_dir``; return the ``.nemo`` path."""

    def build(temp: Path) -> None:
        import torch
        from nemo.collections.asr.models import EncDecCTCModelBPE
        from omegaconf import OmegaConf

        tokenizer_dir = train_tiny_sentencepiece(temp.parent / "tokenizer")
        with torch.random.fork_rng():
            torch.manual_seed(TINY_SEED)
            model = EncDecCTCModelBPE(cfg=OmegaConf.create(tiny_ctc_config(str(tokenizer_dir))))
        model.save_to(str(temp))

    return build_once(Path(cache_dir) / f"{TINY_MODEL_NAME}-seed{TINY_SEED}.nemo", build)


def load_ctc_model(name: str, *, cache_dir: str | os.PathLike, device: str = "cpu", local_files_only: bool = False):
    """Load a NeMo CTC model in eval mode: ``tiny``, a ``.nemo`` path, or a pretrained name (hub/cache)."""
    from nemo.collections.asr.models import ASRModel

    if name == "tiny":
        model = ASRModel.restore_from(str(tiny_ctc_model_path(cache_dir)), map_location=device)
    elif name.endswith(".nemo"):
        model = ASRModel.restore_from(name, map_location=device)
    else:
        if local_files_only:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        model = ASRModel.from_pretrained(name, map_location=device)
    model.eval()
    return model
