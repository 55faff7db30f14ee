"""MetricX-24 quality estimation: an mT5 encoder-decoder read out as one regression score.

MetricX-24 (google-research/metricx, ``metricx24/models.py``) is not a named class in
transformers. Its model is mT5 with a shared embedding, an encoder, a decoder and an untied LM head;
the decoder runs ONE step from token 0 (pad, mT5's decoder start) and the score is that step's
logit for ``<extra_id_10>`` (id 250089 in mT5's vocabulary), clipped to ``[0, 25]``: an error
score, lower is better. The QE input is ``"source: <src> candidate: <hyp>"`` tokenized with
truncation to ``max_input_length`` (1536) and the final EOS removed, as ``metricx24/predict.py``
does.

``full``: ``google/metricx-24-hybrid-xl-v2p6`` (or -large/-bf16 variants) with the ``google/mt5-xl``
tokenizer, from the Hugging Face cache or hub. ``tiny``: a small :class:`MT5ForRegression` from a
small config with a fixed seed, and a small SentencePiece-style Unigram tokenizer with mT5's
special tokens, both built locally and saved, then loaded through the same ``from_pretrained``
path. Its scores are not meaningful.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn
from transformers import MT5Config
from transformers.modeling_outputs import ModelOutput
from transformers.models.mt5.modeling_mt5 import MT5PreTrainedModel, MT5Stack

from speechdata.features.gpu_batching import budgeted_batches, run_splitting_on_oom
from speechdata.io.local_cache import build_once

SCORE_TOKEN = "<extra_id_10>"
MT5_SCORE_TOKEN_ID = 250089
"""``<extra_id_10>`` in mT5's vocabulary: the logit MetricX reads as its score."""
SCORE_MIN, SCORE_MAX = 0.0, 25.0
DEFAULT_MAX_INPUT_LENGTH = 1536
TINY_SEED = 0
TINY_MODEL_NAME = "tiny-metricx24"


@dataclasses.dataclass
class MT5ForRegressionOutput(ModelOutput):
    loss: torch.FloatTensor | None = None
    predictions: torch.FloatTensor | None = None


class MT5ForRegression(MT5PreTrainedModel):
    """MetricX's regression model: mT5 encoder + one decoder step + the score token's logit, in [0, 25].

    ``config.metricx_score_token_id`` (default 250089) names the logit read as the score, so a model
    with a smaller vocabulary (the tiny profile) can point it at its own ``<extra_id_10>``.
    """

    # Both stacks embed with the shared table; the LM head is untied in MetricX checkpoints.
    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }
    _keys_to_ignore_on_load_unexpected = ["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"]

    def __init__(self, config: MT5Config):
        super().__init__(config)
        self.model_dim = config.d_model
        self.shared = nn.Embedding(config.vocab_size, config.d_model)
        encoder_config = copy.deepcopy(config)
        encoder_config.is_decoder = False
        encoder_config.use_cache = False
        encoder_config.is_encoder_decoder = False
        self.encoder = MT5Stack(encoder_config)
        decoder_config = copy.deepcopy(config)
        decoder_config.is_decoder = True
        decoder_config.is_encoder_decoder = False
        decoder_config.num_layers = config.num_decoder_layers
        self.decoder = MT5Stack(decoder_config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, new_embeddings):
        self.shared = new_embeddings
        self.encoder.set_input_embeddings(new_embeddings)
        self.decoder.set_input_embeddings(new_embeddings)

    @property
    def score_token_id(self) -> int:
        return int(getattr(self.config, "metricx_score_token_id", MT5_SCORE_TOKEN_ID))

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.FloatTensor | None = None,
        **kwargs,
    ) -> MT5ForRegressionOutput:
        encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        # One decoder step from token 0 (mT5's pad = decoder start), as MetricX does.
        decoder_input_ids = torch.zeros((input_ids.size(0), 1), dtype=torch.long, device=input_ids.device)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            encoder_hidden_states=encoder_outputs[0],
            encoder_attention_mask=attention_mask,
            use_cache=False,
        )
        # MetricX checkpoints are untied (tie_word_embeddings false), so the decoder output is not
        # rescaled by d_model**-0.5; transformers 5's MT5Config forces the flag to True, so it is not read.
        logits = self.lm_head(decoder_outputs[0][:, 0, :])
        predictions = torch.clamp(logits[:, self.score_token_id], SCORE_MIN, SCORE_MAX)
        loss = None
        if labels is not None:
            loss = nn.functional.mse_loss(predictions.view(-1), labels.to(predictions.device).view(-1))
        return MT5ForRegressionOutput(loss=loss, predictions=predictions)


def qe_input(source: str, hypothesis: str) -> str:
    """MetricX-24's reference-free (QE) input text."""
    return f"source: {source} candidate: {hypothesis}"


def encode_qe_inputs(
    tokenizer, sources: Sequence[str], hypotheses: Sequence[str], max_input_length: int
) -> list[list[int]]:
    """Token ids per pair, truncated to ``max_input_length`` and without the final EOS (as MetricX)."""
    encoded = tokenizer(
        [qe_input(s, h) for s, h in zip(sources, hypotheses, strict=True)], max_length=max_input_length, truncation=True
    )["input_ids"]
    eos = tokenizer.eos_token_id
    return [ids[:-1] if ids and ids[-1] == eos else ids for ids in encoded]


