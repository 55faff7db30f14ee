"""The stages after ingest on a recording past the whole-decode budget: each reads it in windows and
gives what reading it whole gives, where both fit. The budget is lowered to 10 s so a recording of
half a minute takes the windowed paths in seconds."""

import io

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf
import torch

from speechdata.audio import budget
from speechdata.audio.clock import n_frames_for
from speechdata.audio.container import iter_container_utterances
from speechdata.features.array_store import iter_arrays
from speechdata.features.models import tiny_wavlm
from speechdata.features.speech import wavlm_features, wavlm_features_streamed
from speechdata.features.stage import run_wavlm_features
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.quality import long_form
from speechdata.quality.long_form import combine_windows
from speechdata.quality.paths import quality_signals
from speechdata.quality.speakers import EMBEDDING_SIZE, MAX_WINDOWS, SpeakerEncoder, speaker_signals
from speechdata.quality.stage import _measure_chunk, run_quality_signals
from speechdata.testing.shards import Clip, build_sample_shard, load_clips
from speechdata.vad.long_form import long_file_speech
from speechdata.vad.silero import VadParams, detect_speech, load_silero_model, to_vad_input

SHARD = "talks"


@pytest.fixture(scope="module")
def talk(tmp_path_factory):
    """A shard whose one utterance is half a minute of English speech with pauses (clips one after another)."""
    english = [c for c in load_clips() if c.language == "en"]
    rate = english[0].sample_rate
    gap = np.zeros(int(0.6 * rate), np.float32)
    picked = [c for c in english if c.sample_rate == rate and c.samples.ndim == 1][:6]
    samples = np.concatenate([piece for c in picked for piece in (gap, c.samples)])
    clip = Clip("talk", "en", " ".join(c.text for c in picked), samples, rate)
    root = DataRoot(str(tmp_path_factory.mktemp("talk") / "data"))
    build_sample_shard(root, SHARD, 1, long_recordings=0, formats=("flac",), clips=[clip])
    run_raw_shards(root, SHARD)
    run_normalized_audio(root, SHARD)
    [stored] = root.read_parquet(layout.normalized_audio(SHARD), columns=["utt_id", "n_samples"]).to_pylist()
    assert stored["n_samples"] > 20 * 24_000
    return root, stored["utt_id"], stored["n_samples"]


@pytest.fixture(scope="module")
def model():
    return tiny_wavlm()


