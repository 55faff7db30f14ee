"""An utterance too long to align within the configured memory bound is a reject, not a dead run."""

import numpy as np

from speechdata.alignment.forced import MAX_ALIGNMENT_FRAME_TOKENS, alignment_size_problem
from speechdata.alignment.log_probs import CTC_FRAME_S, MODEL_SAMPLE_RATE
from speechdata.alignment.long_form import checkpointed_memory_bytes
from speechdata.alignment.segmentation import MAX_SEGMENT_MS
from speechdata.alignment.stage import CtcAligner, run_alignments
from speechdata.alignment.transcript_units import CharVocabulary
from speechdata.io import layout
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from tests.conftest import encode, land_shard, tone

VOCABULARY = CharVocabulary(list(" abcdefghijklmnopqrstuvwxyz'"))
FRAME_SAMPLES = int(CTC_FRAME_S * MODEL_SAMPLE_RATE)


def random_log_probs(num_frames: int, seed: int = 0) -> np.ndarray:
    logits = np.random.default_rng(seed).standard_normal((num_frames, VOCABULARY.blank_id + 1)).astype(np.float32)
    return logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))


def recording_aligner(seen_samples: list[int]) -> CtcAligner:
    """A CTC 'model' of random log-probs that records the length of every audio it is given."""

    def forward(batch: list[np.ndarray]) -> list[np.ndarray]:
        seen_samples.extend(audio.shape[0] for audio in batch)
        return [random_log_probs(-(-audio.shape[0] // FRAME_SAMPLES)) for audio in batch]

    return CtcAligner("random-ctc", forward, VOCABULARY, CTC_FRAME_S)


def test_a_long_utterance_is_rejected_before_its_log_probs_and_the_ledger_balances(data_root):
    rate = 16_000
    long_text = " ".join(["speech", "data", "needs", "exact", "alignment"] * 20)  # 100 words, ~600 tokens
    land_shard(
        data_root,
        "long",
        [
            {"utt_id": "lecture", "audio_path": "lecture.wav", "text": long_text},
            {"utt_id": "short", "audio_path": "short.wav", "text": "hello there"},
        ],
        {"lecture.wav": encode(tone(60.0, rate), rate), "short.wav": encode(tone(3.0, rate), rate)},
    )
    run_raw_shards(data_root, "long")
    run_normalized_audio(data_root, "long")
    seen: list[int] = []
    limit = 100_000  # 750 frames x ~600 tokens is over it; 38 frames x 11 tokens is not
    summary = run_alignments(
        data_root, "long", lambda language: recording_aligner(seen), write_ctm_files=False, max_frame_tokens=limit
    )

    rejects = {r["utt_id"]: r for r in data_root.read_parquet(layout.rejects("long", "alignments")).to_pylist()}
    assert rejects["lecture"]["reason"] == "too_long_to_align"
    assert f"exceeds the limit of {limit} (max_frame_tokens" in rejects["lecture"]["detail"]
    assert "750 frames x" in rejects["lecture"]["detail"]
    assert seen == [3 * MODEL_SAMPLE_RATE]  # the long utterance never reached the model
    scores = data_root.read_parquet(layout.alignment_scores("long"))
    assert scores["utt_id"].to_pylist() == ["short"]
    assert summary.rows_in == 2 == summary.rows_out + len(summary.rejects)


def test_a_two_hour_utterance_with_a_17000_word_transcript_is_within_the_default_limit_and_bounded_memory():
    two_hours_frames = int(2 * 3600 / CTC_FRAME_S)
    tokens = 50_999  # " ".join(["ab"] * 17_000): ~9 GB of back-pointers for the whole-matrix Viterbi
    assert alignment_size_problem(two_hours_frames, tokens, MAX_ALIGNMENT_FRAME_TOKENS) is None
    assert checkpointed_memory_bytes(two_hours_frames, tokens) < 160 * 2**20
    # pathological input still stops at the limit, before any memory is spent
    problem = alignment_size_problem(two_hours_frames, 400_000, MAX_ALIGNMENT_FRAME_TOKENS)
    assert f"90000 frames x 400000 tokens = {90000 * 400_000} frame-tokens" in problem
    assert f"limit of {MAX_ALIGNMENT_FRAME_TOKENS}" in problem


def test_a_long_utterance_streams_in_windows_and_one_past_the_long_form_budget_is_a_reject(data_root, monkeypatch):
    import speechdata.alignment.stage as stage
    import speechdata.alignment.streamed_audio as streamed_audio

    rate = 16_000
    land_shard(
        data_root,
        "longform",
        [
            {"utt_id": "lecture", "audio_path": "lecture.wav", "text": " ".join(["speech", "data"] * 30)},
            {"utt_id": "audiobook", "audio_path": "audiobook.wav", "text": "far too long"},
        ],
        {"lecture.wav": encode(tone(60.0, rate), rate), "audiobook.wav": encode(tone(90.0, rate), rate)},
    )
    run_raw_shards(data_root, "longform")
    run_normalized_audio(data_root, "longform")
    monkeypatch.setattr(streamed_audio, "STREAM_FROM_S", 20.0)  # 60 s streams as two hours would
    monkeypatch.setattr(stage, "MAX_LONG_FORM_SECONDS", 75.0)
    streamed: list[int] = []
    real_init = streamed_audio.StreamedAudio.__init__

    def spy(self, *args):
        real_init(self, *args)
        streamed.append(self.shape[0])

    monkeypatch.setattr(streamed_audio.StreamedAudio, "__init__", spy)
    seen: list[int] = []
    summary = run_alignments(data_root, "longform", lambda language: recording_aligner(seen), write_ctm_files=False)

    assert streamed == [60 * MODEL_SAMPLE_RATE]  # the lecture; the audiobook was never decoded
    assert max(seen) <= 40 * MODEL_SAMPLE_RATE  # the model saw windows, never the whole
    assert sum(seen) > 60 * MODEL_SAMPLE_RATE  # windows with context overlap
    [reject] = data_root.read_parquet(layout.rejects("longform", "alignments")).to_pylist()
    assert (reject["utt_id"], reject["reason"]) == ("audiobook", "audio_over_memory_budget")
    assert "long-form budget of 75 s" in reject["detail"]
    scores = data_root.read_parquet(layout.alignment_scores("longform")).to_pylist()
    assert [(s["utt_id"], s["n_words"], s["n_frames"]) for s in scores] == [("lecture", 60, 750)]
    assert scores[0]["untranscribed_ms"] == sum(s["end_ms"] - s["start_ms"] for s in scores[0]["untranscribed"])
    assert summary.rows_in == 2
    # 60 s is more than one training sample: segments of at most MAX_SEGMENT_MS, covering every word once
    rows = data_root.read_parquet(layout.alignments("longform")).to_pylist()
    segments = [r for r in rows if r["level"] == "segment"]
    words = [r["text"] for r in rows if r["level"] == "word"]
    assert len(segments) >= 2 and all(r["end_ms"] - r["start_ms"] <= MAX_SEGMENT_MS + 400 for r in segments)
    assert " ".join(r["text"] for r in segments) == " ".join(words)

    # a GPU worker's read-ahead holds the long utterance streamed too, and gives the same outputs
    import speechdata.alignment.shard_inputs as shard_inputs

    monkeypatch.setattr(shard_inputs, "MAX_LONG_FORM_SECONDS", 75.0)
    inputs = shard_inputs.read_alignment_inputs(data_root, "longform")
    held = {item.utt_id: item.audio_16k for item in inputs.audio}
    assert isinstance(held["lecture"], streamed_audio.StreamedAudio) and held["audiobook"] is None
    run_alignments(data_root, "longform", lambda language: recording_aligner([]), write_ctm_files=False, inputs=inputs)
    assert data_root.read_parquet(layout.alignments("longform")).to_pylist() == rows
