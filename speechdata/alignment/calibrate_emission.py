"""Measure a trained CTC model's emission delay and write it beside the model.

    python -m speechdata.alignment.calibrate_emission --model speechdata/alignment/small_model

A CTC model trained briefly with full self-attention places its label spikes early by a steady
amount (:data:`~speechdata.alignment.acoustic_models.EMISSION_CALIBRATION_FILE` says why). This
synthesizes calibration speech whose word times are known by construction (each word synthesized
alone and joined with known gaps, :func:`~speechdata.alignment.synthetic_speech.synthesize_words`),
with the TRAINING voices and a seed of its own, so the held-out set of
``benchmarks/accuracy/bench_alignment_accuracy.py`` (other voices) never informs the correction. It aligns
the speech uncorrected through the platform's own functions and stores the median signed start and
end errors, rounded to 10 ms, as the offsets the aligner adds. Needs Debian's ``espeak-ng``; the
result is committed with the model, so nothing downstream does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

CALIBRATION_SEED = 104_729
UTTERANCES_PER_LANGUAGE = {"en": 30, "de": 10}


def calibration_utterances(seed: int = CALIBRATION_SEED):
    """(language, SynthesizedUtterance) with known word spans, training voices, deterministic."""
    from speechdata.alignment.synthetic_speech import pad_silence, pick_voice, sentence, synthesize_words

    rng = np.random.default_rng(seed)
    for language, count in UTTERANCES_PER_LANGUAGE.items():
        for _ in range(count):
            voice = pick_voice(rng, language)
            words = sentence(rng, language, min_words=5, max_words=9).split()
            yield language, pad_silence(synthesize_words(words, voice, rng), rng, pad_s=(0.2, 0.4))


def signed_errors_ms(
    model_dir: str, utterances, separator_policy: str | None = None
) -> tuple[np.ndarray, np.ndarray, str]:
    """Per word: found minus true start and end in ms, aligned with no emission offsets, and how word
    separators were aligned (``separator_policy``; None: the model vocabulary's own)."""
    from speechdata.alignment.acoustic_models import load_ctc_model
    from speechdata.alignment.forced import align_transcript
    from speechdata.alignment.log_probs import compute_log_probs, ctc_model_forward
    from speechdata.alignment.synthetic_speech import SAMPLE_RATE
    from speechdata.alignment.transcript_units import vocabulary_of

    acoustic = load_ctc_model(model_dir, cache_dir=".cache/models")
    forward, vocabulary = ctc_model_forward(acoustic, "cpu"), vocabulary_of(acoustic)
    frame_ms = int(round(acoustic.frame_s * 1000))
    separator_policy = separator_policy or vocabulary.separator_policy
    starts, ends = [], []
    for language, utterance in utterances:
        [log_probs] = compute_log_probs(forward, [utterance.audio])
        duration_ms = int(round(len(utterance.audio) / SAMPLE_RATE * 1000))
        alignment = align_transcript(
            log_probs,
            utterance.text,
            vocabulary,
            frame_ms,
            duration_ms,
            language=language,
            separator_policy=separator_policy,
        )
        for word, (true_start, true_end) in zip(alignment.words, utterance.word_spans_s, strict=True):
            starts.append(word.start_ms - true_start * 1000)
            ends.append(word.end_ms - true_end * 1000)
    return np.asarray(starts), np.asarray(ends), separator_policy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(Path(__file__).resolve().parent / "small_model"))
    parser.add_argument(
        "--separator-policy",
        choices=("required", "optional"),
        default=None,
        help="how word separators are aligned while measuring (default: the model vocabulary's own)",
    )
    args = parser.parse_args(argv)
    from speechdata.alignment.acoustic_models import EMISSION_CALIBRATION_FILE

    starts, ends, policy = signed_errors_ms(args.model, calibration_utterances(), args.separator_policy)
    record = {
        # The aligner adds these: minus the median signed error, to the nearest 10 ms.
        "start_offset_ms": -int(round(float(np.median(starts)) / 10) * 10),
        "end_offset_ms": -int(round(float(np.median(ends)) / 10) * 10),
        "measured_on": {
            "words": int(starts.size),
            "utterances_per_language": UTTERANCES_PER_LANGUAGE,
            "seed": CALIBRATION_SEED,
            "separator_policy": policy,
            "voices": "training voices (synthetic_speech.TRAIN_VARIANTS), words synthesized alone, known gaps",
            "start_error_ms_p5_median_p95": [round(float(np.percentile(starts, q)), 1) for q in (5, 50, 95)],
            "end_error_ms_p5_median_p95": [round(float(np.percentile(ends, q)), 1) for q in (5, 50, 95)],
        },
    }
    (Path(args.model) / EMISSION_CALIBRATION_FILE).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record))


if __name__ == "__main__":
    main()
