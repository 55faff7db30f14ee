"""The per-utterance memory budget, at the two places audio is decoded: a landed file (or a segment
of it) and a stored utterance of ``audio_24k.parquet``. Refused from the header, before decoding."""

import io

import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from speechdata.audio import budget
from speechdata.audio.budget import OVER_BUDGET_REASON, OverMemoryBudget, audio_budget_problem
from speechdata.audio.codec import decode_audio, decode_pcm16, encode_audio, read_segment_from
from speechdata.audio.container import AUDIO_CONTAINER_SCHEMA, AudioContainerWriter, EncodedUtterance


@pytest.fixture
def ten_second_budget(monkeypatch):
    monkeypatch.setattr(budget, "MAX_UTTERANCE_SECONDS", 10.0)


def wav(seconds: float, rate: int = 8_000) -> io.BytesIO:
    buffer = io.BytesIO()
    sf.write(buffer, np.full(int(seconds * rate), 0.1, np.float32), rate, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    return buffer


def test_a_landed_file_over_the_budget_is_refused_but_a_short_segment_of_it_is_read(ten_second_budget):
    with sf.SoundFile(wav(30.0)) as sound:
        with pytest.raises(OverMemoryBudget, match="30.0 s of audio, over the per-utterance memory budget of 10 s"):
            read_segment_from(sound, None, None)
        assert sound.tell() == 0  # nothing was read
        assert read_segment_from(sound, 12.0, 17.0).shape == (5 * 8_000, 1)


def test_a_stored_utterance_over_the_budget_is_refused_before_decoding(ten_second_budget):
    samples = np.full(24_000 * 11, 0.1, np.float32)
    for codec in ("pcm16", "flac16", "flac24"):
        with pytest.raises(OverMemoryBudget) as refused:
            decode_audio(encode_audio(samples, 24_000, codec), codec)
        assert refused.value.reason == OVER_BUDGET_REASON
    with pytest.raises(OverMemoryBudget):
        decode_pcm16(encode_audio(samples, 24_000, "pcm16"), "pcm16")
    assert decode_audio(encode_audio(samples[: 24_000 * 9], 24_000, "pcm16"), "pcm16").shape == (24_000 * 9,)


def test_the_container_never_stores_an_utterance_over_the_budget(tmp_path, ten_second_budget):
    with pq.ParquetWriter(tmp_path / "a.parquet", AUDIO_CONTAINER_SCHEMA) as writer:
        container = AudioContainerWriter(writer)
        with pytest.raises(OverMemoryBudget, match="utterance 'long'"):
            container.add(EncodedUtterance("long", 24_000, 24_000 * 11, "pcm16", np.zeros(24_000 * 11, "<i2")))


def test_the_decoded_bytes_bound_catches_many_channels_at_a_high_rate():
    assert audio_budget_problem(384_000 * 600, 384_000, 8) is not None  # 10 min, 8 channels at 384 kHz
    assert audio_budget_problem(48_000 * 600, 48_000, 2) is None


def test_a_vad_batch_never_pads_more_audio_than_the_budget():
    from speechdata.vad.stage import AudioFile, _batches

    files = [AudioFile(f"{n}.wav", [str(n)], None, seconds) for n, seconds in enumerate([5.0] * 10 + [1500.0, 5.0])]
    batches = [[f.audio_path for f in batch] for batch in _batches(files, 64)]
    # The 25-minute file would pad eleven others to 25 minutes each: it goes alone.
    assert batches == [[f"{n}.wav" for n in range(10)], ["10.wav"], ["11.wav"]]
    assert [len(b) for b in _batches(files[:10], 4)] == [4, 4, 2]
    for batch in _batches(files, 64):
        assert len(batch) == 1 or len(batch) * max(f.duration_s for f in batch) <= 1800.0
