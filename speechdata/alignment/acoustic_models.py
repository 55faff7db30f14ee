"""CTC acoustic models for forced alignment, through Hugging Face transformers' ``ParakeetForCTC``.

A model is a transformers directory (hub repo or local folder): ``config.json`` and safetensors for
the FastConformer encoder and its CTC head, the log-mel front end's config
(:class:`transformers.ParakeetFeatureExtractor`, in ``preprocessor_config.json`` or
``processor_config.json``) and ``tokenizer.json`` for the SentencePiece vocabulary. The CTC blank is the config's ``pad_token_id`` (the last class); one output frame is the
feature extractor's hop times the encoder's subsampling (10 ms x 8 = 80 ms for parakeet-ctc-1.1b).

``tiny`` is a 2-layer ``ParakeetForCTC`` with the same 8x subsampling and a SentencePiece BPE
vocabulary trained locally, built from config with a fixed seed, saved with ``save_pretrained`` and
loaded back with ``from_pretrained``, so tests exercise the real save/load and forward path. Its
weights are random: its alignments are valid paths, not meaningful ones.

Why subwords and not characters: at 80 ms a CTC model emits 12.5 labels per second at most, and
speech runs at 12-15 characters per second, so a character model at this frame rate cannot align
ordinary speech (``T < L``). parakeet-ctc-1.1b uses a 1024-piece SentencePiece vocabulary for the
same reason. Character vocabularies are still supported by the aligner (:class:`speechdata.alignment.transcript_units.CharVocabulary`).

NeMo itself is not imported here: it pins antlr4 4.9, which the platform's Dagster cannot run on
(docs/models-and-profiles.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from speechdata.io.local_cache import build_once

TINY_MODEL_NAME = "tiny-parakeet-ctc"
TINY_SEED = 0
TINY_VOCAB_SIZE = 400
# Every letter of the sample languages (en, de, fr) must be in the vocabulary, whatever the corpus says.
TINY_ALPHABET = "abcdefghijklmnopqrstuvwxyz'äöüßàâçéèêëîïôûùœ"
# The 1.1b model's front end and clock: 80 log-mel bands every 10 ms, 8x subsampled to 80 ms frames.
TINY_ENCODER = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 128,
    "num_mel_bins": 80,
    "subsampling_factor": 8,
    "subsampling_conv_channels": 64,
    "conv_kernel_size": 9,
    "dropout": 0.0,
    "dropout_positions": 0.0,
    "layerdrop": 0.0,
    "activation_dropout": 0.0,
    "attention_dropout": 0.0,
}
SMALL_MODEL_NAME = "small"
SMALL_MODEL_DIR = Path(__file__).resolve().parent / "small_model"
"""The ``small`` profile's trained aligner (English and German, synthesized speech), shipped in the
package; built by :mod:`speechdata.alignment.train_small`."""
BLANK_TOKEN = "<pad>"
"""The CTC blank, as transformers' Parakeet conversion names it: the tokenizer's pad token, after
the SentencePiece pieces, and the config's ``pad_token_id``."""


EMISSION_CALIBRATION_FILE = "emission_calibration.json"
"""Optional file in a model directory: ``{"start_offset_ms": int, "end_offset_ms": int, ...}``.

Why: a CTC model places its label spikes where its training made them cheapest, not where the sound
starts. A small model trained briefly with full self-attention fires early, and by a steady amount
(the small model: starts 80-160 ms early, ends 130-280 ms, p5-p95), so a constant measured on
calibration speech whose word times are known (never the held-out set) corrects most of it. A
model without the file (parakeet) is used as it is."""