def test_wavlm_windows_join_into_the_whole_recordings_features(model):
    rng = np.random.default_rng(0)
    t = np.arange(24_000 * 8) / 24_000
    audio = 0.3 * np.sin(2 * np.pi * 200 * t) * np.sin(2 * np.pi * 0.5 * t) + 0.05 * rng.standard_normal(t.size)
    audio = audio.astype(np.float32)
    frames = n_frames_for(audio.size)
    [whole] = wavlm_features(model, [audio], [frames], device="cpu")
    one_window = wavlm_features_streamed(model, audio, frames, device="cpu", window_frames=10_000)
    # one window is the whole path (its level measured in float64: the last float16 bit may differ)
    np.testing.assert_allclose(one_window.astype(np.float32), whole.astype(np.float32), rtol=2e-3, atol=2e-3)
    windows = wavlm_features_streamed(model, audio, frames, device="cpu", window_frames=30, context_frames=20)
    assert windows.shape == whole.shape and windows.dtype == np.float16
    a, b = windows.astype(np.float32), whole.astype(np.float32)
    cosine = (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() > 0.999  # 2 s of context each side: the joins are where the whole path is


def test_the_wavlm_stage_encodes_a_recording_past_the_budget_in_windows(talk, model, monkeypatch):
    root, utt_id, n_samples = talk
    root.write_parquet(layout.frame_grids(SHARD), pa.table({"utt_id": [utt_id], "n_frames": [n_frames_for(n_samples)]}))
    run_wavlm_features(root, SHARD, model, device="cpu", dtype=torch.float32, max_batch_s=200.0)
    [(_, whole)] = list(iter_arrays(root, layout.wavlm_features(SHARD)))
    monkeypatch.setattr(budget, "MAX_UTTERANCE_SECONDS", 10.0)  # decoding it whole would now raise
    run_wavlm_features(root, SHARD, model, device="cpu", dtype=torch.float32, max_batch_s=200.0)
    [(_, streamed)] = list(iter_arrays(root, layout.wavlm_features(SHARD)))
    assert streamed.shape == whole.shape == (n_frames_for(n_samples), model.config.hidden_size)
    a, b = streamed.astype(np.float32), whole.astype(np.float32)
    assert ((a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min() > 0.99


def test_quality_signals_of_a_recording_past_the_budget_agree_with_measuring_it_whole(talk, monkeypatch):
    root, _, n_samples = talk
    vad = load_silero_model()
    run_quality_signals(root, SHARD, vad_model=vad)
    [whole] = root.read_parquet(quality_signals(SHARD)).to_pylist()
    monkeypatch.setattr(budget, "MAX_UTTERANCE_SECONDS", 10.0)
    monkeypatch.setattr(long_form, "WINDOW_S", 6.0)
    run_quality_signals(root, SHARD, vad_model=vad)
    [windowed] = root.read_parquet(quality_signals(SHARD)).to_pylist()
    assert windowed["duration_s"] == whole["duration_s"] == n_samples / 24_000
    assert windowed["clipped_share"] == whole["clipped_share"]
    assert abs(windowed["level_dbfs"] - whole["level_dbfs"]) < 0.01  # energies add up exactly
    assert abs(windowed["speech_s"] - whole["speech_s"]) < 0.05 * whole["speech_s"]
    assert abs(windowed["silence_share"] - whole["silence_share"]) < 0.02
    assert abs(windowed["leading_silence_s"] - whole["leading_silence_s"]) < 0.2
    assert abs(windowed["trailing_silence_s"] - whole["trailing_silence_s"]) < 0.2
    assert abs(windowed["words_per_s"] - whole["words_per_s"]) < 0.05 * whole["words_per_s"]
    assert abs(windowed["snr_db"] - whole["snr_db"]) < 3.0


def test_kept_window_embeddings_are_the_even_spread_of_every_windows_embeddings():
    for counts in ([3, 0, 5], [0, 0, 0], [12, 12, 12, 0, 1] * 40, [1] * 700):
        labels = np.concatenate([np.zeros(0, int)] + [np.full(c, n) for n, c in enumerate(counts)])
        local = np.concatenate([np.zeros(0, int)] + [np.arange(c) for c in counts])
        spread = np.linspace(0, len(labels) - 1, MAX_WINDOWS).round().astype(int)
        expected = range(len(labels)) if len(labels) <= MAX_WINDOWS else spread
        picks = long_form.kept_window_embeddings(counts)
        assert [(n, i) for n, kept in picks.items() for i in kept] == [(labels[j], local[j]) for j in expected]


class _MelMeanEncoder(SpeakerEncoder):
    """Resemblyzer's windows and mel frames, each window embedded as its mean mel frame (the LSTM is
    what costs, and the selection, not the network, is what is tested here)."""

    def _embed(self, mels):
        vectors = np.zeros((len(mels), EMBEDDING_SIZE), np.float32)
        if mels:
            vectors[:, : mels[0].shape[-1]] = np.stack(mels).mean(axis=1)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def test_a_long_recordings_speaker_signals_embed_only_the_windows_they_keep(talk, monkeypatch):
    """Two passes (count every window, embed the few whose embeddings are kept) give the embeddings of
    embedding every window and spreading them; what is embedded does not grow with the recording."""
    root, utt_id, _ = talk
    [(_, samples, rate)] = list(iter_container_utterances(root, layout.normalized_audio(SHARD), {utt_id}))
    vad = load_silero_model()
    speakers = _MelMeanEncoder()
    embedded: list[int] = []
    original = speakers.window_embeddings
    monkeypatch.setattr(speakers, "window_embeddings", lambda s, r: embedded.append(len(s)) or original(s, r))

    def measure(windows, rows):
        _measure_chunk(windows, rows, {}, {}, vad, VadParams(), None, None, None)

    window_s = 1.0
    _, found = long_form.measure_long_recording(utt_id, samples, rate, "", measure, speakers, window_s=window_s)
    window = int(window_s * rate)
    every = [original(samples[start : start + window], rate) for start in range(0, len(samples), window)]
    assert len(every) > 2 * MAX_WINDOWS and 0 < len(embedded) <= MAX_WINDOWS
    all_embeddings = np.concatenate(every)
    spread = all_embeddings[np.linspace(0, len(all_embeddings) - 1, MAX_WINDOWS).round().astype(int)]
    expected = speaker_signals(spread)
    assert np.array_equal(found.embedding, expected.embedding)
    assert (found.speakers, found.overlap, found.least_window_cosine) == (
        expected.speakers,
        expected.overlap,
        expected.least_window_cosine,
    )


def test_vad_of_a_long_file_window_by_window_finds_the_whole_files_segments():
    english = [c for c in load_clips() if c.language == "en"]
    rate = english[0].sample_rate
    gap = np.zeros(int(0.7 * rate), np.float32)
    samples = np.concatenate([p for c in english[:5] if c.sample_rate == rate for p in (gap, c.samples)] + [gap])
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    buffer.seek(0)
    model = load_silero_model()
    with sf.SoundFile(buffer) as sound:
        whole_samples = sound.read(dtype="float32", always_2d=True)
        [whole] = detect_speech(model, [to_vad_input(whole_samples, rate)])
        windowed = long_file_speech(model, sound, window_s=3.0)  # windows much shorter than the file
    assert len(whole) >= 3 and len(windowed) == len(whole)
    assert np.max(np.abs(np.array(windowed.start_s) - whole.start_s)) < 0.1
    assert np.max(np.abs(np.array(windowed.end_s) - whole.end_s)) < 0.1


def test_windows_combine_energies_speech_and_silence_runs():
    def window(level, speech_s, leading, trailing, language="en"):
        return dict(
            duration_s=10.0, level_dbfs=level, speech_s=speech_s, leading_silence_s=leading,
            trailing_silence_s=trailing, bandwidth_hz=4000.0, snr_db=20.0, silence_share=0.1,
            audio_language=language, audio_language_confidence=0.9, clipped_share=0.0,
        )  # fmt: skip

    row = combine_windows(
        [window(-200.0, 0.0, 10.0, 10.0), window(-20.0, 6.0, 2.0, 1.0), window(-20.0, 4.0, 3.0, 4.0)], "a b c"
    )
    assert row["duration_s"] == 30.0 and row["speech_s"] == 10.0 and row["speech_share"] == pytest.approx(1 / 3)
    assert row["level_dbfs"] == pytest.approx(-20.0 + 10 * np.log10(2 / 3))
    assert row["leading_silence_s"] == 12.0 and row["trailing_silence_s"] == 4.0
    assert row["words_per_s"] == pytest.approx(0.3) and row["audio_language"] == "en"


def test_squim_scores_long_audio_in_pieces_averaged_by_length():
    from speechdata.quality.audio_models import SquimObjectiveMos

    seen = []

    def pesq_of_level(waveform):  # a stand-in that remembers its input: PESQ = the piece's first sample
        seen.append(waveform.shape[-1])
        return None, waveform[:, 0], None

    audio = np.concatenate([np.full(16_000 * 5, 2.0), np.full(16_000 * 5, 4.0), np.full(int(16_000 * 5.5), 3.0)])
    [score] = SquimObjectiveMos(pesq_of_level).mos([audio.astype(np.float32)])
    assert seen == [80_000, 80_000, 88_000]  # never more than 5 s at once; a last half second joins its piece
    assert score == pytest.approx((2 * 5 + 4 * 5 + 3 * 5.5) / 15.5)


def test_audio_model_batches_bound_the_padded_attention_and_keep_a_long_utterance_alone():
    from speechdata.quality.audio_models import MAX_PADDED_ATTENTION_S2, MODEL_SAMPLE_RATE, _batches

    seconds = [3, 60, 4, 5, 15, 15, 15, 15, 15, 15, 15, 15, 15, 119, 2, 2]
    audios = [np.zeros(s * MODEL_SAMPLE_RATE, np.float32) for s in seconds]
    batches = [[len(a) // MODEL_SAMPLE_RATE for a in batch] for batch in _batches(audios, 120.0)]
    assert [s for batch in batches for s in batch] == seconds  # every utterance, in order
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(batch) ** 2 <= MAX_PADDED_ATTENTION_S2
    assert [60] in batches and [119] in batches  # a long utterance is never padded beside a short one
    assert max(len(batch) for batch in batches) >= 8  # ordinary utterances still go through together


def test_the_language_id_hears_a_long_utterance_in_pieces_averaged_by_length(monkeypatch):
    from types import SimpleNamespace

    import torch
    from transformers import Wav2Vec2FeatureExtractor

    from speechdata.quality import audio_models

    heard: list[int] = []

    class LevelClassifier:  # a stand-in that remembers its input: logits (level, 0) from each piece's first sample
        config = SimpleNamespace(id2label={0: "eng", 1: "deu"})

        def __call__(self, input_values, **_):
            heard.append(input_values.shape[-1])
            return SimpleNamespace(logits=torch.stack([input_values[:, 0], torch.zeros(len(input_values))], dim=1))

    monkeypatch.setattr(audio_models, "LANGUAGE_ID_PIECE_S", 2.0)  # 30 s as 2 s: the same pieces, shorter
    extractor = Wav2Vec2FeatureExtractor(sampling_rate=16_000, do_normalize=False, return_attention_mask=True)
    lid = audio_models.AudioClassifierLanguageId(LevelClassifier(), extractor)
    rate = audio_models.MODEL_SAMPLE_RATE
    levels = np.concatenate([np.full(2 * rate, -2.0), np.full(2 * rate, 4.0), np.full(int(1.5 * rate), 3.0)])
    [(language, confidence), short] = lid.identify([levels.astype(np.float32), np.full(rate, -1.0, np.float32)])
    assert max(heard) <= 2 * rate  # never more than one piece at once, however long the utterance
    sigmoid = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    expected = (sigmoid(-2.0) * 2 + sigmoid(4.0) * 2 + sigmoid(3.0) * 1.5) / 5.5
    assert language == "en" and confidence == pytest.approx(expected, rel=1e-6)
    assert short == ("de", pytest.approx(1 - sigmoid(-1.0), rel=1e-6))  # up to one piece: heard whole
