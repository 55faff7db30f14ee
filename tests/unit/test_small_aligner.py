"""The small profile's trained aligner loads through the production path and aligns held-out speech.

The held-out utterances (tests/fixtures/synthesized_speech/, written by
``python -m benchmarks.accuracy.bench_alignment_accuracy --write-fixtures``) are voices the model never heard
saying sentences it never saw, each word synthesized alone so its true boundaries are known.
"""

import json
from pathlib import Path

import jiwer
import numpy as np
import pytest
import soundfile as sf

from resources.aligner import CtcAlignerResource
from speechdata.alignment.acoustic_models import SMALL_MODEL_DIR, load_ctc_model
from speechdata.alignment.forced import align_transcript
from speechdata.alignment.greedy import greedy_transcript, normalized_reference
from speechdata.alignment.log_probs import compute_log_probs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "synthesized_speech"


def heldout(language: str, count: int) -> list[dict]:
    entries = [e for e in json.loads((FIXTURES / "heldout.json").read_text()) if e["language"] == language]
    for entry in entries[:count]:
        entry["audio"], _ = sf.read(FIXTURES / f"{entry['utt_id']}.flac", dtype="float32")
    return entries[:count]


@pytest.fixture(scope="module")
def small_aligners(tmp_path_factory):
    resource = CtcAlignerResource(
        models={"en": "small", "de": "small"}, device="cpu", model_cache_dir=str(tmp_path_factory.mktemp("models"))
    )
    return {language: resource.aligner_for(language) for language in ("en", "de")}


def test_the_committed_model_loads_through_the_production_loader(tmp_path):
    acoustic = load_ctc_model("small", cache_dir=tmp_path)
    assert type(acoustic.model).__name__ == "ParakeetForCTC"
    assert acoustic.frame_s == pytest.approx(0.04)
    assert (SMALL_MODEL_DIR / "model.safetensors").stat().st_size <= 30 * 1024 * 1024
    assert json.loads((SMALL_MODEL_DIR / "training.json").read_text())["languages"] == ["en", "de"]


@pytest.mark.parametrize("language, max_cer", [("en", 0.5), ("de", 0.5)])
def test_it_transcribes_held_out_speech_in_words(small_aligners, language, max_cer):
    """The model emits its word delimiter ``|`` between words, so its greedy transcript, and the
    pseudo-label of an utterance landed without text, have as many words as were spoken (give or
    take one), close in spelling (the spaced CER counts a missed or extra word break as an error)."""
    from speechdata.alignment.pseudo_labels import pseudo_label

    aligner = small_aligners[language]
    entries = heldout(language, 3)
    log_probs = compute_log_probs(aligner.forward, [e["audio"] for e in entries])
    for entry, scores in zip(entries, log_probs, strict=True):
        reference = normalized_reference(entry["text"], aligner.vocabulary)
        hypothesis = greedy_transcript(scores, aligner.vocabulary)
        assert jiwer.cer(reference, hypothesis) < max_cer, (entry["utt_id"], reference, hypothesis)
        label = pseudo_label(scores, aligner.vocabulary)
        assert label.text == hypothesis and len(label.word_confidences) == len(label.words)
        assert abs(len(label.words) - len(reference.split())) <= 1, (entry["utt_id"], reference, label.text)


def test_its_emission_delay_is_calibrated_on_training_voices_only(small_aligners):
    """The model fires early by a steady amount; the offsets the aligner adds were measured on
    calibration speech of the training voices (speechdata.alignment.calibrate_emission), never on the
    held-out voices these tests and the accuracy benchmark use."""
    from speechdata.alignment.acoustic_models import EMISSION_CALIBRATION_FILE
    from speechdata.alignment.synthetic_speech import TRAIN_VARIANTS

    record = json.loads((SMALL_MODEL_DIR / EMISSION_CALIBRATION_FILE).read_text())
    offsets = (record["start_offset_ms"], record["end_offset_ms"])
    assert small_aligners["en"].emission_offsets_ms == offsets and all(0 < o <= 300 for o in offsets)
    heldout_variants = {e["voice"].split("+")[-1] for e in json.loads((FIXTURES / "heldout.json").read_text())}
    assert not heldout_variants & set(TRAIN_VARIANTS)


def test_its_words_land_on_the_true_words_better_than_spreading_them_evenly(small_aligners):
    """Every aligned word's middle lies within its true span (+-80 ms), the median boundary error is at
    most half an 80 ms frame, and the errors beat words spread over the speech in proportion to their
    letters (docs/bridge-tuples.md#alignment-accuracy)."""
    aligner = small_aligners["en"]
    entries = heldout("en", 3)
    errors, even_errors = [], []
    for entry, scores in zip(entries, compute_log_probs(aligner.forward, [e["audio"] for e in entries]), strict=True):
        duration_ms = int(len(entry["audio"]) / 16)
        alignment = align_transcript(
            scores, entry["text"], aligner.vocabulary, 40, duration_ms, emission_offsets_ms=aligner.emission_offsets_ms
        )
        truth_ms = np.array(entry["word_spans_s"]) * 1000
        letters = np.array([len(w) for w in entry["text"].split()], dtype=float)
        cuts = truth_ms[0, 0] + (truth_ms[-1, 1] - truth_ms[0, 0]) * np.concatenate(
            [[0], np.cumsum(letters) / letters.sum()]
        )
        for k, (word, (start, end)) in enumerate(zip(alignment.words, truth_ms, strict=True)):
            assert start - 80 <= (word.start_ms + word.end_ms) / 2 <= end + 80, (entry["utt_id"], word, start, end)
            errors += [abs(word.start_ms - start), abs(word.end_ms - end)]
            even_errors += [abs(cuts[k] - start), abs(cuts[k + 1] - end)]
    assert np.median(errors) < np.median(even_errors), (np.median(errors), np.median(even_errors))
    assert np.percentile(errors, 90) < 0.75 * np.percentile(even_errors, 90)
    assert np.median(errors) <= 40
    assert np.percentile(errors, 90) <= 150