def read_emission_offsets(directory: str | os.PathLike) -> tuple[int, int]:
    """The (start, end) offsets in ms of the model directory's calibration file, (0, 0) without one."""
    import json

    path = Path(directory) / EMISSION_CALIBRATION_FILE
    if not path.is_file():
        return (0, 0)
    data = json.loads(path.read_text())
    try:
        offsets = (int(data["start_offset_ms"]), int(data["end_offset_ms"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise AcousticModelMismatch(f"{path}: start_offset_ms and end_offset_ms must be integers ({exc})") from None
    if any(abs(o) > 1000 for o in offsets):
        raise AcousticModelMismatch(f"{path}: offsets {offsets} ms are outside +-1000 ms")
    return offsets


class AcousticModelMismatch(ValueError):
    """A model directory whose parts disagree (front end, vocabulary, blank): it cannot align."""


@dataclass(frozen=True)
class CtcAcousticModel:
    """A loaded CTC model with the front end and tokenizer saved beside it, in eval mode."""

    name: str
    model: Any
    """``transformers.ParakeetForCTC``."""
    feature_extractor: Any
    """``transformers.ParakeetFeatureExtractor``: the log-mel front end the model was trained on."""
    tokenizer: Any
    """``transformers.ParakeetTokenizer`` over the model's SentencePiece pieces."""
    emission_offsets_ms: tuple[int, int] = (0, 0)
    """(start, end) ms added to every token's Viterbi span: the model's emission delay, measured on
    calibration speech (:data:`EMISSION_CALIBRATION_FILE` in its directory); (0, 0) without one."""

    @property
    def blank_id(self) -> int:
        return int(self.model.config.pad_token_id)

    @property
    def frame_s(self) -> float:
        """Seconds per CTC output frame: the front end's hop times the encoder's subsampling."""
        hop_s = self.feature_extractor.hop_length / self.feature_extractor.sampling_rate
        return hop_s * int(self.model.config.encoder_config.subsampling_factor)


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
    return directory / "tokenizer.model"


def parakeet_tokenizer_from_sentencepiece(sentencepiece_model: str | os.PathLike):
    """A ``ParakeetTokenizer`` over a SentencePiece BPE model, the blank appended as its pad token.

    The same conversion transformers applies to NeMo's parakeet checkpoints (its
    ``ParakeetConverter``), so the tiny model's vocabulary is laid out like the real one's.
    """
    from tokenizers import AddedToken
    from transformers import ParakeetTokenizer
    from transformers.convert_slow_tokenizer import Converter, ParakeetConverter
    from transformers.utils import sentencepiece_model_pb2_new

    class ParakeetConverterOfAnyProtobuf(ParakeetConverter):
        # sentencepiece's own generated parser refuses the protobuf runtime Dagster pins (6.x); the
        # copy transformers ships reads the same model file on it.
        def __init__(self, vocab_file: str):
            Converter.__init__(self, vocab_file)
            self.vocab_file = vocab_file
            self.proto = sentencepiece_model_pb2_new.ModelProto()
            self.proto.ParseFromString(Path(vocab_file).read_bytes())

    converted = ParakeetConverterOfAnyProtobuf(str(sentencepiece_model)).converted()
    tokenizer = ParakeetTokenizer(tokenizer_object=converted, clean_up_tokenization_spaces=False)
    unk = AddedToken("<unk>", normalized=False, special=True)
    blank = AddedToken(BLANK_TOKEN, normalized=False, special=True)
    tokenizer.add_tokens([unk, blank])
    tokenizer.add_special_tokens({"pad_token": blank, "unk_token": unk})
    return tokenizer


def tiny_ctc_config(vocabulary_size: int):
    """The tiny model's config: ``vocabulary_size`` pieces plus the blank, the last class."""
    from transformers import ParakeetCTCConfig

    return ParakeetCTCConfig(
        vocab_size=vocabulary_size + 1, pad_token_id=vocabulary_size, encoder_config=dict(TINY_ENCODER)
    )


def save_tiny_ctc_model(directory: Path) -> None:
    """Build the tiny model, its front end and tokenizer, and save all three into ``directory``."""
    import torch
    from transformers import ParakeetFeatureExtractor, ParakeetForCTC, ParakeetProcessor

    sentencepiece_model = train_tiny_sentencepiece(directory.parent / "sentencepiece")
    tokenizer = parakeet_tokenizer_from_sentencepiece(sentencepiece_model)
    config = tiny_ctc_config(tokenizer.pad_token_id)
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = ParakeetForCTC(config)
    model.save_pretrained(directory)
    # transformers' defaults are the 1.1b model's front end: 16 kHz, 80 bands, 25 ms windows every 10 ms.
    feature_extractor = ParakeetFeatureExtractor(feature_size=TINY_ENCODER["num_mel_bins"])
    ParakeetProcessor(feature_extractor=feature_extractor, tokenizer=tokenizer).save_pretrained(directory)


def tiny_ctc_model_path(cache_dir: str | os.PathLike) -> Path:
    """Build (once) and save the tiny model under ``cache_dir``; return its transformers directory."""
    return build_once(Path(cache_dir) / f"{TINY_MODEL_NAME}-seed{TINY_SEED}", save_tiny_ctc_model)


def check_model_parts_agree(acoustic: CtcAcousticModel, model_sample_rate: int) -> None:
    """Refuse a model whose saved front end or tokenizer is not the one its weights expect."""
    config = acoustic.model.config
    extractor = acoustic.feature_extractor
    checks = [
        ("feature extractor sampling_rate", extractor.sampling_rate, model_sample_rate),
        ("feature extractor feature_size", extractor.feature_size, config.encoder_config.num_mel_bins),
        ("tokenizer size (pieces + blank)", len(acoustic.tokenizer), config.vocab_size),
        (f"tokenizer id of the blank {BLANK_TOKEN}", acoustic.tokenizer.pad_token_id, config.pad_token_id),
        ("config.json pad_token_id (the blank, the last class)", config.pad_token_id, config.vocab_size - 1),
    ]
    for field, found, expected in checks:
        if found != expected:
            raise AcousticModelMismatch(f"CTC model {acoustic.name!r}: {field} is {found}, expected {expected}")


def load_ctc_model(
    name: str,
    *,
    cache_dir: str | os.PathLike,
    device: str = "cpu",
    local_files_only: bool = False,
    revision: str | None = None,
) -> CtcAcousticModel:
    """Load a CTC model in eval mode: ``tiny``, ``small``, a local transformers directory, or a hub name (cache).

    ``local_files_only`` never downloads: a hub name must already be in the Hugging Face cache.
    ``revision`` (a hub name's branch, tag or commit; None: the hub's default) is ignored for a directory.
    """
    import torch
    from transformers import ParakeetFeatureExtractor, ParakeetForCTC, ParakeetTokenizer

    from speechdata.alignment.log_probs import MODEL_SAMPLE_RATE
    from speechdata.hub_access import hub_model_access

    if name.endswith(".nemo"):
        raise ValueError(
            f"CTC model {name!r}: NeMo .nemo checkpoints are not loaded here; give its transformers "
            "directory (transformers' models/parakeet/convert_nemo_to_hf.py writes one)"
        )
    source = {"tiny": lambda: str(tiny_ctc_model_path(cache_dir)), SMALL_MODEL_NAME: lambda: str(SMALL_MODEL_DIR)}.get(
        name, lambda: name
    )()
    is_directory = os.path.isdir(source)
    revision = None if is_directory else revision
    options: dict[str, Any] = {"revision": revision} if revision else {}
    options["local_files_only"] = hub_model_access(source, revision, local_files_only=local_files_only or is_directory)
    acoustic = CtcAcousticModel(
        name=name,
        model=ParakeetForCTC.from_pretrained(source, dtype=torch.float32, **options).to(device).eval(),
        feature_extractor=ParakeetFeatureExtractor.from_pretrained(source, **options),
        tokenizer=ParakeetTokenizer.from_pretrained(source, **options),
        emission_offsets_ms=read_emission_offsets(source) if is_directory else (0, 0),
    )
    check_model_parts_agree(acoustic, MODEL_SAMPLE_RATE)
    return acoustic
