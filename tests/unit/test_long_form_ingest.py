"""Ingest of a recording past the whole-decode budget: streamed in chunks, stored as decoding it whole
would store it, and refused past the long-form limit. The budget is lowered to 30 s so a 75 s
file takes the streamed path in well under a second."""

import io

import numpy as np
import pytest
import soundfile as sf

from speechdata.accounting.rejects import Reject
from speechdata.audio import budget
from speechdata.audio.codec import decode_audio
from speechdata.landing import long_form
from speechdata.landing.normalize import SegmentRequest, _normalize_one

RATE = 22_050
SECONDS = 75.0


def stereo_recording(offset: float = 0.0, silent: bool = False) -> io.BytesIO:
    rng = np.random.default_rng(0)
    t = np.arange(int(SECONDS * RATE)) / RATE
    left = 0.2 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 0.3 * t)) + 0.02 * rng.standard_normal(
        t.size
    )
    right = 0.5 * left + 0.01 * rng.standard_normal(t.size)
    samples = np.stack([left, right], axis=1) + offset
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros_like(samples) if silent else samples, RATE, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    return buffer


def normalize(recording: io.BytesIO, codec: str, start_s: float = 0.0, end_s: float = SECONDS):
    recording.seek(0)
    with sf.SoundFile(recording) as sound:
        return _normalize_one(sound, SegmentRequest("talk", "talk.wav", start_s, end_s), "soxr", codec)


@pytest.fixture
def half_minute_budget(monkeypatch):
    monkeypatch.setattr(budget, "MAX_UTTERANCE_SECONDS", 30.0)
    monkeypatch.setattr(long_form, "CHUNK_S", 7.0)  # chunks that do not divide the file


@pytest.mark.parametrize(("codec", "offset"), [("pcm16", 0.05), ("flac16", 0.0)])
def test_a_streamed_recording_stores_what_decoding_it_whole_stores(monkeypatch, codec, offset):
    recording = stereo_recording(offset)
    whole = normalize(recording, codec)
    monkeypatch.setattr(budget, "MAX_UTTERANCE_SECONDS", 30.0)
    monkeypatch.setattr(long_form, "CHUNK_S", 7.0)
    streamed = normalize(recording, codec)
    assert isinstance(whole, type(streamed)) and not isinstance(streamed, Reject)
    assert streamed.n_samples == whole.n_samples == int(SECONDS * 24_000)
    assert streamed.clipped_share == whole.clipped_share
    monkeypatch.undo()  # decoded whole to compare them
    whole_samples = decode_audio(bytes(memoryview(whole.audio)), codec)
    streamed_samples = decode_audio(bytes(memoryview(streamed.audio)), codec)
    # soxr streamed and in one call differ by the filter's rounding: at most one 16-bit step.
    assert np.max(np.abs(streamed_samples - whole_samples)) <= 1 / 32768 + 1e-9
    assert np.mean(streamed_samples != whole_samples) < 0.01
    assert abs(float(streamed_samples.mean())) < 1e-3  # the DC offset went, as in the whole path


def test_a_segment_of_a_long_file_is_streamed_from_its_start(half_minute_budget):
    recording = stereo_recording()
    streamed = normalize(recording, "pcm16", 10.0, 50.0)
    assert streamed.n_samples == 40 * 24_000


def test_a_streamed_recording_keeps_the_whole_paths_rejects(half_minute_budget):
    rejected = normalize(stereo_recording(silent=True), "pcm16")
    assert isinstance(rejected, Reject) and rejected.reason == "digital_silence"


def test_past_the_long_form_limit_a_recording_is_refused_from_its_header(half_minute_budget, monkeypatch):
    monkeypatch.setattr(budget, "MAX_LONG_FORM_SECONDS", 60.0)
    rejected = normalize(stereo_recording(), "pcm16")
    assert isinstance(rejected, Reject) and rejected.reason == budget.OVER_BUDGET_REASON
    assert "75.0 s of audio, over the landed long-form limit of 60 s" in rejected.detail
