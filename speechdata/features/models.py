"""The text and speech encoders of the bridge: Qwen3 (hidden states) and WavLM (acoustic features).

``full`` loads ``Qwen/Qwen3-1.7B`` with ``AutoModel`` and ``microsoft/wavlm-large`` from the
Hugging Face cache or hub. ``tiny`` builds small ``Qwen3Model`` / ``WavLMModel`` instances of the
same classes from config with a fixed seed (random weights: the code path is real, the features
are not meaningful).
"""

from __future__ import annotations

import torch

TINY_SEED = 0


def tiny_qwen3(vocab_size: int):
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
    )
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = Qwen3Model(config)
    return model.eval()


def tiny_wavlm():
    from transformers import WavLMConfig, WavLMModel

    config = WavLMConfig(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32,) * 7,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        num_buckets=32,
        max_bucket_distance=80,
        # As wavlm-large: per-frame layer norm in the conv stack (group norm would mix in the padding).
        feat_extract_norm="layer",
        do_stable_layer_norm=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(TINY_SEED)
        model = WavLMModel(config)
    return model.eval()


def load_pretrained(kind: str, model_id: str, revision: str | None, local_files_only: bool, dtype: torch.dtype):
    from speechdata.hub_access import hub_model_access

    local_files_only = hub_model_access(model_id, revision, local_files_only=local_files_only)
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_id, revision=revision, local_files_only=local_files_only, dtype=dtype)
    return model.eval()
