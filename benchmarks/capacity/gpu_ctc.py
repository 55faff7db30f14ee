"""The alignment stage's GPU half at full size: CTC log-probabilities from a parakeet-ctc-1.1b-sized model.

Why: ``ctc_alignments`` runs ``nvidia/parakeet-ctc-1.1b`` (FastConformer, 42 layers, d_model 1024,
8 heads, 8x depthwise-striding subsampling, 1 024 BPE pieces + blank) over every utterance before
the CPU Viterbi. Its GPU time adds to Qwen's and WavLM's in the audio hours a GPU hour buys.

The model is built from config with random weights (transformers' ``ParakeetForCTC``, the class the
stage loads the real checkpoint into, at the model card's sizes): the real layer count and widths,
so kernels, memory and FLOPs are the real ones without the 4.3 GB download. The forward is the
stage's own (:func:`speechdata.alignment.log_probs.ctc_model_forward` through
:func:`compute_log_probs`, with the stage's batching and windowing, the log-mel front end included),
in float32 as production runs it today and under bfloat16 autocast, so the figures say whether bf16
is worth switching on.

FLOPs are counted, not estimated from parameters: ``torch.utils.flop_counter.FlopCounterMode`` over
:data:`FLOP_SAMPLE_UTTERANCES` utterances one at a time (no padding; attention included), scaled to
the pass by audio seconds.
"""

from __future__ import annotations

import numpy as np
import torch

from speechdata.alignment.acoustic_models import CtcAcousticModel
from speechdata.alignment.log_probs import MODEL_SAMPLE_RATE, LogProbSettings, compute_log_probs, ctc_model_forward
from speechdata.audio.clock import SAMPLE_RATE

CTC_MODEL_ID = "nvidia/parakeet-ctc-1.1b"
PARAKEET_VOCAB_SIZE = 1024
FLOP_SAMPLE_UTTERANCES = 8
# The model card's sizes (the hub repo's config.json): FastConformer, 42 layers, 8x depthwise-striding subsampling.
PARAKEET_CTC_1_1B_ENCODER = dict(
    num_mel_bins=80,
    num_hidden_layers=42,
    hidden_size=1024,
    num_attention_heads=8,
    intermediate_size=4096,
    subsampling_factor=8,
    subsampling_conv_channels=256,
    conv_kernel_size=9,
    scale_input=True,
    dropout=0.0,
    dropout_positions=0.0,
    layerdrop=0.0,
    activation_dropout=0.0,
    attention_dropout=0.0,
)


def parakeet_sized_config(layers: int | None = None):
    from transformers import ParakeetCTCConfig

    encoder = {**PARAKEET_CTC_1_1B_ENCODER, **({"num_hidden_layers": layers} if layers else {})}
    # 1 024 pieces and the blank, the last class.
    return ParakeetCTCConfig(
        vocab_size=PARAKEET_VOCAB_SIZE + 1, pad_token_id=PARAKEET_VOCAB_SIZE, encoder_config=encoder
    )


def build_ctc(layers: int | None, device: torch.device):
    """A ``ParakeetForCTC`` at parakeet-ctc-1.1b's sizes (``layers`` to cut it), random weights, eval."""
    from transformers import ParakeetForCTC

    return ParakeetForCTC(parakeet_sized_config(layers)).eval().to(device)


def acoustic_model(model) -> CtcAcousticModel:
    """The model with the 1.1b model's front end (transformers' defaults: 80 bands, 10 ms hop)."""
    from transformers import ParakeetFeatureExtractor

    return CtcAcousticModel(
        name=CTC_MODEL_ID, model=model, feature_extractor=ParakeetFeatureExtractor(), tokenizer=None
    )


def ctc_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def log_probs_pass(model, audios_16k: list[np.ndarray], device: torch.device, autocast: torch.dtype | None):
    """The stage's log-prob pass over every utterance; ``autocast`` wraps it in that dtype."""
    forward = ctc_model_forward(acoustic_model(model), str(device))
    if autocast is None:
        return compute_log_probs(forward, audios_16k, LogProbSettings())
    with torch.autocast(device.type, dtype=autocast):
        return compute_log_probs(forward, audios_16k, LogProbSettings())


def flops_per_audio_second(model, audios_16k: list[np.ndarray], device: torch.device) -> float:
    """Counted FLOPs of single-utterance forwards (no padding) per second of audio."""
    from torch.utils.flop_counter import FlopCounterMode

    sample = audios_16k[:FLOP_SAMPLE_UTTERANCES]
    forward = ctc_model_forward(acoustic_model(model), str(device))
    with FlopCounterMode(display=False) as counter:
        for audio in sample:
            forward([audio])
    seconds = sum(a.shape[0] for a in sample) / MODEL_SAMPLE_RATE
    return counter.get_total_flops() / seconds


def to_16k(audios_24k: list[np.ndarray]) -> list[np.ndarray]:
    """Noise of the same durations at the acoustic model's rate (the stage resamples on the CPU)."""
    return [np.ascontiguousarray(a[: a.shape[0] * MODEL_SAMPLE_RATE // SAMPLE_RATE]) for a in audios_24k]