class MetricXScorer:
    """Batched MetricX-24 QE on one device: length-sorted batches under a padded-token budget."""

    def __init__(
        self,
        model: MT5ForRegression,
        tokenizer,
        device: torch.device,
        max_input_length: int = DEFAULT_MAX_INPUT_LENGTH,
        max_batch_tokens: int = 16_384,
    ):
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.max_input_length, self.max_batch_tokens = max_input_length, max_batch_tokens
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def __call__(
        self, sources: Sequence[str], hypotheses: Sequence[str], on_progress: Callable[[int, int], None] | None = None
    ) -> list[float]:
        """One error score in [0, 25] per (source, hypothesis) pair, in input order."""
        if len(sources) != len(hypotheses):
            raise ValueError(f"{len(sources)} sources but {len(hypotheses)} hypotheses")
        if not sources:  # a shard whose utterances were all rejected has no segments
            return []
        ids = encode_qe_inputs(self.tokenizer, sources, hypotheses, self.max_input_length)
        scores: list[float] = [0.0] * len(ids)
        done = 0
        for batch in budgeted_batches([max(len(x), 1) for x in ids], self.max_batch_tokens):
            for index, score in zip(
                batch, run_splitting_on_oom(batch, lambda b: self._forward([ids[i] for i in b])), strict=True
            ):
                scores[index] = score
            done += len(batch)
            if on_progress:
                on_progress(done, len(ids))
        return scores

    @torch.inference_mode()
    def _forward(self, sequences: list[list[int]]) -> list[float]:
        width = max(max(len(s) for s in sequences), 1)
        input_ids = torch.full((len(sequences), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
            attention_mask[row, : len(sequence)] = 1
        output = self.model(input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device))
        return output.predictions.float().cpu().tolist()


# --- loading: full and tiny --------------------------------------------------------------------

TINY_CORPUS = (
    "source: which sites have you been using candidate: 你一直在用哪些网站",
    "source: how did the meeting go today candidate: 今天的会议怎么样",
    "source: we went home after the concert candidate: 音乐会后我们回家了",
    "source: good morning everyone candidate: 大家早上好",
    "The quick brown fox jumps over the lazy dog. Speech translation needs streaming segments.",
    "我们需要高质量的同声传译数据。这个句子是中文的。早上好，各位。",
)
TINY_VOCAB_SIZE = 400
N_EXTRA_IDS = 100


def build_tiny_tokenizer():
    """A Unigram (SentencePiece-style) tokenizer with mT5's specials: pad 0, eos 1, unk 2, and
    ``<extra_id_99>`` .. ``<extra_id_0>`` at the end of the vocabulary, eos appended to every input."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=TINY_VOCAB_SIZE, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>", show_progress=False
    )
    tokenizer.train_from_iterator(list(TINY_CORPUS), trainer=trainer)
    extra_ids = [f"<extra_id_{i}>" for i in range(N_EXTRA_IDS - 1, -1, -1)]
    tokenizer.add_special_tokens(extra_ids)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", tokenizer.token_to_id("</s>"))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=extra_ids,
    )


def tiny_metricx_config(vocab_size: int, score_token_id: int) -> MT5Config:
    config = MT5Config(
        vocab_size=vocab_size,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        dropout_rate=0.0,
        feed_forward_proj="gated-gelu",
        architectures=["MT5ForRegression"],
    )
    config.metricx_score_token_id = score_token_id
    return config


def save_tiny_metricx(directory: str | Path) -> Path:
    """Build the tiny model and tokenizer and save both to ``directory`` (one folder, like a hub repo)."""
    directory = Path(directory)
    tokenizer = build_tiny_tokenizer()
    config = tiny_metricx_config(len(tokenizer), tokenizer.convert_tokens_to_ids(SCORE_TOKEN))
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = MT5ForRegression(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def tiny_metricx_path(cache_dir: str | os.PathLike) -> Path:
    """Build (once) and save the tiny model and tokenizer under ``cache_dir``; return their folder."""
    return build_once(Path(cache_dir) / f"{TINY_MODEL_NAME}-seed{TINY_SEED}", save_tiny_metricx)


def load_metricx(
    model_path: str,
    tokenizer_path: str,
    *,
    revision: str | None = None,
    local_files_only: bool = False,
    dtype: torch.dtype = torch.float32,
):
    """``(model, tokenizer)`` from hub names or local folders; checks the score token's id agrees."""
    from transformers import AutoTokenizer

    from speechdata.hub_access import hub_model_access

    tokenizer = AutoTokenizer.from_pretrained(
        tokenizer_path, local_files_only=hub_model_access(tokenizer_path, local_files_only=local_files_only)
    )
    model = MT5ForRegression.from_pretrained(
        model_path,
        revision=revision,
        local_files_only=hub_model_access(model_path, revision, local_files_only=local_files_only),
        dtype=dtype,
    )
    token_id = tokenizer.convert_tokens_to_ids(SCORE_TOKEN)
    if token_id != model.score_token_id:
        raise ValueError(
            f"tokenizer {tokenizer_path!r} has {SCORE_TOKEN} at id {token_id}, the model reads id {model.score_token_id}"
        )
    return model.eval(), tokenizer
