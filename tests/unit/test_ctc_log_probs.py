"""Batching by length and windowed log-probs for long audio, with a fake model of known behaviour."""

import numpy as np

from speechdata.alignment.log_probs import LogProbSettings, batches_by_length, compute_log_probs

FRAME = 1280  # 80 ms at 16 kHz


def frame_mean_model(calls: list[int]):
    """A 'model' whose frame t output is the mean of its input frame t: local, so windows are exact."""

    def forward(batch):
        calls.extend(a.shape[0] for a in batch)
        out = []
        for audio in batch:
            frames = -(-audio.shape[0] // FRAME)
            padded = np.pad(audio, (0, frames * FRAME - audio.shape[0]))
            means = padded.reshape(frames, FRAME).mean(axis=1)
            out.append(np.stack([means, -means], axis=1).astype(np.float32))
        return out

    return forward


def test_batches_are_length_sorted_and_capped_in_padded_samples():
    lengths = [50, 10, 30, 20, 40]
    batches = batches_by_length(lengths, max_batch_samples=80)
    assert [i for b in batches for i in b] == [1, 3, 2, 4, 0]
    for batch in batches:
        assert max(lengths[i] for i in batch) * len(batch) <= 80 or len(batch) == 1


def test_results_come_back_in_input_order():
    rng = np.random.default_rng(0)
    audios = [rng.standard_normal(FRAME * n).astype(np.float32) for n in (7, 2, 11, 3)]
    calls: list[int] = []
    results = compute_log_probs(frame_mean_model(calls), audios, LogProbSettings(max_batch_s=100))
    assert [r.shape[0] for r in results] == [7, 2, 11, 3]
    for audio, result in zip(audios, results):
        assert np.allclose(result[:, 0], audio.reshape(-1, FRAME).mean(axis=1), atol=1e-6)


def test_long_audio_is_windowed_and_the_model_never_sees_more_than_a_window():
    rng = np.random.default_rng(1)
    long = rng.standard_normal(16_000 * 125 + 700).astype(np.float32)  # a little over two minutes
    settings = LogProbSettings(max_window_s=10.0, context_s=1.0)
    calls: list[int] = []
    [windowed] = compute_log_probs(frame_mean_model(calls), [long], settings)
    assert max(calls) <= 10 * 16_000
    assert len(calls) > 12
    [whole] = frame_mean_model([])([long])
    assert windowed.shape == whole.shape
    assert np.allclose(windowed, whole, atol=1e-6)
