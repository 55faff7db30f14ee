"""Near-duplicate detection on a planted set: precision, recall and time per utterance, against
exact hashing alone.

Why: ``near_duplicates`` runs on every shard as it lands and its rows reject utterances from every
product, so both what it misses and what it wrongly rejects matter, and so does its cost per
utterance. The planted set (:mod:`speechdata.quality.near_dup_planted`): ``--originals`` distinct
speech-like utterances of 3-7 s, one planted copy of each (re-wrapped, re-encoded to MP3 / Ogg
Vorbis / 8-bit, trimmed 0.2-1 s at both ends, +-6 dB, resampled 24->16->24 kHz, all four at once, or the same words
under other audio) and one look-alike of each that is no copy (same speaker, a spliced prefix, half
the words). The baseline is the exact audio hash alone, on the same set in the same run.
Time per utterance: computing its signals (hash, fingerprint, MinHash), and matching it against
everything before it.

``--extended`` also scores the extended planted set (tempo x0.9/x1.1, pitch -2/+2 semitones, padded
and clipped copies; containers that hold an original plus new speech, which must be kept) and the
espeak-ng readings (``tests/fixtures/readings``: another voice's reading must be kept, the same
voice's second reading and a x1.1 copy of a reading are duplicates), with speaker embeddings
computed for the readings (Resemblyzer, on the CPU).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from benchmarks.report import emit, progress, ratio, stdout_to_stderr
from speechdata.quality.fingerprint_audio import exact_audio_hash
from speechdata.quality.near_dup_matching import EXACT_AUDIO, KINDS, NearDuplicateThresholds, find_representatives
from speechdata.quality.near_dup_planted import (
    AUDIO_TRANSFORMS,
    EXTENDED_AUDIO_TRANSFORMS,
    READING_TRANSFORMS,
    planted_readings,
    planted_set,
    score,
)
from speechdata.quality.near_duplicates import utterance_signals


def exact_hash_flags(planted) -> tuple[dict[str, tuple[str, str]], float]:
    """The baseline: an utterance is a copy when its exact hash was seen before."""
    started = time.perf_counter()
    first: dict[str, str] = {}
    flagged = {}
    for utterance in planted:
        digest = exact_audio_hash(utterance.samples)
        if digest is None:
            continue
        if digest in first:
            flagged[utterance.utt_id] = (EXACT_AUDIO, first[digest])
        else:
            first[digest] = utterance.utt_id
    return flagged, time.perf_counter() - started


def flags_of(signals, thresholds) -> tuple[dict[str, tuple[str, str]], float]:
    started = time.perf_counter()
    decisions = find_representatives([], signals, thresholds)
    # Flags (another speaker's reading, a container of an earlier utterance) are kept: not counted.
    flagged = {d.utt_id: (d.kind, d.representative_utt) for d in decisions if d.kind in KINDS}
    return flagged, time.perf_counter() - started


def postings_hit(signals) -> dict[str, int]:
    """The postings each utterance's lookup finds among the utterances before it (one shard: the
    set in order), all keys and the envelope keys alone (band pairs since the segment format 03)."""
    import numpy as np

    from speechdata.quality.near_dup_postings import envelope_keys, index_keys

    def earlier_hits(keys: np.ndarray) -> int:
        _, counts = np.unique(keys, return_counts=True)
        return int((counts * (counts - 1) // 2).sum())

    envelopes = [envelope_keys(s.shift.envelope) for s in signals if s.shift is not None]
    return {
        "all_keys": earlier_hits(index_keys(signals, 0)["key"]),
        "envelope_keys": earlier_hits(np.concatenate(envelopes)) if envelopes else 0,
        "envelope_keys_per_utterance": len(envelopes[0]) if envelopes else 0,
    }


def recall_by_transform(planted, measured, digits: int = 4) -> dict[str, float]:
    transforms = {u.utt_id: u.transform for u in planted}
    found = Counter(transforms[utt] for utt, outcome in measured.outcome.items() if outcome == "found")
    counted = Counter(transforms[utt] for utt in measured.outcome)
    return {transform: round(found[transform] / count, digits) for transform, count in sorted(counted.items())}


def figures_of(measured) -> dict:
    return {"precision": round(measured.precision, 4), "recall": round(measured.recall, 4)}


READINGS_FIXTURES = "tests/fixtures/readings"


def extended_figures(originals: int, seed: int) -> dict:
    """Precision and recall (all signals, audio alone) per transform on the extended planted set and
    the readings, and the false positives by look-alike kind."""
    from speechdata.quality.speakers import shipped_speaker_encoder

    encoder = shipped_speaker_encoder()
    figures = {}
    sets = {
        "extended": (planted_set(originals, seed=seed, extended=True), None),
        "readings": (planted_readings(READINGS_FIXTURES), lambda: encoder),
    }
    for name, (planted, speakers) in sets.items():
        signals = [utterance_signals("bench", u.utt_id, u.samples, 24_000, u.text, speakers) for u in planted]
        audio_counted = AUDIO_TRANSFORMS + EXTENDED_AUDIO_TRANSFORMS + READING_TRANSFORMS[1:]
        for label, thresholds, counted in (
            ("all_signals", NearDuplicateThresholds(), ()),
            ("audio_alone", NearDuplicateThresholds(check_transcripts=False), audio_counted),
        ):
            flagged, _ = flags_of(signals, thresholds)
            measured = score(planted, flagged, counted)
            wrongly = Counter(u.negative for u in planted if u.copy_of is None and u.negative and u.utt_id in flagged)
            figures[f"{name}_{label}"] = {
                **figures_of(measured),
                "recall_by_transform": recall_by_transform(planted, measured),
                "lookalikes_rejected": dict(sorted(wrongly.items())),
                "lookalikes": dict(sorted(Counter(u.negative for u in planted if u.negative).items())),
            }
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="24 originals (72 utterances)")
    parser.add_argument("--originals", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="of the planted set's generator")
    parser.add_argument("--extended", action="store_true", help="also the extended planted set and the readings")
    args = parser.parse_args(argv)
    if args.quick:
        args.originals = 24
    with stdout_to_stderr():
        started = time.perf_counter()
        planted = planted_set(args.originals, seed=args.seed)
        progress(f"planted {len(planted)} utterances in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        signals = [utterance_signals("bench", u.utt_id, u.samples, 24_000, u.text) for u in planted]
        signals_s = time.perf_counter() - started
        every_signal, match_s = flags_of(signals, NearDuplicateThresholds())
        audio_alone, _ = flags_of(signals, NearDuplicateThresholds(check_transcripts=False))
        baseline, baseline_s = exact_hash_flags(planted)
        measured = score(planted, every_signal)
        measured_audio_alone = score(planted, audio_alone, AUDIO_TRANSFORMS)
        utterances = len(planted)
        near_ms = (signals_s + match_s) / utterances * 1e3
        baseline_ms = baseline_s / utterances * 1e3
        figures = {
            "utterances": utterances,
            "audio_seconds": round(sum(len(u.samples) for u in planted) / 24_000, 1),
            "near_duplicates": figures_of(measured),
            "near_duplicates_audio_alone": figures_of(measured_audio_alone),
            "baseline_exact_hash": figures_of(score(planted, baseline)),
            "baseline_exact_hash_audio_transforms": figures_of(score(planted, baseline, AUDIO_TRANSFORMS)),
            "recall_by_transform": recall_by_transform(planted, measured),
            "recall_by_transform_audio_alone": recall_by_transform(planted, measured_audio_alone),
            "ms_per_utt": round(near_ms, 3),
            "ms_per_utt_signals": round(signals_s / utterances * 1e3, 3),
            "ms_per_utt_matching": round(match_s / utterances * 1e3, 3),
            "baseline_ms_per_utt": round(baseline_ms, 3),
            "postings_hit": postings_hit(signals),
            "ratio_ms_per_utt_over_baseline": ratio(near_ms, baseline_ms),
        }
        progress(f"near duplicates {figures['near_duplicates']}, exact hash {figures['baseline_exact_hash']}")
        if args.extended:
            figures.update(extended_figures(args.originals, args.seed))
    emit(
        "near_duplicates",
        {"quick": args.quick, "originals": args.originals, "seed": args.seed, "extended": args.extended},
        figures,
    )


if __name__ == "__main__":
    main()
