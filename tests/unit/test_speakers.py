"""Speaker embeddings, speaker count and per-shard clusters on the committed espeak-ng readings
(tests/integration/test_near_duplicate_readings.py: what the stages make of them on a landed shard)."""

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from speechdata.audio.codec import resample
from speechdata.quality.speakers import (
    EMBEDDING_SIZE,
    ENCODER_SAMPLE_RATE,
    SAME_SPEAKER_MIN_COSINE,
    cluster_embeddings,
    shard_speaker_clusters,
    shipped_speaker_encoder,
    speaker_cosine,
    speaker_signals,
)

READINGS = Path(__file__).resolve().parents[1] / "fixtures" / "readings"


@pytest.fixture(scope="module")
def readings():
    """``{(sentence, reading): (samples, rate, text)}`` of the committed fixtures."""
    found = {}
    for row in json.loads((READINGS / "readings.json").read_text()):
        samples, rate = sf.read(READINGS / row["file"], dtype="float32")
        found[(row["sentence"], row["reading"])] = (samples, rate, row["text"])
    return found


@pytest.fixture(scope="module")
def evidence(readings):
    encoder = shipped_speaker_encoder()
    encoder.forget()  # all of them embedded here, in one batch
    found = encoder.signals_many([(samples, rate) for samples, rate, _ in readings.values()])
    return dict(zip(readings, found, strict=True))


def test_embeddings_are_unit_vectors_that_tell_voices_apart(evidence):
    for signals in evidence.values():
        assert signals.embedding.shape == (EMBEDDING_SIZE,) and signals.embedding.dtype == np.float32
        assert abs(float(np.linalg.norm(signals.embedding)) - 1.0) < 1e-4
        assert signals.speakers == 1 and not signals.overlap
    for sentence in ("s1", "s2", "s3"):
        again = speaker_cosine(evidence[(sentence, "male")].embedding, evidence[(sentence, "male_slow")].embedding)
        assert again >= SAME_SPEAKER_MIN_COSINE
        for other in ("female", "female2"):
            assert speaker_cosine(evidence[(sentence, "male")].embedding, evidence[(sentence, other)].embedding) < (
                SAME_SPEAKER_MIN_COSINE
            )
        assert (
            speaker_cosine(evidence[(sentence, "female")].embedding, evidence[(sentence, "female2")].embedding)
            < SAME_SPEAKER_MIN_COSINE
        )


def test_a_batch_embeds_as_one_utterance_at_a_time_and_is_remembered_by_its_audio(readings, evidence):
    encoder = shipped_speaker_encoder()
    remembered = encoder.window_embeddings(*readings[("s1", "male")][:2])
    # The same audio at another rate resamples to the same 16 kHz samples: embedded once, not again.
    samples, rate, _ = readings[("s1", "male")]
    assert encoder.window_embeddings(resample(samples, rate, ENCODER_SAMPLE_RATE), ENCODER_SAMPLE_RATE) is remembered
    encoder.forget()
    for key in [("s1", "male"), ("s1", "female")]:
        windows = encoder.window_embeddings(*readings[key][:2])  # alone, against the fixture's batch
        assert len(windows) > 1 and speaker_signals(windows).speakers == evidence[key].speakers
        embedding = speaker_signals(windows).embedding
        assert np.allclose(embedding, evidence[key].embedding, atol=1e-6)
        assert np.array_equal(embedding.astype(np.float16), evidence[key].embedding.astype(np.float16))


def test_a_speaker_change_inside_an_utterance_is_counted_and_flagged(readings):
    male, rate, _ = readings[("s1", "male")]
    female, _, _ = readings[("s2", "female")]
    signals = shipped_speaker_encoder().signals(np.concatenate([male, female]), rate)
    assert signals.speakers == 2 and signals.overlap


def test_silence_and_very_short_audio_have_no_embedding():
    encoder = shipped_speaker_encoder()
    assert encoder.signals(np.zeros(32_000, np.float32), 16_000).embedding is None
    assert encoder.signals(np.full(4_000, 0.1, np.float32), 16_000).speakers == 0


def test_shard_clusters_group_each_voice_and_number_them_in_order(evidence):
    keys = sorted(evidence)  # (sentence, reading): s1 female, s1 female2, s1 male, s1 male_slow, s2 ...
    clusters = shard_speaker_clusters([evidence[key].embedding for key in keys] + [None])
    assert clusters[-1] is None
    voice = {"female": "f", "female2": "f2", "male": "m", "male_slow": "m"}
    by_voice: dict[str, set[int]] = {}
    for key, cluster in zip(keys, clusters, strict=False):
        by_voice.setdefault(voice[key[1]], set()).add(cluster)
    assert all(len(found) == 1 for found in by_voice.values()), by_voice
    assert len({next(iter(found)) for found in by_voice.values()}) == 3
    assert clusters[:3] == [0, 1, 2]
    assert cluster_embeddings(np.zeros((0, EMBEDDING_SIZE))).tolist() == []
