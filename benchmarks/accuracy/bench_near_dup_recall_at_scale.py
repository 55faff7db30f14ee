"""Near-duplicate recall as the corpus grows: the planted set decided inside a background of speech
whose per-key load stands for 10 to 10^5 hours, audio alone and with every signal.

Why: a sampled audio key with more than ``MAX_KEY_OCCURRENCES`` (500) earlier postings never votes
(docs/near-duplicates.md, "Capped audio keys"). The cap is fixed while every key's chance postings
grow with the corpus, so past some size most keys stop voting, and copies found only by their audio
(clips, compound and trimmed copies, which keep 2-3 exact keys of their original) are no longer
found. This measures where, with the stage's own decision procedure
(:func:`~speechdata.quality.near_dup_matching.decide_shard` on a
:class:`~speechdata.quality.near_dup_matching.MemorySource`).

The index: ``--background`` unrelated utterances of synthetic speech (the planted set's generator,
another seed: the *synthetic-like* corpus of ``bench_near_dup_keyspace``), then the extended planted
set (``--originals`` originals, a copy and a look-alike of each) as the new shard. A corpus of N
hours is beyond what builds here, so the cap is lowered instead: the vote of a key compares its
earlier postings with the cap, and postings per key grow linearly with the corpus (measured here on
prefixes of the background), so a corpus of ``indexed`` utterances at cap ``c`` has the per-key load,
against the cap, of ``indexed x 500 / c`` utterances at cap 500. That holds for the mean; the
spread of a key's count around its mean is relatively wider at a small load (Poisson), so the
equivalence is checked, not assumed: the same equivalent sizes are also decided with half the
background and half the cap (``equivalence_check``).

Equivalent hours: ``indexed x 500 / c / 680`` (680 utterances an hour, the corpus benchmark's) of
synthetic-like speech, whose keys find 1.48 chance postings per key per hour; of espeak-like speech
the same per-key load is reached at ``rate(synthetic) / rate(espeak)`` times the hours, the rates
measured in the same run (the background's; the espeak-ng fixtures', or ``--speech-dir``'s). That
conversion assumes the keys' loads spread around their mean alike in both; espeak-like keys are
more uniform (20.7 against 15.8 effective bits), so on espeak-like speech the drop is steeper
(later, then faster).

Per point: recall and precision audio alone and with every signal, recall per transform, the share
of the planted shard's sampled audio keys past the cap and the utterances whose audio lookup the cap
silenced (:class:`~speechdata.quality.near_dup_candidates.AudioKeyLoad`, the figures the stage reports
per shard), and where audio-alone recall falls below 0.9 and 0.5.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from unittest import mock

import numpy as np

from benchmarks.report import emit, progress, stdout_to_stderr

UTTERANCES_PER_HOUR = 680
"""1 000 utterances per 1.47 h: the shards of the corpus benchmark (as ``bench_near_dup_keyspace``)."""
STAGE_CAP = 500
"""``MAX_KEY_OCCURRENCES`` as the stage runs it: what the lowered caps stand for."""
CAPS = (500, 200, 100, 50, 20, 10, 5, 3, 2, 1)
EQUIVALENCE_CAPS = (20, 10, 4, 2)
"""Decided again with half the background and half the cap: the same equivalent size."""
ESPEAK_FOLDERS = ("speech", "demo_speech", "quality_speech", "synthesized_speech")
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
SPEECH_SUFFIXES = (".flac", ".wav", ".ogg", ".mp3")


def background_signals(count: int, seed: int, speakers: int = 6) -> list:
    """``count`` unrelated utterances of synthetic speech (3-7 s, the planted set's generator and
    vocabulary, ``speakers`` voices of their own), as the stage computes their signals."""
    from speechdata.quality.near_dup_planted import Speaker, sentence, speech_like
    from speechdata.quality.near_duplicates import utterance_signals

    rng = np.random.default_rng(seed)
    voices = [Speaker(float(rng.uniform(90, 230)), float(rng.uniform(0.85, 1.2))) for _ in range(speakers)]
    made = []
    for number in range(count):
        samples = speech_like(rng, voices[number % speakers], rng.uniform(3.0, 7.0))
        made.append(utterance_signals("background", f"bg-{number:07d}", samples, 24_000, sentence(rng)))
        if number and number % 1_000 == 0:
            progress(f"background: {number}/{count}")
    return made


def audio_keys_of(signals: Sequence) -> list[np.ndarray]:
    from speechdata.quality.near_dup_postings import sampled_audio_keys

    return [sampled_audio_keys(s.fingerprint.sub_fingerprints, s.fingerprint.active)[0] for s in signals]


def mean_load(query_keys: Sequence[np.ndarray], indexed_keys: Sequence[np.ndarray]) -> float:
    """Per sampled audio key of the queries: the postings of the indexed utterances holding its value
    (what the vote counts against the cap), on average."""
    indexed = np.sort(np.concatenate(indexed_keys)) if indexed_keys else np.zeros(0, np.uint64)
    keys = np.concatenate(query_keys)
    found = np.searchsorted(indexed, keys, "right") - np.searchsorted(indexed, keys, "left")
    return float(found.mean()) if len(keys) else 0.0


def chance_rate_per_key(signals: Sequence, groups: np.ndarray) -> float:
    """Chance postings per sampled audio key per indexed utterance, between unrelated utterances
    (``bench_near_dup_keyspace.key_figures``: per utterance pair, over the keys per utterance)."""
    from benchmarks.accuracy.bench_near_dup_keyspace import key_figures

    figures = key_figures(audio_keys_of(signals), groups)
    return figures["chance_per_utterance_pair"] / max(figures["keys_per_utterance"], 1e-9)


def folder_signals(folder: Path) -> tuple[list, np.ndarray]:
    """Every speech file under ``folder`` and its group (files with the same samples are one group)."""
    import soundfile as sf

    from speechdata.quality.near_duplicates import utterance_signals

    made = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix.lower() in SPEECH_SUFFIXES):
        samples, rate = sf.read(path, dtype="float32")
        samples = samples.mean(axis=1) if samples.ndim > 1 else samples
        made.append(utterance_signals("speech", str(path), samples, rate, None))
    first: dict[str, int] = {}
    groups = [first.setdefault(s.exact_hash, i) if s.exact_hash else i for i, s in enumerate(made)]
    return made, np.array(groups)


def espeak_rate(speech_dirs: Sequence[Path], fixture_folders: Sequence[str] = ESPEAK_FOLDERS) -> tuple[str, float]:
    """``(name, chance postings per key per utterance)`` of espeak-like speech: the espeak-ng
    fixtures, or the folders given."""
    folders = list(speech_dirs) or [FIXTURES / name for name in fixture_folders]
    signals, groups = [], []
    for folder in folders:
        found, grouped = folder_signals(folder)
        offset = sum(len(g) for g in groups)
        signals += found
        groups.append(grouped + offset)
    name = "espeak_fixtures" if not speech_dirs else "+".join(p.name for p in speech_dirs)
    return name, chance_rate_per_key(signals, np.concatenate(groups))


def decided(background: Sequence, signals: Sequence, planted, cap: int) -> dict:
    """The planted set decided after ``background`` with the vote's cap at ``cap``: audio alone and
    with every signal, and what the cap kept out of the audio vote."""
    from benchmarks.accuracy.bench_near_duplicates import recall_by_transform
    from speechdata.quality import near_dup_matching
    from speechdata.quality.near_dup_candidates import AudioKeyLoad
    from speechdata.quality.near_dup_matching import KINDS, MemorySource, NearDuplicateThresholds
    from speechdata.quality.near_dup_planted import AUDIO_TRANSFORMS, EXTENDED_AUDIO_TRANSFORMS, score

    source = MemorySource([(s, (s.shard_id, s.utt_id)) for s in background])
    figures = {}
    for label, thresholds, counted in (
        ("audio_alone", NearDuplicateThresholds(check_transcripts=False), AUDIO_TRANSFORMS + EXTENDED_AUDIO_TRANSFORMS),
        ("all_signals", NearDuplicateThresholds(), ()),
    ):
        load = AudioKeyLoad()
        started = time.perf_counter()
        with mock.patch.object(near_dup_matching, "MAX_KEY_OCCURRENCES", cap):
            decisions = near_dup_matching.decide_shard(source.next_position, signals, source, thresholds, key_load=load)
        flagged = {d.utt_id: (d.kind, d.representative_utt) for d in decisions if d.kind in KINDS}
        measured = score(planted, flagged, counted)
        figures[label] = {
            "recall": round(measured.recall, 4),
            "precision": round(measured.precision, 4),
            "recall_by_transform": recall_by_transform(planted, measured, digits=3),
            "found_by_kind": dict(
                sorted(Counter(flagged[u][0] for u, outcome in measured.outcome.items() if outcome == "found").items())
            ),
            "decide_s": round(time.perf_counter() - started, 1),
        }
        if label == "audio_alone":
            figures["keys_past_cap_share"] = round(load.share_past_cap, 4)
            figures["keys_met_share"] = round(load.keys_met / max(load.keys, 1), 4)
            figures["utterances_silenced_share"] = round(load.utterances_silenced / max(load.utterances, 1), 4)
    return figures


COST_CAPS = (500, 1_000, 2_000, 5_000, 20_000, 50_000)
COST_HOURS = (10_000, 100_000, 1_000_000)


def cap_cost(originals: int, seed: int) -> dict:
    """What a larger cap costs per new shard of 1 000 utterances, computed with the key-space model
    (``bench_near_dup_keyspace.block_reads``, with the reader as it is: per live segment a key reads
    at most ``cap + 1`` audio postings, and none in the segments after those, largest first, where
    its postings passed the cap) from the rates of its two corpora (the extended planted set; the
    espeak-ng fixtures and readings), at :data:`COST_HOURS`. Also the audio postings a new shard's
    vote counts (its CPU): per key and live segment, the segment's share of the key's chance postings,
    at most ``cap + 1``, where the key is still looked up there (``P(Poisson(before) <= cap)``)."""
    from scipy.special import gammaincc

    from benchmarks.accuracy.bench_near_dup_keyspace import (
        ESPEAK_FOLDERS as KEYSPACE_FOLDERS,
    )
    from benchmarks.accuracy.bench_near_dup_keyspace import (
        SHARD_UTTERANCES,
        block_reads,
        corpora,
        corpus_figures,
        live_segments,
    )
    from speechdata.quality import near_dup_matching

    made, _ = corpora(originals, seed, KEYSPACE_FOLDERS, with_readings=True)
    cost: dict = {}
    for corpus in made:
        keys = corpus_figures(corpus)["keys"]
        rates = {name: (kind["keys_per_utterance"], kind["chance_per_utterance_pair"]) for name, kind in keys.items()}
        postings = sum(kind["keys_per_utterance"] for kind in keys.values())
        audio_keys, audio_per_pair = rates["audio_sampled"]
        per_corpus = {}
        for hours in COST_HOURS:
            shards = round(hours * UTTERANCES_PER_HOUR / SHARD_UTTERANCES)
            load = audio_per_pair / audio_keys * hours * UTTERANCES_PER_HOUR
            at_hours = {"chance_postings_per_audio_key": round(load)}
            for cap in COST_CAPS:
                with mock.patch.object(near_dup_matching, "MAX_KEY_OCCURRENCES", cap):
                    reads = block_reads(rates, hours, postings)
                counted, before = 0.0, 0.0
                for held in sorted(live_segments(shards), reverse=True):
                    found = load * held / shards
                    still_looked_up = float(gammaincc(cap + 1, before)) if before else 1.0
                    counted += still_looked_up * min(found, cap + 1)
                    before += found
                at_hours[str(cap)] = {
                    "gb_read_per_new_shard": reads["gb_read_audio_postings_capped_one_segment"],
                    "gb_read_every_segment": reads["gb_read_audio_postings_capped"],
                    "audio_postings_counted_per_new_shard": round(SHARD_UTTERANCES * audio_keys * counted),
                    "mean_key_load_over_cap": round(load / cap, 2),
                }
            per_corpus[str(hours)] = at_hours
        cost[corpus.name] = per_corpus
    return cost


def crossing(points: Sequence[dict], level: float, hours_key: str) -> float | None:
    """The equivalent hours where audio-alone recall first falls below ``level``, interpolated
    linearly in log hours between the two points around it; None when it never does."""
    ordered = sorted(points, key=lambda p: p[hours_key])
    for before, after in zip(ordered, ordered[1:], strict=False):
        high, low = before["audio_alone"]["recall"], after["audio_alone"]["recall"]
        if high >= level > low:
            share = (high - level) / (high - low)
            logs = np.log([before[hours_key], after[hours_key]])
            return round(float(np.exp(logs[0] + share * (logs[1] - logs[0]))))
    return None


def cached(path: Path | None, make):
    """``make()``, kept in ``path`` (a pickle) when given, so a rerun skips computing the signals."""
    import pickle

    if path is not None and path.exists():
        return pickle.loads(path.read_bytes())
    made = make()
    if path is not None:
        path.write_bytes(pickle.dumps(made))
    return made


def main(argv: list[str] | None = None) -> None:
    from speechdata.quality.near_dup_planted import planted_set
    from speechdata.quality.near_duplicates import utterance_signals

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="6 originals, 40 background utterances, 3 caps, one fixture folder"
    )
    parser.add_argument("--originals", type=int, default=300)
    parser.add_argument("--background", type=int, default=8_000, help="unrelated utterances indexed first")
    parser.add_argument("--seed", type=int, default=0, help="of the planted set; the background's is seed + 1")
    parser.add_argument("--speech-dir", type=Path, action="append", default=[], help="espeak-like rate from these")
    parser.add_argument("--signals-cache", type=Path, help="a folder keeping the computed signals between runs")
    parser.add_argument(
        "--cap-cost", action="store_true", help="only the key-space model's reads per new shard at larger caps"
    )
    args = parser.parse_args(argv)
    if args.cap_cost:
        with stdout_to_stderr():
            cost = cap_cost(8 if args.quick else args.originals, args.seed)
        emit(
            "near_dup_cap_cost",
            {"quick": args.quick, "originals": 8 if args.quick else args.originals, "seed": args.seed},
            cost,
        )
        return
    caps, equivalence_caps = CAPS, EQUIVALENCE_CAPS
    if args.quick:
        args.originals, args.background = 6, 40
        caps, equivalence_caps = (500, 4, 2), (4,)
    with stdout_to_stderr():
        started = time.perf_counter()
        planted = planted_set(args.originals, seed=args.seed, extended=True)
        cache = args.signals_cache
        tag = f"{args.originals}-{args.background}-{args.seed}"
        signals = cached(
            cache and cache / f"planted-{tag}.pickle",
            lambda: [utterance_signals("planted", u.utt_id, u.samples, 24_000, u.text) for u in planted],
        )
        background = cached(
            cache and cache / f"background-{tag}.pickle", lambda: background_signals(args.background, args.seed + 1)
        )
        progress(f"signals of {len(signals)} + {len(background)} utterances in {time.perf_counter() - started:.0f} s")
        espeak_name, espeak_per_key = espeak_rate(args.speech_dir, ESPEAK_FOLDERS[:1] if args.quick else ESPEAK_FOLDERS)
        background_groups = np.arange(len(background))
        synthetic_per_key = chance_rate_per_key(background, background_groups)
        planted_keys, background_keys = audio_keys_of(signals), audio_keys_of(background)
        # Linear growth: the planted keys' load on growing prefixes of the background.
        loads = {
            str(size): round(mean_load(planted_keys, background_keys[:size]), 4)
            for size in (len(background) // 4, len(background) // 2, len(background))
        }
        # Before a copy: the background, the originals, and on average half the copies and look-alikes.
        indexed_extra = 2 * args.originals

        def point(background_size: int, cap: int) -> dict:
            indexed = background_size + indexed_extra
            hours = indexed * STAGE_CAP / cap / UTTERANCES_PER_HOUR
            figures = decided(background[:background_size], signals, planted, cap)
            progress(
                f"background {background_size}, cap {cap}: {hours:.0f} h synthetic-like, audio alone "
                f"{figures['audio_alone']['recall']}, all {figures['all_signals']['recall']}, "
                f"keys past cap {figures['keys_past_cap_share']}"
            )
            return {
                "background": background_size,
                "cap": cap,
                "equivalent_hours_synthetic_like": round(hours, 1),
                "equivalent_hours_espeak_like": round(hours * synthetic_per_key / max(espeak_per_key, 1e-12)),
                **figures,
            }

        curve = [point(len(background), cap) for cap in caps]
        # The limit of an ever larger corpus: every key that meets an earlier posting is past the cap.
        limit = decided(background, signals, planted, 0)
        check = [point(len(background) // 2, cap // 2) for cap in equivalence_caps]
        full_at = {p["cap"]: p for p in curve}
        equivalence = [
            {
                "cap": 2 * half["cap"],
                "full_background": {k: full_at[2 * half["cap"]][k]["recall"] for k in ("audio_alone", "all_signals")}
                | {"keys_past_cap_share": full_at[2 * half["cap"]]["keys_past_cap_share"]},
                "half_background_half_cap": {k: half[k]["recall"] for k in ("audio_alone", "all_signals")}
                | {"keys_past_cap_share": half["keys_past_cap_share"]},
            }
            for half in check
            if 2 * half["cap"] in full_at
        ]
    figures = {
        "utterances": {"planted": len(signals), "background": len(background)},
        "chance_postings_per_key_per_utterance": {
            "synthetic_like_background": float(f"{synthetic_per_key:.4g}"),
            espeak_name: float(f"{espeak_per_key:.4g}"),
        },
        "chance_postings_per_key_per_hour": {
            "synthetic_like_background": round(synthetic_per_key * UTTERANCES_PER_HOUR, 4),
            espeak_name: round(espeak_per_key * UTTERANCES_PER_HOUR, 4),
        },
        "planted_key_load_on_background_prefixes": loads,
        "curve": curve,
        "equivalence_check": equivalence,
        "every_key_past_cap": limit,
        "audio_alone_recall_below": {
            f"{level}": {
                "hours_synthetic_like": crossing(curve, level, "equivalent_hours_synthetic_like"),
                "hours_espeak_like": crossing(curve, level, "equivalent_hours_espeak_like"),
            }
            for level in (0.9, 0.5)
        },
    }
    emit(
        "near_dup_recall_at_scale",
        {"quick": args.quick, "originals": args.originals, "background": args.background, "seed": args.seed},
        figures,
    )


if __name__ == "__main__":
    main()
