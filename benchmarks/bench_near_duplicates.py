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
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from benchmarks.report import emit, progress, ratio, stdout_to_stderr
from speechdata.quality.fingerprint_audio import exact_audio_hash
from speechdata.quality.near_dup_matching import EXACT_AUDIO, NearDuplicateThresholds, find_representatives
from speechdata.quality.near_dup_planted import AUDIO_TRANSFORMS, planted_set, score
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
    return {d.utt_id: (d.kind, d.representative_utt) for d in decisions if d.kind}, time.perf_counter() - started


def recall_by_transform(planted, measured) -> dict[str, float]:
    transforms = {u.utt_id: u.transform for u in planted}
    found = Counter(transforms[utt] for utt, outcome in measured.outcome.items() if outcome == "found")
    counted = Counter(transforms[utt] for utt in measured.outcome)
    return {transform: round(found[transform] / count, 4) for transform, count in sorted(counted.items())}


def figures_of(measured) -> dict:
    return {"precision": round(measured.precision, 4), "recall": round(measured.recall, 4)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="24 originals (72 utterances)")
    parser.add_argument("--originals", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="of the planted set's generator")
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
            "ratio_ms_per_utt_over_baseline": ratio(near_ms, baseline_ms),
        }
        progress(f"near duplicates {figures['near_duplicates']}, exact hash {figures['baseline_exact_hash']}")
    emit("near_duplicates", {"quick": args.quick, "originals": args.originals, "seed": args.seed}, figures)


if __name__ == "__main__":
    main()
