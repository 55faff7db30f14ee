"""The alignment stage's GPU half at full size: CTC log-probabilities from a parakeet-ctc-1.1b-sized model.

Why: ``ctc_alignments`` runs ``nvidia/parakeet-ctc-1.1b`` (FastConformer, 42 layers, d_model 1024,
8 heads, 8x depthwise-striding subsampling, 1 024 BPE pieces + blank) over every utterance before
the CPU Viterbi. Its GPU time adds to Qwen's and WavLM's in the audio hours a GPU hour buys.

The model is built from config with random weights (NeMo's FastConformer CTC recipe,
``examples/asr/conf/fastconformer/fast-conformer_ctc_bpe.yaml``, at the model card's sizes): the
real layer count and widths, so kernels, memory and FLOPs are the real ones without the 4.3 GB
download. A character-label ``EncDecCTCModel`` with 1 024 labels stands in for the BPE model: same
encoder and decoder shapes, no tokenizer to train. The forward is the stage's own
(:func:`speechdata.alignment.log_probs.nemo_ctc_forward` through :func:`compute_log_probs`, with
the stage's batching and windowing), in float32 as production runs it today and under bfloat16
autocast, so the figures say whether bf16 is worth switching on.

FLOPs are counted, not estimated from parameters: ``torch.utils.flop_counter.FlopCounterMode`` over
:data:`FLOP_SAMPLE_UTTERANCES` utterances one at a time (no padding; attention included), scaled to
the pass by audio seconds.
"""

from __future__ import annotations

import numpy as np
import torch

from speechdata.alignment.acoustic_models import mel_preprocessor_config
from speechdata.alignment.log_probs import MODEL_SAMPLE_RATE, LogProbSettings, compute_log_probs, nemo_ctc_forward
from speechdata.bridge.clock import SAMPLE_RATE

CTC_MODEL_ID = "nvidia/parakeet-ctc-1.1b"
PARAKEET_VOCAB_SIZE = 1024
FLOP_SAMPLE_UTTERANCES = 8
# The model card's sizes on NeMo's FastConformer CTC recipe.
PARAKEET_CTC_1_1B_ENCODER = dict(
    feat_in=80,
    n_layers=42,
    d_model=1024,
    subsampling="dw_striding",
    subsampling_factor=8,
    subsampling_conv_channels=256,
    ff_expansion_factor=4,
    self_attention_model="rel_pos",
    n_heads=8,
    att_context_size=[-1, -1],
    conv_kernel_size=9,
    conv_norm_type="batch_norm",
    xscaling=True,
    dropout=0.0,
    dropout_pre_encoder=0.0,
    dropout_emb=0.0,
    dropout_att=0.0,
)


def parakeet_sized_config(layers: int | None = None) -> dict:
    labels = [f"p{i}" for i in range(PARAKEET_VOCAB_SIZE)]
    encoder = {
        "_target_": "nemo.collections.asr.modules.ConformerEncoder",
        **PARAKEET_CTC_1_1B_ENCODER,
        **({"n_layers": layers} if layers else {}),
    }
    return {
        "sample_rate": MODEL_SAMPLE_RATE,
        "labels": labels,
        "train_ds": None,
        "validation_ds": None,
        "test_ds": None,
        "preprocessor": mel_preprocessor_config(),
        "encoder": encoder,
        "decoder": {
            "_target_": "nemo.collections.asr.modules.ConvASRDecoder",
            "feat_in": PARAKEET_CTC_1_1B_ENCODER["d_model"],
            "num_classes": len(labels),
            "vocabulary": labels,
        },
    }


def build_ctc(layers: int | None, device: torch.device):
    from nemo.collections.asr.models import EncDecCTCModel
    from omegaconf import OmegaConf

    model = EncDecCTCModel(cfg=OmegaConf.create(parakeet_sized_config(layers)))
    return model.eval().to(device)


def ctc_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def log_probs_pass(model, audios_16k: list[np.ndarray], device: torch.device, autocast: torch.dtype | None):
    """The stage's log-prob pass over every utterance; ``autocast`` wraps it in that dtype."""
    forward = nemo_ctc_forward(model, str(device))
    if autocast is None:
        return compute_log_probs(forward, audios_16k, LogProbSettings())
    with torch.autocast(device.type, dtype=autocast):
        return compute_log_probs(forward, audios_16k, LogProbSettings())


def flops_per_audio_second(model, audios_16k: list[np.ndarray], device: torch.device) -> float:
    """Counted FLOPs of single-utterance forwards (no padding) per second of audio."""
    from torch.utils.flop_counter import FlopCounterMode

    sample = audios_16k[:FLOP_SAMPLE_UTTERANCES]
    forward = nemo_ctc_forward(model, str(device))
    with FlopCounterMode(display=False) as counter:
        for audio in sample:
            forward([audio])
    seconds = sum(a.shape[0] for a in sample) / MODEL_SAMPLE_RATE
    return counter.get_total_flops() / seconds


def to_16k(audios_24k: list[np.ndarray]) -> list[np.ndarray]:
    """Noise of the same durations at the acoustic model's rate (the stage resamples on the CPU)."""
    return [np.ascontiguousarray(a[: a.shape[0] * MODEL_SAMPLE_RATE // SAMPLE_RATE]) for a in audios_24k]
