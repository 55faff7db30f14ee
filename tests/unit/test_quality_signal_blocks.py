"""The whole-utterance signals computed block by block give exactly the values of the whole utterance.

The reference formulas below are the signals as they were computed on the whole utterance at once
(one or two float64 copies of it each); the blocked code must give the same floats, bit for bit,
so ``quality.parquet`` keeps its bytes and nothing is measured again."""

import numpy as np
import pytest

from speechdata.quality import signals
from speechdata.quality.signals import SILENCE_FLOOR_DBFS, blocked_sum, level_dbfs, silence_share, wada_snr_db
from speechdata.quality.speech_signals import dc_offset_ratio, frame_powers

RATE = 24_000


def whole_level_dbfs(samples):
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
    return 20.0 * np.log10(max(rms, 1e-10))


def whole_silence_share(samples, sample_rate):
    size = int(round(0.03 * sample_rate))
    n_frames = -(-samples.size // size)
    framed = np.zeros(n_frames * size, np.float64)
    framed[: samples.size] = samples
    rms = np.sqrt(np.mean(np.square(framed.reshape(n_frames, size)), axis=1))
    return float(np.mean(20.0 * np.log10(np.maximum(rms, 1e-10)) < SILENCE_FLOOR_DBFS))


def whole_wada_statistic(samples):
    magnitude = np.abs(samples.astype(np.float64)) / float(np.max(np.abs(samples)))
    magnitude = np.maximum(magnitude, 1e-10)
    return np.log(magnitude.mean()) - np.log(magnitude).mean()


def whole_wada_snr_db(samples):
    snrs, curve = signals._wada_curve()
    return float(np.clip(np.interp(whole_wada_statistic(samples), curve, snrs), *signals.WADA_SNR_RANGE_DB))


def whole_dc_offset_ratio(samples):
    values = samples.astype(np.float64)
    rms = float(np.sqrt(np.mean(values**2)))
    return abs(float(values.mean())) / rms if rms > 1e-12 else 0.0


def whole_frame_powers(samples, sample_rate):
    size = int(round(0.02 * sample_rate))
    n_frames = samples.size // size
    return np.mean(samples[: n_frames * size].astype(np.float64).reshape(n_frames, size) ** 2, axis=1)


def talk(seconds: float, seed: int = 0) -> np.ndarray:
    """Bursts of noisy tone between quiet (-53 dBFS) and digitally silent stretches, with a small DC
    offset: silent frames to count and an offset to find."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE)
    t = np.arange(n) / RATE
    envelope = (np.sin(2 * np.pi * 0.23 * t) > -0.2) * (0.3 + 0.2 * np.sin(2 * np.pi * 1.7 * t))
    samples = (
        envelope * (np.sin(2 * np.pi * 180.0 * t) + 0.3 * rng.standard_normal(n))
        + 0.002 * rng.standard_normal(n)
        + 0.001
    )
    samples[n // 3 : n // 3 + RATE] = 0.0  # one second of digital silence
    return samples.astype(np.float32)


@pytest.mark.parametrize("size", [0, 1, 7, 8, 127, 128, 129, 1000, 4096, 4097, 100_003])
@pytest.mark.parametrize("block", [128, 1000, 4096])
def test_blocked_sum_is_numpys_sum_bit_for_bit(size, block):
    values = np.random.default_rng(size).standard_normal(size) * 1e3
    got = blocked_sum(lambda a, b: values[a:b], 0, size, block)
    assert got == float(np.add.reduce(values))


def test_a_sum_of_blocks_in_order_is_not_numpys_sum(monkeypatch):
    # Why the blocks follow numpy's halving: summing consecutive blocks in order rounds differently.
    values = np.random.default_rng(1).standard_normal(1_000_003) * 1e3
    in_order = float(sum(np.add.reduce(values[i : i + 4096]) for i in range(0, values.size, 4096)))
    assert in_order != float(np.add.reduce(values))
    assert blocked_sum(lambda a, b: values[a:b], 0, values.size, 4096) == float(np.add.reduce(values))


@pytest.mark.parametrize("block", [4096, 1 << 20])
def test_every_blocked_signal_equals_the_whole_utterances_value(monkeypatch, block):
    samples = talk(50.0)  # 1.2 M samples: more than one default block
    monkeypatch.setattr(signals, "SIGNAL_BLOCK_SAMPLES", block)
    assert level_dbfs(samples) == whole_level_dbfs(samples)
    share = silence_share(samples, RATE)
    assert 0.2 < share < 0.6
    assert share == whole_silence_share(samples, RATE)
    assert wada_snr_db(samples) == whole_wada_snr_db(samples)  # clamped: the digital silence reads noise-free
    noisy = (samples + 0.03 * np.random.default_rng(5).standard_normal(samples.size)).astype(np.float32)
    snr = wada_snr_db(noisy)
    assert 5.0 < snr < 30.0
    assert snr == whole_wada_snr_db(noisy)
    ratio = dc_offset_ratio(samples)
    assert 0.001 < ratio < 0.1
    assert ratio == whole_dc_offset_ratio(samples)
    np.testing.assert_array_equal(frame_powers(samples, RATE), whole_frame_powers(samples, RATE))
    np.testing.assert_array_equal(
        frame_powers(samples[:123_457], 16_000), whole_frame_powers(samples[:123_457], 16_000)
    )


def test_short_and_edge_utterances_keep_their_values():
    for samples in (np.zeros(0, np.float32), np.zeros(5, np.float32), np.full(10, 0.25, np.float32), talk(0.01)):
        if samples.size:
            assert level_dbfs(samples) == whole_level_dbfs(samples)
            assert silence_share(samples, RATE) == whole_silence_share(samples, RATE)
            assert dc_offset_ratio(samples) == whole_dc_offset_ratio(samples)
        if np.any(samples):
            assert wada_snr_db(samples) == whole_wada_snr_db(samples)
    assert level_dbfs(np.zeros(0, np.float32)) == float("-inf")
    assert silence_share(np.zeros(0, np.float32), RATE) == 1.0
    assert wada_snr_db(np.zeros(100, np.float32)) == signals.WADA_SNR_RANGE_DB[0]
    assert dc_offset_ratio(np.full(10, 0.25, np.float32)) == 1.0
