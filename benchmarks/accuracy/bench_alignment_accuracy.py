"""Alignment accuracy in milliseconds: the small profile's trained aligner against the truth, beside pocketsphinx.

Why: the platform claims speech "exactly aligned" on the 12.5 Hz clock; this measures how exact.

Input: the held-out utterances committed in ``tests/fixtures/synthesized_speech/`` (16 kHz FLAC and
``heldout.json``), written once by ``--write-fixtures`` (needs Debian's ``espeak-ng``): sentences
from a seed the training never used, spoken by voice variants it never heard
(:data:`speechdata.alignment.synthetic_speech.HELD_OUT_VARIANTS`). Word boundaries are known by
construction: each word synthesized alone, its leading and trailing silence trimmed (10 ms frames
more than 35 dB under the word's loudest frame are silence), the words joined with 30-300 ms gaps
of silence, 0.2-0.4 s of silence around the utterance; half of them get pink noise at 25 dB SNR.

Measured, for each aligner on the same audio and text:

* ``platform``: the ``small`` model through the platform's own path (``CtcAlignerResource`` ->
  ``compute_log_probs`` -> ``align_transcript``, as the ``alignments`` stage runs it);
* ``pocketsphinx``: pocketsphinx 5.1.1's forced alignment (``Decoder.set_align_text``, its en-US
  model; English only), the independent reference.

Figures: median and 95th percentile of the absolute word start and end errors in ms, and of both
together (``boundary``); and for the platform, the share of 80 ms frames whose frame-grid token
(the bridge's ``build_frame_grid`` over the tiny text tokenizer) equals the grid built from the
true word times. Per language, the model's pseudo-labels (its greedy transcript, as an utterance
landed without text gets it) against the normalized text: WER, CER, letter CER, words found per
true word, confidence; and the CER ``transcript_mismatch`` judges with the right transcript, a
swapped one, and the first half and third of the audio. ``--quick`` runs three English utterances.

``--baseline-model DIR`` measures another model directory beside it in the same run (the model a
retrained one replaces); ``--separator-policy required|optional`` (repeatable) also aligns the word
separator that way (:data:`speechdata.alignment.forced.SEPARATOR_POLICIES`).

    python -m benchmarks.accuracy.bench_alignment_accuracy
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from benchmarks.report import emit, progress, stdout_to_stderr

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "synthesized_speech"
HELDOUT_SEED = 7_919
HELDOUT_VOICES = {
    "en": ("en-us+f4", "en-gb+m7", "en-us+steph", "en-gb-scotland+f4"),
    "de": ("de+m7", "de+f4"),
}
PER_VOICE = {"en": 3, "de": 2}
BRIDGE_SAMPLE_RATE = 24_000


def write_fixtures(directory: Path = FIXTURES) -> None:
    """Synthesize the held-out set into ``directory`` (deterministic; needs ``espeak-ng``)."""
    import soundfile as sf

    from speechdata.alignment.synthetic_speech import (
        SAMPLE_RATE,
        Voice,
        add_noise,
        pad_silence,
        sentence,
        synthesize_words,
    )

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(HELDOUT_SEED)
    entries = []
    for language, voices in HELDOUT_VOICES.items():
        for voice_name in voices:
            for k in range(PER_VOICE[language]):
                voice = Voice(language, voice_name, int(rng.integers(140, 191)), int(rng.integers(35, 66)))
                words = sentence(rng, language, min_words=5, max_words=9).split()
                utterance = pad_silence(synthesize_words(words, voice, rng), rng, pad_s=(0.2, 0.4))
                audio = utterance.audio
                if k % 2 == 1:
                    audio = add_noise(audio, rng, 25.0, pink=True)
                utt_id = f"heldout-{language}-{len(entries):02d}"
                peak = float(np.abs(audio).max())
                sf.write(directory / f"{utt_id}.flac", audio / max(peak, 1.0) * 0.9, SAMPLE_RATE, subtype="PCM_16")
                entries.append(
                    {
                        "utt_id": utt_id,
                        "language": language,
                        "voice": voice_name,
                        "speed": voice.speed,
                        "pitch": voice.pitch,
                        "text": utterance.text,
                        "word_spans_s": [[round(s, 4), round(e, 4)] for s, e in utterance.word_spans_s],
                    }
                )
    (directory / "heldout.json").write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")


def load_heldout(directory: Path = FIXTURES) -> list[dict]:
    import soundfile as sf

    entries = json.loads((directory / "heldout.json").read_text())
    for entry in entries:
        audio, rate = sf.read(directory / f"{entry['utt_id']}.flac", dtype="float32")
        entry["audio"], entry["rate"] = audio, rate
    return entries


def platform_runs(
    entries: list[dict], model_cache_dir: str, model: str = "small", separator_policy: str | None = None
) -> list[dict]:
    """Per entry, through the resource and the alignment stage's functions: the word spans (s) of
    the transcript's forced alignment and the pseudo-label (greedy transcript) with its reference,
    the transcript normalized through the model's vocabulary as the stage normalizes it."""
    from resources.aligner import CtcAlignerResource
    from speechdata.alignment.forced import align_transcript
    from speechdata.alignment.greedy import greedy_transcript, normalized_reference, tokens_to_text
    from speechdata.alignment.log_probs import compute_log_probs
    from speechdata.alignment.pseudo_labels import pseudo_label
    from speechdata.alignment.transcript_units import ctc_targets

    resource = CtcAlignerResource(models={"en": model, "de": model}, device="cpu", model_cache_dir=model_cache_dir)
    runs = []
    for entry in entries:
        aligner = resource.aligner_for(entry["language"])
        [log_probs] = compute_log_probs(aligner.forward, [entry["audio"]])
        duration_ms = int(round(len(entry["audio"]) / entry["rate"] * 1000))
        alignment = align_transcript(
            log_probs,
            entry["text"],
            aligner.vocabulary,
            int(round(aligner.frame_s * 1000)),
            duration_ms,
            language=entry["language"],
            emission_offsets_ms=aligner.emission_offsets_ms,
            separator_policy=separator_policy,
        )
        label = pseudo_label(log_probs, aligner.vocabulary)
        samples = len(entry["audio"])
        first_half, first_third = compute_log_probs(
            aligner.forward, [entry["audio"][: samples // 2], entry["audio"][: samples // 3]]
        )
        # Spaced between words whatever the vocabulary, so a model without a separator scores its one long word.
        targets = ctc_targets(entry["text"], aligner.vocabulary, entry["language"])
        reference = " ".join(
            tokens_to_text(targets.targets[a:b], aligner.vocabulary) for a, b in targets.word_target_ranges
        )
        runs.append(
            {
                "spans": [(w.start_ms / 1000, w.end_ms / 1000) for w in alignment.words],
                "pseudo_label": label.text,
                "pseudo_label_confidence": label.confidence,
                "reference": " ".join(reference.split()),
                # What transcript_mismatch compares (the quality stage's greedy hypotheses).
                "mismatch_reference": normalized_reference(entry["text"], aligner.vocabulary, entry["language"]),
                "greedy": greedy_transcript(log_probs, aligner.vocabulary),
                "greedy_first_half": greedy_transcript(first_half, aligner.vocabulary),
                "greedy_first_third": greedy_transcript(first_third, aligner.vocabulary),
            }
        )
    return runs


def pseudo_label_figures(runs: list[dict], durations_s: list[float]) -> dict:
    """Pseudo-labels against the normalized transcripts over the whole set (jiwer): WER, CER, the CER
    of the letters alone (spaces dropped on both sides), words found per true word, words per
    second, and the mean confidence."""
    import jiwer

    references = [r["reference"] for r in runs]
    hypotheses = [r["pseudo_label"] for r in runs]
    words_found = sum(len(h.split()) for h in hypotheses)

    def letters(texts: list[str]) -> list[str]:
        return ["".join(t.split()) for t in texts]

    return {
        "wer": round(float(jiwer.wer(references, hypotheses)), 4),
        "cer": round(float(jiwer.cer(references, hypotheses)), 4),
        "letter_cer": round(float(jiwer.cer(letters(references), letters(hypotheses))), 4),
        "words_found_per_true_word": round(words_found / sum(len(r.split()) for r in references), 3),
        "words_per_s": round(words_found / sum(durations_s), 3),
        "mean_confidence": round(float(np.mean([r["pseudo_label_confidence"] for r in runs])), 4),
    }


def pocketsphinx_word_spans(entry: dict) -> list[tuple[float, float]] | None:
    """pocketsphinx's forced alignment of the entry's words (None when it cannot align them)."""
    from pocketsphinx import Decoder

    # Wider beams than the defaults: with them the alignment of these utterances reaches the
    # grammar's end (at the defaults most fail with "Final result does not match the grammar").
    decoder = Decoder(samprate=entry["rate"], loglevel="FATAL", beam=1e-100, wbeam=1e-80, pbeam=1e-100)
    words = entry["text"].lower().split()
    if any(decoder.lookup_word(w) is None for w in words):
        return None
    pcm = (np.clip(entry["audio"], -1, 1) * 32767).astype("<i2").tobytes()
    decoder.set_align_text(" ".join(words))
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    if decoder.hyp() is None:
        return None
    frame_s = 1 / float(decoder.config["frate"])
    segments = [s for s in decoder.seg() if s.word not in ("<s>", "</s>", "<sil>", "[NOISE]")]
    found = [(s.word.split("(")[0], s.start_frame * frame_s, (s.end_frame + 1) * frame_s) for s in segments]
    if [w for w, _, _ in found] != words:
        return None
    return [(start, end) for _, start, end in found]


def errors_ms(truth: list[list[float]], found: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    starts = [abs(f[0] - t[0]) * 1000 for t, f in zip(truth, found, strict=True)]
    ends = [abs(f[1] - t[1]) * 1000 for t, f in zip(truth, found, strict=True)]
    return starts, ends


def summary(starts: list[float], ends: list[float]) -> dict:
    both = starts + ends
    if not both:
        return {"words": 0}

    def pct(values, q):
        return round(float(np.percentile(values, q)), 1)

    return {
        "words": len(starts),
        "start_median_ms": pct(starts, 50),
        "start_p95_ms": pct(starts, 95),
        "end_median_ms": pct(ends, 50),
        "end_p95_ms": pct(ends, 95),
        "boundary_median_ms": pct(both, 50),
        "boundary_p95_ms": pct(both, 95),
    }


def grid_agreement(entry: dict, found: list[tuple[float, float]], tokenizer) -> tuple[int, int]:
    """(frames whose grid token equals the truth grid's, frames) for one utterance."""
    from speechdata.alignment.table import TimedUnit
    from speechdata.bridge.frame_grid import build_frame_grid
    from speechdata.bridge.text_tokens import tokenize_with_offsets

    text = entry["text"]
    tokens = tokenize_with_offsets(tokenizer, text)
    n_samples = int(round(len(entry["audio"]) / entry["rate"] * BRIDGE_SAMPLE_RATE))

    def grid(spans):
        words = [
            TimedUnit(w, int(round(s * 1000)), int(round(e * 1000)))
            for w, (s, e) in zip(text.split(), spans, strict=True)
        ]
        return build_frame_grid(text, words, tokens.ids, tokens.offsets, n_samples).grid

    truth, ours = grid(entry["word_spans_s"]), grid(found)
    return int(np.count_nonzero(truth == ours)), int(truth.shape[0])


def transcript_mismatch_figures(runs: list[dict]) -> dict:
    """``[min, max]`` per utterance of the CER ``transcript_mismatch`` judges (greedy transcript against
    the normalized text, jiwer): with the right transcript, with the next utterance's (swapped), and
    on the first half and the first third of the audio with the whole transcript."""
    import jiwer

    def spread(pairs):
        values = [float(jiwer.cer(reference, hypothesis)) for reference, hypothesis in pairs]
        return [round(min(values), 3), round(max(values), 3)]

    references = [r["mismatch_reference"] for r in runs]
    return {
        "right": spread((ref, r["greedy"]) for ref, r in zip(references, runs, strict=True)),
        "swapped": spread((ref, r["greedy"]) for ref, r in zip(references[1:] + references[:1], runs, strict=True)),
        "first_half": spread((ref, r["greedy_first_half"]) for ref, r in zip(references, runs, strict=True)),
        "first_third": spread((ref, r["greedy_first_third"]) for ref, r in zip(references, runs, strict=True)),
    }


def platform_figures(entries: list[dict], runs: list[dict], tokenizer) -> dict:
    """Per language: word-boundary errors, grid agreement and pseudo-label figures of one model's runs."""
    figures = {}
    for language in sorted({e["language"] for e in entries}):
        chosen = [(e, r) for e, r in zip(entries, runs, strict=True) if e["language"] == language]
        starts, ends, same, frames = [], [], 0, 0
        for entry, run in chosen:
            s, e = errors_ms(entry["word_spans_s"], run["spans"])
            starts += s
            ends += e
            agree, total = grid_agreement(entry, run["spans"], tokenizer)
            same, frames = same + agree, frames + total
        durations = [len(e["audio"]) / e["rate"] for e, _ in chosen]
        figures[language] = {
            **summary(starts, ends),
            "grid_frames_equal_share": round(same / frames, 4),
            "pseudo_labels": pseudo_label_figures([r for _, r in chosen], durations),
            "transcript_mismatch_cer": transcript_mismatch_figures([r for _, r in chosen]),
        }
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="three English utterances")
    parser.add_argument("--write-fixtures", action="store_true", help="synthesize the held-out set (espeak-ng)")
    parser.add_argument("--model-cache-dir", default=str(REPO_ROOT / ".cache" / "models"))
    parser.add_argument("--model", default="small", help="the model measured: small (shipped) or a directory")
    parser.add_argument(
        "--baseline-model", default=None, help="a model directory measured beside it in the same run (an older one)"
    )
    parser.add_argument(
        "--separator-policy",
        action="append",
        choices=("required", "optional"),
        help="also align word separators this way (repeatable: each is measured beside the aligner's own way)",
    )
    args = parser.parse_args(argv)
    if args.write_fixtures:
        write_fixtures()
        return
    import torch

    torch.set_num_threads(2)
    from speechdata.bridge.text_tokens import tiny_tokenizer

    entries = load_heldout()
    if args.quick:
        entries = [e for e in entries if e["language"] == "en"][:3]
    policies = [None, *(args.separator_policy or [])]
    with stdout_to_stderr():
        progress(f"aligning {len(entries)} held-out utterances with {args.model}")
        runs = {policy: platform_runs(entries, args.model_cache_dir, args.model, policy) for policy in policies}
        baseline = None
        if args.baseline_model:
            progress(f"aligning them with the baseline {args.baseline_model}")
            baseline = platform_runs(entries, args.model_cache_dir, args.baseline_model)
        tokenizer = tiny_tokenizer()
    figures: dict = {"platform": {}, "pocketsphinx": {}}
    for policy, policy_runs in runs.items():
        measured = platform_figures(entries, policy_runs, tokenizer)
        if policy is None:
            figures["platform"] = measured
        else:
            figures.setdefault("platform_by_separator_policy", {})[policy] = measured
    if baseline is not None:
        figures["baseline"] = platform_figures(entries, baseline, tokenizer)
    english = [e for e in entries if e["language"] == "en"]
    if english:
        starts, ends, refused = [], [], 0
        for entry in english:
            spans = pocketsphinx_word_spans(entry)
            if spans is None:
                refused += 1
                continue
            s, e = errors_ms(entry["word_spans_s"], spans)
            starts += s
            ends += e
        figures["pocketsphinx"]["en"] = {**summary(starts, ends), "utterances_not_aligned": refused}
    model_dir = REPO_ROOT / "speechdata" / "alignment" / "small_model" if args.model == "small" else Path(args.model)
    model_info = json.loads((model_dir / "training.json").read_text())
    emit(
        "alignment_accuracy",
        {
            "utterances": len(entries),
            "quick": args.quick,
            "model": args.model,
            "model_steps": model_info.get("init_from_steps", 0) + model_info.get("steps", 0),
            "baseline_model": args.baseline_model,
        },
        figures,
    )


if __name__ == "__main__":
    main()
