"""Qwen3 hidden states over exactly a transcript's tokens (the bridge's ``qwen.npy``).

docs/bridge-tuples.md fixes ``hidden_states[-2]`` of ``AutoModel``: the un-normed output of the second-to-last
decoder layer. :func:`keep_layers_through` cuts the model after that layer and drops the final
norm, so the last layer and the LM head are never computed; its output *is* ``hidden_states[-2]``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from speechdata.features.gpu_batching import budgeted_batches, run_splitting_on_oom


def keep_layers_through(model, hidden_state_index: int = -2):
    """Truncate a HF decoder-only ``*Model`` in place so its output is ``hidden_states[index]``.

    ``hidden_states`` has ``N + 1`` entries (embeddings, then each layer's output; the last one
    normed). Index ``i`` (negative counts from the end, ``-1`` excluded) is the un-normed output of
    layer ``i`` (1-based): keep the first ``i`` layers and replace the final norm by identity.
    """
    n_layers = len(model.layers)
    index = hidden_state_index + n_layers + 1 if hidden_state_index < 0 else hidden_state_index
    if not 1 <= index <= n_layers - 1:
        raise ValueError(f"hidden_state_index {hidden_state_index} must select a layer before the last of {n_layers}")
    model.layers = torch.nn.ModuleList(list(model.layers)[:index])
    model.norm = torch.nn.Identity()
    model.config.num_hidden_layers = index
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = list(model.config.layer_types)[:index]
    return model


def qwen_hidden_states(
    model,
    token_lists: Sequence[Sequence[int]],
    *,
    device: str | torch.device,
    max_batch_tokens: int = 16_384,
    pad_id: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> list[np.ndarray]:
    """float16 ``[T_i, hidden]`` per token list, batched by length with attention masks."""
    results: list[np.ndarray | None] = [None] * len(token_lists)
    lengths = [max(len(t), 1) for t in token_lists]

    def forward(indices: list[int]) -> list[np.ndarray]:
        width = max(len(token_lists[i]) for i in indices)
        ids = torch.full((len(indices), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(indices), width), dtype=torch.long)
        for row, i in enumerate(indices):
            ids[row, : len(token_lists[i])] = torch.tensor(token_lists[i], dtype=torch.long)
            mask[row, : len(token_lists[i])] = 1
        with torch.inference_mode():
            hidden = model(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
        hidden = hidden.to(torch.float16).cpu().numpy()
        return [hidden[row, : len(token_lists[i])] for row, i in enumerate(indices)]

    for batch in budgeted_batches(lengths, max_batch_tokens):
        nonempty = [i for i in batch if len(token_lists[i])]
        for i in batch:
            if not len(token_lists[i]):
                results[i] = np.zeros((0, model.config.hidden_size), np.float16)
        if nonempty:
            for i, states in zip(nonempty, run_splitting_on_oom(nonempty, forward), strict=True):
                results[i] = states
        if on_batch:
            on_batch(len(batch))
    return results  # type: ignore[return-value]
