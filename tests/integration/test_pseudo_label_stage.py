"""The alignments stage on utterances landed without text: a model's known greedy path becomes the label."""

import numpy as np
import pytest

from speechdata.alignment.log_probs import CTC_FRAME_S, MODEL_SAMPLE_RATE
from speechdata.alignment.stage import CtcAligner, run_alignments
from speechdata.alignment.transcript_units import CharVocabulary
from speechdata.io import layout
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from tests.conftest import encode, land_shard, tone

VOCABULARY = CharVocabulary(list(" ab"))  # separator 0, a 1, b 2, blank 3
FRAME_SAMPLES = int(CTC_FRAME_S * MODEL_SAMPLE_RATE)
SPOKEN_PATH = [3, 1, 1, 2, 3, 0, 2, 1, 1, 3]  # "ab ba"


def path_log_probs(labels: list[int], num_frames: int, posterior: float) -> np.ndarray:
    labels = (labels + [3] * num_frames)[:num_frames]
    probs = np.full((num_frames, 4), (1 - posterior) / 3)
    probs[np.arange(num_frames), labels] = posterior
    return np.log(probs).astype(np.float32)


def known_aligner() -> CtcAligner:
    """A 'model' that hears "ab ba" in 2-second audio and nothing in 1-second audio."""

    def forward(batch: list[np.ndarray]) -> list[np.ndarray]:
        out = []
        for audio in batch:
            frames = -(-audio.shape[0] // FRAME_SAMPLES)
            out.append(path_log_probs(SPOKEN_PATH if audio.shape[0] > MODEL_SAMPLE_RATE else [], frames, 0.9))
        return out

    return CtcAligner("known-ctc", forward, VOCABULARY, CTC_FRAME_S)


def test_utterances_without_text_are_labelled_aligned_or_rejected_and_the_ledger_balances(data_root):
    rate = 16_000
    land_shard(
        data_root,
        "p",
        [
            {"utt_id": "spoken", "audio_path": "two.wav", "text": None, "language": "en"},
            {"utt_id": "silent", "audio_path": "one.wav", "text": "   ", "language": "en"},
            {"utt_id": "landed", "audio_path": "two.wav", "text": "Ab, ba!", "language": "en"},
        ],
        {"two.wav": encode(tone(2.0, rate), rate), "one.wav": encode(tone(1.0, rate), rate)},
    )
    run_raw_shards(data_root, "p")
    run_normalized_audio(data_root, "p")
    summary = run_alignments(data_root, "p", lambda language: known_aligner(), write_ctm_files=False)

    rejects = {r["utt_id"]: r["reason"] for r in data_root.read_parquet(layout.rejects("p", "alignments")).to_pylist()}
    assert rejects == {"silent": "no_words_recognized"}
    scores = {s["utt_id"]: s for s in data_root.read_parquet(layout.alignment_scores("p")).to_pylist()}
    spoken, landed = scores["spoken"], scores["landed"]
    assert (spoken["text_source"], spoken["asr_text"]) == ("asr", "ab ba")
    assert spoken["asr_confidence"] == pytest.approx(0.9, abs=1e-5)
    assert spoken["asr_word_confidences"] == pytest.approx([0.9, 0.9], abs=1e-5)
    assert (landed["text_source"], landed["asr_text"], landed["asr_confidence"]) == ("landed", None, None)
    words = [r for r in data_root.read_parquet(layout.alignments("p")).to_pylist() if r["level"] == "word"]
    assert [(w["utt_id"], w["text"], w["start_ms"], w["end_ms"]) for w in words] == [
        ("landed", "Ab,", 80, 320),
        ("landed", "ba!", 480, 720),
        ("spoken", "ab", 80, 320),
        ("spoken", "ba", 480, 720),
    ]
    # The quality stage's CER compares the landed text only: a label is not judged against itself.
    hypotheses = data_root.read_parquet("shards/p/greedy_hypotheses.parquet")["utt_id"].to_pylist()
    assert hypotheses == ["landed"]
    assert summary.rows_in == 3 == summary.rows_out + len(summary.rejects)
