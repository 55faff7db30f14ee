"""Qwen and WavLM feature extraction with the tiny models: layer choice, batching, pooling, OOM."""

import numpy as np
import pytest
import torch

from speechdata.features.gpu_batching import ItemTooLarge, budgeted_batches, run_splitting_on_oom
from speechdata.features.models import tiny_qwen3, tiny_wavlm
from speechdata.features.speech import pool_to_mimi_frames, wavlm_features
from speechdata.features.text import keep_layers_through, qwen_hidden_states


def test_pooling_matches_a_hand_computed_example():
    features = torch.arange(10, dtype=torch.float32).unsqueeze(1)  # 10 frames at 50 Hz, D = 1
    # Output 0 averages frames 0..5 (frames -2, -1 are padding, left out); output 1 frames 2..9.
    assert pool_to_mimi_frames(features, 2)[:, 0].tolist() == [2.5, 5.5]
    assert pool_to_mimi_frames(features, 4)[:, 0].tolist() == [2.5, 5.5, 5.5, 5.5]  # last row repeated
    assert pool_to_mimi_frames(features, 1)[:, 0].tolist() == [2.5]  # trimmed


@pytest.fixture(scope="module")
def wavlm():
    return tiny_wavlm()


@pytest.mark.parametrize("n_samples", [1920 * 25, 1920 * 25 + 100, 1920 * 40 - 1])
def test_wavlm_output_has_exactly_F_rows(wavlm, n_samples):
    audio = np.random.default_rng(0).standard_normal(n_samples).astype(np.float32) * 0.1
    n_frames = -(-n_samples // 1920)
    [features] = wavlm_features(wavlm, [audio], [n_frames], device="cpu")
    assert features.shape == (n_frames, wavlm.config.hidden_size) and features.dtype == np.float16


def test_wavlm_batched_equals_one_at_a_time(wavlm):
    rng = np.random.default_rng(1)
    audios = [rng.standard_normal(n).astype(np.float32) * 0.1 for n in (24_000 * 3, 24_000 * 2 + 500, 24_000 * 5)]
    frames = [-(-a.shape[0] // 1920) for a in audios]
    batched = wavlm_features(wavlm, audios, frames, device="cpu", max_batch_s=100)
    alone = [wavlm_features(wavlm, [a], [f], device="cpu")[0] for a, f in zip(audios, frames)]
    for b, a in zip(batched, alone):
        np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), atol=2e-3)


def test_wavlm_layer_and_weighted_sum(wavlm):
    audio = np.random.default_rng(2).standard_normal(24_000).astype(np.float32)
    last = wavlm_features(wavlm, [audio], [13], device="cpu")[0]
    first = wavlm_features(wavlm, [audio], [13], device="cpu", layer=0)[0]
    n_states = wavlm.config.num_hidden_layers + 1
    only_first = wavlm_features(wavlm, [audio], [13], device="cpu", layer_weights=[1.0] + [0.0] * (n_states - 1))[0]
    np.testing.assert_allclose(first, only_first, atol=1e-3)
    assert not np.allclose(first, last, atol=1e-2)
    with pytest.raises(ValueError, match="layer_weights"):
        wavlm_features(wavlm, [audio], [13], device="cpu", layer_weights=[1.0])


def test_qwen_cut_model_returns_exactly_hidden_states_minus_2_of_the_whole_model():
    whole = tiny_qwen3(512)
    ids = torch.tensor([[5, 17, 300, 2, 99, 41]])
    captured = {}
    # The output of the second-to-last decoder layer, taken with a hook on the whole model.
    whole.layers[-2].register_forward_hook(lambda module, args, output: captured.setdefault("h", output))
    with torch.inference_mode():
        reference = whole(input_ids=ids, output_hidden_states=True).hidden_states[-2][0]
    hooked = captured["h"][0] if isinstance(captured["h"], tuple) else captured["h"]
    torch.testing.assert_close(hooked[0], reference)

    cut = keep_layers_through(tiny_qwen3(512), -2)
    assert len(cut.layers) == whole.config.num_hidden_layers - 1
    [ours] = qwen_hidden_states(cut, [ids[0].tolist()], device="cpu")
    np.testing.assert_allclose(ours.astype(np.float32), reference.numpy(), atol=2e-3)


def test_qwen_batched_equals_one_at_a_time_and_keeps_exactly_T_rows():
    model = keep_layers_through(tiny_qwen3(512), -2)
    token_lists = [[1, 2, 3, 4, 5], [7, 8], list(range(20, 60)), []]
    batched = qwen_hidden_states(model, token_lists, device="cpu", max_batch_tokens=1000)
    alone = [qwen_hidden_states(model, [t], device="cpu")[0] for t in token_lists]
    assert [b.shape[0] for b in batched] == [5, 2, 40, 0]
    for b, a in zip(batched, alone):
        np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), atol=2e-3)


def test_keep_layers_through_refuses_the_last_layer():
    with pytest.raises(ValueError):
        keep_layers_through(tiny_qwen3(512), -1)


def test_out_of_memory_splits_the_batch_and_only_an_item_alone_fails():
    calls = []

    def forward(batch):
        calls.append(len(batch))
        if len(batch) > 2 or 99 in batch:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return [x * 10 for x in batch]

    assert run_splitting_on_oom([1, 2, 3, 4, 5], forward) == [10, 20, 30, 40, 50]
    assert calls == [5, 2, 3, 1, 2]  # halves, then the half still too big is halved again
    with pytest.raises(ItemTooLarge):
        run_splitting_on_oom([99], forward)


def test_budgeted_batches_sort_by_length_and_respect_the_budget():
    costs = [5, 1, 4, 2, 3]
    batches = budgeted_batches(costs, max_padded_cost=6)
    assert sorted(i for b in batches for i in b) == list(range(5))
    assert all(len(b) * max(costs[i] for i in b) <= 6 for b in batches)
