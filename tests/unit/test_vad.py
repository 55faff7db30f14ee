"""Silero VAD on the sample speech: it finds the speech, not the silence inserted around it."""

import numpy as np
import pytest
import torch

from speechdata.vad.silero import (
    VAD_SAMPLE_RATE,
    VadParams,
    detect_speech,
    load_silero_model,
    speech_probabilities,
    to_vad_input,
)

TOLERANCE_S = 0.25
"""A detected segment may start or end this far outside a clip's audible part: silero pads 30 ms,
decides per 32 ms window and needs 100 ms of silence to close a segment."""


@pytest.fixture(scope="module")
def model():
    # The reference paths below call silero one window at a time: on one thread, as speechdata.vad.silero does.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_silero_model()
    torch.set_num_threads(threads)


def audible_span_s(samples: np.ndarray) -> tuple[float, float]:
    """First and last 10 ms frame above -45 dBFS (espeak leaves ~0.4 s of silence at a clip's end)."""
    frames = samples[: len(samples) // 160 * 160].reshape(-1, 160)
    loud = np.where(20 * np.log10(np.sqrt((frames**2).mean(axis=1)) + 1e-12) > -45)[0]
    return loud[0] / 100, (loud[-1] + 1) / 100


def with_inserted_silence(clips, gaps_s):
    """Silence, clip, silence, clip, ...; returns the 16 kHz signal and each clip's audible span."""
    parts, spans, position = [], [], 0
    for clip, gap_s in zip(clips, gaps_s):
        speech = to_vad_input(clip.samples, clip.sample_rate)
        parts += [np.zeros(int(gap_s * VAD_SAMPLE_RATE), np.float32), speech]
        position += int(gap_s * VAD_SAMPLE_RATE)
        first, last = audible_span_s(speech)
        spans.append((position / VAD_SAMPLE_RATE + first, position / VAD_SAMPLE_RATE + last))
        position += len(speech)
    parts.append(np.zeros(VAD_SAMPLE_RATE, np.float32))
    return np.concatenate(parts), spans


def test_vad_finds_the_speech_and_not_the_inserted_silence(model, clips):
    by_id = {c.utt_id: c for c in clips}
    picked = [by_id["en_0001"], by_id["de_0002"], by_id["fr_0001"], by_id["es_0001"]]
    signal, spans = with_inserted_silence(picked, [1.5, 2.0, 1.2, 3.0])

    [found] = detect_speech(model, [signal])

    assert len(found) >= len(picked)
    for start, end in zip(found.start_s, found.end_s):
        # Every segment lies inside one clip's audible span, give or take the tolerance.
        assert any(a - TOLERANCE_S <= start and end <= b + TOLERANCE_S for a, b in spans), (start, end, spans)
    for a, b in spans:
        covered = sum(max(0.0, min(end, b) - max(start, a)) for start, end in zip(found.start_s, found.end_s))
        assert covered >= 0.85 * (b - a), (a, b, covered)


def test_pure_silence_and_faint_noise_have_no_speech(model):
    silence = np.zeros(5 * VAD_SAMPLE_RATE, np.float32)
    noise = (np.random.default_rng(0).standard_normal(5 * VAD_SAMPLE_RATE) * 1e-4).astype(np.float32)
    found = detect_speech(model, [silence, noise, np.zeros(0, np.float32)])
    assert [len(f) for f in found] == [0, 0, 0]
    assert [f.speech_s for f in found] == [0.0, 0.0, 0.0]


def test_batched_probabilities_match_silero_one_file_at_a_time(model, clips):
    from silero_vad import get_speech_timestamps

    signals = [with_inserted_silence([clip], [0.5 + 0.3 * i])[0] for i, clip in enumerate(clips[:5])]
    batched = speech_probabilities(model, signals, batch_files=3)
    for signal, probs in zip(signals, batched):
        model.reset_states()
        padded = torch.from_numpy(np.pad(signal, (0, len(probs) * 512 - len(signal))))
        with torch.inference_mode():
            one_by_one = np.array([model(padded[w * 512 : (w + 1) * 512], 16_000).item() for w in range(len(probs))])
        assert np.abs(probs - one_by_one).max() < 1e-4
    # And the segments are silero's own (its get_speech_timestamps on one file).
    found = detect_speech(model, signals, VadParams(), batch_files=4)
    for signal, segments in zip(signals, found):
        with torch.inference_mode():
            reference = get_speech_timestamps(torch.from_numpy(signal), model)
        assert [round(s * 16_000) for s in segments.start_s] == [r["start"] for r in reference]
        assert [round(e * 16_000) for e in segments.end_s] == [r["end"] for r in reference]


def test_thresholds_are_applied(model, clips):
    signal, _ = with_inserted_silence(clips[:2], [1.0, 1.0])
    [default] = detect_speech(model, [signal])
    [strict] = detect_speech(model, [signal], VadParams(min_speech_duration_ms=60_000))
    [padded] = detect_speech(model, [signal], VadParams(speech_pad_ms=200))
    assert len(strict) == 0 < len(default)
    assert padded.speech_s > default.speech_s
