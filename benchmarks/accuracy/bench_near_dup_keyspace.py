"""Near-duplicate lookup keys at 10^4-10^6 hours: how much of its key space each key kind uses on
speech, the chance postings a new utterance finds, the block reads they cost, and wider keys.

Why: a new shard's lookup reads a 7 KiB block in every live segment that holds one of its keys
(docs/near-duplicates.md, "Keys and postings"). A key found only by chance costs that read too, and
the chance postings grow with the corpus until the key's value space is full. How fast depends on
how the values of real fingerprints spread, not on the key's width: this measures it on fingerprints
of speech, never on uniform random keys.

Corpora (the utterances' signals computed as the stage computes them, ``utterance_signals``):

- ``synthetic``: the extended planted set (:func:`~speechdata.quality.near_dup_planted.planted_set`,
  ``extended=True``): ``--originals`` originals, a copy and a look-alike of each;
- ``espeak``: the espeak-ng fixtures (``tests/fixtures/{speech,demo_speech,quality_speech,
  synthesized_speech}``, 4 languages, many voices) and the readings (``tests/fixtures/readings``:
  three sentences, several voices, with their planted copies);
- ``speech_dir:<name>`` for each ``--speech-dir DIR``: every speech file under DIR, none a copy of
  another (a sample of a real corpus gives that corpus's rates).

``--quick`` (the smoke test): 8 originals of the plain planted set, the ``speech`` fixtures, no readings.

An utterance *pair* counts as unrelated unless both belong to one planted group (an original, its copy
and its look-alike; the readings of one sentence) or hash the same. Per key kind, per corpus:
postings per utterance, the share of postings in the 1 / 10 / 100 most common values, the chance
postings per unrelated utterance pair (how many postings of one utterance the other's keys find) and
per key pair, the *effective bits* (``-log2`` of the per-key-pair rate: 31 for a uniform sampled audio
key, 28 for a uniform band pair; a band pair only meets the same pair of bands, so its key pairs are
counted per position), for audio keys the share that passes the context check, and for
envelopes the chance that an unrelated utterance shares 3 bands (a candidate fetched). From these,
computed for a corpus of 10^4, 10^5 and 10^6 hours (:data:`UTTERANCES_PER_HOUR`): the chance postings
per new utterance, and the blocks a new shard of 1 000 utterances reads (:func:`block_reads`).

Variants (``--variants``): wider audio keys (the sampled sub-fingerprint n with the low ``b`` bits of
n+1 or n+2, looked up exactly; or with a probe of every value within one bit of them; or, Haitsma
and Kalker's soft decision, every active frame's key probed with its least reliable bits toggled), a
stop-list of the most common values, and envelope keys of three bands (all 2 024 triples, or the
triples inside 3 groups of 8 or 2 groups of 12 bands), and envelope band pairs of other hyperplanes
(:class:`EnvelopeHashing`, the 3-band rule kept): drawn in a whitened basis of speech envelopes (every
principal direction, or the 32 or 16 leading ones), with thresholds balanced at their medians, or
other band counts and widths. A fitted hashing is fitted on the synthetic corpus or on a speech
corpus (``--fit-dir DIR``, else the espeak one) and marked where its figures are in-sample. For each: keys and index bytes per utterance, the chance
figures above, and the precision and recall per transform that today's decision procedure
(:func:`~speechdata.quality.near_dup_matching.find_representatives`) reaches with those keys on the
extended planted set and the readings, all signals and audio alone, and how many decisions differ
from today's keys. The probe, soft-decision and stop-list variants are measured on the keys alone
(chance figures, and the copies whose original shares no key), not decided. One draw of hyperplanes
finds a copy that shares 3 bands by luck or not (the readings' x1.1 copies share exactly 3 of 24), so
``envelope_hashing_frontier`` also weighs each basis and band shape in expectation over the draws
(:func:`hashing_frontier`). ``--only NAME`` runs the variants whose name holds it (and today's).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import combinations, product
from pathlib import Path
from unittest import mock

import numpy as np

from benchmarks.report import emit, progress, stdout_to_stderr

UTTERANCES_PER_HOUR = 680
"""1 000 utterances per 1.47 h: the shards of the corpus benchmark (5.3 s an utterance)."""
HOURS = (10_000, 100_000, 1_000_000)
SHARD_UTTERANCES = 1_000
MERGE_FANOUT = 8
"""Segments of one level merged into one of the next: the live segments are the base-8 digits of the shard count."""
FILTER_FALSE_POSITIVES = 0.006
"""A key filter's measured false-positive rate: an absent key still reads a block this often."""
FILTER_BYTES_PER_POSTING = 1.5
"""12 bits of key filter per posting."""
ESPEAK_FOLDERS = ("speech", "demo_speech", "quality_speech", "synthesized_speech")
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"


@dataclass(frozen=True)
class Corpus:
    name: str
    signals: list
    """:class:`~speechdata.quality.near_dup_matching.UtteranceSignals`, in index order."""
    groups: np.ndarray
    """int per utterance: utterances of one group are related (a pair within a group is no chance pair)."""
    reliabilities: list
    """Per utterance, its fingerprint bits' reliabilities (:func:`~speechdata.quality.fingerprint_audio.bit_reliabilities`)."""


# Measuring keys


def _group_pairs(keys_per_utterance: Sequence[np.ndarray], groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(first, second)``: indices into the concatenated keys of every pair of equal keys held by
    two unrelated utterances."""
    sizes = np.array([len(keys) for keys in keys_per_utterance])
    keys = np.concatenate(keys_per_utterance) if len(sizes) else np.zeros(0, np.uint64)
    owner_group = np.repeat(groups, sizes)
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) if len(keys) else np.zeros(0, int)
    counts = np.diff(np.r_[starts, len(keys)])
    first, second = [], []
    for count in np.unique(counts[counts > 1]).tolist():
        at = starts[counts == count]
        i, j = np.triu_indices(count, 1)
        first.append(order[(at[:, None] + i[None, :]).ravel()])
        second.append(order[(at[:, None] + j[None, :]).ravel()])
    if not first:
        return np.zeros(0, int), np.zeros(0, int)
    first, second = np.concatenate(first), np.concatenate(second)
    unrelated = owner_group[first] != owner_group[second]
    return first[unrelated], second[unrelated]


def _unrelated_counts(sizes: np.ndarray, groups: np.ndarray) -> tuple[float, float]:
    """``(unrelated utterance pairs, key pairs between unrelated utterances)``."""
    utterance_pairs = len(sizes) * (len(sizes) - 1) / 2
    key_pairs = (sizes.sum() ** 2 - (sizes**2).sum()) / 2
    for group in np.unique(groups):
        inside = sizes[groups == group].astype(float)
        utterance_pairs -= len(inside) * (len(inside) - 1) / 2
        key_pairs -= (inside.sum() ** 2 - (inside**2).sum()) / 2
    return utterance_pairs, key_pairs


def key_figures(
    keys_per_utterance: Sequence[np.ndarray],
    groups: np.ndarray,
    contexts: Sequence[np.ndarray] | None = None,
    positional: bool = False,
) -> dict:
    """One key kind on one corpus: distribution and chance rates (see the module's docstring).
    ``positional``: the kind's keys carry their position (a band's number), so only the keys of one
    position of two utterances can be equal: a key pair is two keys of one position."""
    from speechdata.quality.near_dup_matching import MAX_CONTEXT_BIT_ERRORS
    from speechdata.quality.near_dup_postings import context_bit_errors

    sizes = np.array([len(keys) for keys in keys_per_utterance])
    keys = np.concatenate(keys_per_utterance) if len(sizes) else np.zeros(0, np.uint64)
    _, counts = np.unique(keys, return_counts=True)
    counts = np.sort(counts)[::-1]
    first, second = _group_pairs(keys_per_utterance, groups)
    utterance_pairs, key_pairs = _unrelated_counts(sizes, groups)
    if positional:
        keyed_pairs, _ = _unrelated_counts(np.minimum(sizes, 1), groups)
        key_pairs = keyed_pairs * float(sizes[sizes > 0].mean() if (sizes > 0).any() else 0)
    chance = len(first)
    figures = {
        "keys_per_utterance": round(float(sizes.mean()), 1) if len(sizes) else 0.0,
        "postings": int(len(keys)),
        "distinct_share": round(len(counts) / max(len(keys), 1), 4),
        "top_value_shares": {str(n): round(float(counts[:n].sum()) / max(len(keys), 1), 5) for n in (1, 10, 100)},
        "unrelated_utterance_pairs": int(utterance_pairs),
        "chance_postings": chance,
        "chance_per_utterance_pair": float(f"{chance / max(utterance_pairs, 1):.4g}"),
        "chance_per_key_pair": float(f"{chance / max(key_pairs, 1):.4g}"),
        # Under one chance posting the rate is a bound: read as "at least this many bits".
        "effective_bits": round(-math.log2(max(chance, 1) / max(key_pairs, 1)), 1),
        "effective_bits_is_lower_bound": chance == 0,
    }
    if contexts is not None and chance:
        every_context = np.concatenate(contexts)
        passing = context_bit_errors(every_context[first], every_context[second]) <= MAX_CONTEXT_BIT_ERRORS
        figures["context_check_pass_share"] = round(float(passing.mean()), 4)
    return figures


def shared_band_figures(signals: Sequence, groups: np.ndarray, band_keys: Callable | None = None) -> dict:
    """How often two unrelated envelopes share 1, 2 and at least 3 of their bands (3: a candidate);
    ``band_keys``: of a variant's hashing (None: today's ``envelope_band_keys``)."""
    from speechdata.quality.fingerprint_envelope import envelope_band_keys

    band_keys = band_keys or envelope_band_keys
    with_envelope = [i for i, s in enumerate(signals) if s.shift is not None]
    bands = np.array([band_keys(signals[i].shift.envelope) for i in with_envelope])
    group = groups[with_envelope]
    shared = Counter()
    pairs = 0
    for i in range(len(bands)):
        alike = (bands[i + 1 :] == bands[i]).sum(axis=1)[group[i + 1 :] != group[i]]
        pairs += len(alike)
        shared.update(np.minimum(alike, 3).tolist())
    return {
        "unrelated_pairs": pairs,
        **{f"share_sharing_{k}": float(f"{shared[k] / max(pairs, 1):.4g}") for k in (1, 2)},
        "share_sharing_3_or_more": float(f"{shared[3] / max(pairs, 1):.4g}"),
        "pairs_sharing_3_or_more": shared[3],
    }


def live_segments(shards: int) -> list[int]:
    """Shards held per live segment: one segment of 8^level shards per unit of each base-8 digit."""
    held, level = [], 0
    while shards:
        held += [MERGE_FANOUT**level] * (shards % MERGE_FANOUT)
        shards //= MERGE_FANOUT
        level += 1
    return held


def block_reads(kinds: dict[str, tuple[float, float]], hours: int, postings_per_utterance: float) -> dict:
    """What a new shard of :data:`SHARD_UTTERANCES` utterances reads for chance hits against a corpus
    of ``hours``: ``kinds`` maps a key kind to ``(keys per utterance, chance postings per unrelated
    utterance pair)``. Per live segment of M utterances, a key finds ``M x rate`` chance postings
    (rate: per key, per indexed utterance), present with probability ``1 - exp(-that)`` (uniform
    values; a skew lowers it), and reads a block when present (one more per 256 postings), or with a
    filter's false positive when absent; a segment's distinct blocks cap what it reads.

    Two layouts computed beside uncapped segments: ``audio_postings_capped``, each segment keeping a
    sampled audio key's earliest ``MAX_KEY_OCCURRENCES + 1`` postings only (a key with more never
    votes, so the postings past them are read for nothing; what segments do now, measured by
    ``bench_near_dup_capped_keys``); ``..._one_run_per_level``, besides, each level's
    segments one run partitioned by key range, so a key reads one place per level, not per segment;
    ``..._one_segment``: capped, and a sampled audio key no longer looked up (no block, no filter
    line) in the segments after those (largest first) where its postings passed the cap: a key of
    ``L`` chance postings in the segments before is still looked up with probability ``P(Poisson(L)
    <= MAX_KEY_OCCURRENCES)`` (the reader, measured by ``bench_near_dup_skip_capped``)."""
    from scipy.special import gammaincc

    from speechdata.quality.near_dup_matching import MAX_KEY_OCCURRENCES
    from speechdata.quality.near_dup_postings import BLOCK_RECORDS, POSTING_DTYPE

    shards = round(hours * UTTERANCES_PER_HOUR / SHARD_UTTERANCES)
    segments = live_segments(shards)
    runs_per_level = Counter()
    for held in segments:
        runs_per_level[held] += held

    def blocks_read(runs: list[int], capped: bool, one_segment: bool = False) -> float:
        blocks, audio_before = 0.0, 0.0
        for held in sorted(runs, reverse=True):
            utterances = held * SHARD_UTTERANCES
            segment_blocks = utterances * postings_per_utterance / BLOCK_RECORDS
            wanted = 0.0
            for kind, (keys_per_utterance, per_pair) in kinds.items():
                found = utterances * per_pair / max(keys_per_utterance, 1e-9)
                present = -math.expm1(-found)
                read = min(found, MAX_KEY_OCCURRENCES + 1) if capped and kind == "audio_sampled" else found
                per_key = present * (1 + read / BLOCK_RECORDS) + (1 - present) * FILTER_FALSE_POSITIVES
                if one_segment and kind == "audio_sampled":
                    per_key *= float(gammaincc(MAX_KEY_OCCURRENCES + 1, audio_before)) if audio_before else 1.0
                    audio_before += found
                wanted += SHARD_UTTERANCES * keys_per_utterance * per_key
            blocks += segment_blocks * -math.expm1(-wanted / segment_blocks)
        return blocks

    block_gb = BLOCK_RECORDS * POSTING_DTYPE.itemsize / 1e9
    today = blocks_read(segments, capped=False)
    audio = kinds.get("audio_sampled", (1.0, 0.0))
    return {
        "shards": shards,
        "live_segments": len(segments),
        "largest_segment_shards": max(segments, default=0),
        "chance_postings_per_new_utterance": {
            kind: round(per_pair * hours * UTTERANCES_PER_HOUR) for kind, (_, per_pair) in kinds.items()
        },
        "mean_chance_postings_per_audio_key": round(audio[1] / max(audio[0], 1e-9) * hours * UTTERANCES_PER_HOUR),
        "blocks_per_new_shard": round(today),
        "gb_read_per_new_shard": round(today * block_gb, 2),
        "gb_read_audio_postings_capped": round(blocks_read(segments, capped=True) * block_gb, 2),
        "gb_read_audio_postings_capped_one_segment": round(
            blocks_read(segments, capped=True, one_segment=True) * block_gb, 2
        ),
        "gb_read_audio_postings_capped_one_run_per_level": round(
            blocks_read(list(runs_per_level.values()), capped=True) * block_gb, 2
        ),
    }


def uniform_reads(keys: dict[str, dict]) -> dict:
    """:func:`block_reads` had every key's value been uniform (what the corpus benchmark's synthetic
    index holds): audio keys over 2^31 values, band pairs over 2^28 per pair, the same keys per utterance."""
    from speechdata.quality.near_dup_postings import AUDIO_KEY_SAMPLING

    audio = keys["audio_sampled"]["keys_per_utterance"]
    pairs = keys["envelope_band_pairs"]["keys_per_utterance"]
    rates = {
        "exact": (1.0, 0.0),
        "transcript_bands": (keys["transcript_bands"]["keys_per_utterance"], 0.0),
        "envelope_band_pairs": (pairs, pairs * 2.0**-28),
        "audio_sampled": (audio, audio * audio / (2.0**32 / AUDIO_KEY_SAMPLING)),
    }
    postings = sum(k for k, _ in rates.values())
    return {str(hours): block_reads(rates, hours, postings) for hours in HOURS}


# Keys of today and of the variants


def audio_keys_and_contexts(signals) -> tuple[np.ndarray, np.ndarray]:
    from speechdata.quality.near_dup_postings import neighbour_contexts, sampled_audio_keys

    keys, frames = sampled_audio_keys(signals.fingerprint.sub_fingerprints, signals.fingerprint.active)
    return keys, neighbour_contexts(signals.fingerprint.sub_fingerprints, frames)


def wider_audio_keys(step: int, bits: int) -> Callable:
    """Sampled audio keys (the same frames' choice) of sub-fingerprint n with the low ``bits`` bits
    of n + ``step`` beside it: ``sampled_audio_keys``'s signature, for frames with a frame n + step."""
    from speechdata.quality.near_dup_postings import _AUDIO_SALT, AUDIO_KEY_SAMPLING, _mix

    mask = np.uint64((1 << bits) - 1)

    def keys(sub_fingerprints: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values = sub_fingerprints.astype(np.uint64)
        frames = np.flatnonzero(active)
        frames = frames[frames + step < len(values)]
        sampled = frames[_mix(values[frames]) % np.uint64(AUDIO_KEY_SAMPLING) == 0]
        wide = values[sampled] | ((values[sampled + step] & mask) << np.uint64(32))
        return _mix(wide ^ _AUDIO_SALT), sampled.astype(np.int32)

    return keys


def stop_listed_audio_keys(stop_list: np.ndarray) -> Callable:
    """Today's sampled audio keys without those in ``stop_list`` (sorted uint64 keys)."""
    from speechdata.quality.near_dup_postings import sampled_audio_keys

    def keys(sub_fingerprints: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        found, frames = sampled_audio_keys(sub_fingerprints, active)
        kept = ~np.isin(found, stop_list)
        return found[kept], frames[kept]

    return keys


def soft_probes(signals, reliabilities: np.ndarray, step: int, bits: int, flips: int) -> np.ndarray:
    """The sorted unique keys a soft-decision lookup probes: for every active frame n with a frame
    n + ``step``, the key of ``wider_audio_keys(step, bits)`` with each subset of its ``flips`` least
    reliable bits toggled, kept where the probed sub-fingerprint n is one the index samples."""
    from speechdata.quality.near_dup_postings import _AUDIO_SALT, AUDIO_KEY_SAMPLING, _mix

    values = signals.fingerprint.sub_fingerprints.astype(np.uint64)
    frames = np.flatnonzero(signals.fingerprint.active)
    frames = frames[frames + step < len(values)]
    if len(frames) == 0:
        return np.zeros(0, np.uint64)
    wide = values[frames] | ((values[frames + step] & np.uint64((1 << bits) - 1)) << np.uint64(32))
    reliability = np.concatenate([reliabilities[frames], reliabilities[frames + step][:, :bits]], axis=1)
    weakest = np.argsort(reliability, axis=1, kind="stable")[:, :flips].astype(np.uint64)
    probes = []
    for subset in range(1 << flips):
        toggled = wide.copy()
        for flip in range(flips):
            if subset >> flip & 1:
                toggled ^= np.uint64(1) << weakest[:, flip]
        sampled = _mix(toggled & np.uint64(0xFFFFFFFF)) % np.uint64(AUDIO_KEY_SAMPLING) == 0
        probes.append(_mix(toggled[sampled] ^ _AUDIO_SALT))
    return np.unique(np.concatenate(probes))


def _probes_finding(probes: Sequence[np.ndarray], keys: Sequence[np.ndarray], groups: np.ndarray) -> int:
    """Postings (``keys``) of unrelated utterances that each utterance's ``probes`` find, summed."""
    every_key = np.concatenate(keys)
    owner_group = np.repeat(groups, [len(k) for k in keys])
    order = np.argsort(every_key, kind="stable")
    every_key, owner_group = every_key[order], owner_group[order]
    found = 0
    for group, probed in zip(groups, probes, strict=True):
        starts = np.searchsorted(every_key, probed, "left")
        counts = np.searchsorted(every_key, probed, "right") - starts
        hits = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        found += int((owner_group[hits] != group).sum())
    return found


def band_triples(groups_of_bands: int) -> np.ndarray:
    """``[triples, 3]`` band numbers: every triple inside each of ``groups_of_bands`` equal groups of
    the 24 bands (1: all 2 024 triples)."""
    from speechdata.quality.fingerprint_envelope import LSH_BANDS

    size = LSH_BANDS // groups_of_bands
    return np.array(
        [triple for g in range(groups_of_bands) for triple in combinations(range(g * size, (g + 1) * size), 3)]
    )


def triple_envelope_keys(triples: np.ndarray) -> Callable:
    """Envelope keys of three bands each (42 bits of SimHash): ``envelope_keys``'s signature."""
    from speechdata.quality.fingerprint_envelope import envelope_band_keys
    from speechdata.quality.near_dup_postings import _ENVELOPE_SALT, _mix

    def keys(envelope: np.ndarray) -> np.ndarray:
        bands = envelope_band_keys(envelope)
        joined = (
            (bands[triples[:, 0]] << np.uint64(38)) | (bands[triples[:, 1]] << np.uint64(19)) | bands[triples[:, 2]]
        )
        return _mix(joined ^ _ENVELOPE_SALT)

    return keys


@dataclass(frozen=True)
class EnvelopeHashing:
    """Envelope band keys from any hyperplanes: bit i of an envelope ``e`` is ``hyperplanes[i] @ e >
    thresholds[i]``, ``bands`` bands of ``bits`` bits (today: :data:`~speechdata.quality.fingerprint_envelope.LSH_BANDS`
    of 14, random Gaussian hyperplanes through the origin)."""

    hyperplanes: np.ndarray
    """float64 ``[bands * bits, ENVELOPE_POINTS]``."""
    thresholds: np.ndarray
    bands: int
    bits: int

    def band_keys(self, envelope: np.ndarray) -> np.ndarray:
        """uint64 ``[bands]``: ``envelope_band_keys``'s layout (the band number above the bits)."""
        signs = (self.hyperplanes @ envelope.astype(np.float64) > self.thresholds).reshape(self.bands, self.bits)
        values = signs.astype(np.uint64) @ (np.uint64(1) << np.arange(self.bits, dtype=np.uint64))
        return values | (np.arange(self.bands, dtype=np.uint64) << np.uint64(self.bits))

    def pair_keys(self, envelope: np.ndarray) -> np.ndarray:
        """The salted band-pair keys (``near_dup_postings.envelope_keys``'s signature): a candidate
        still shares 3 bands (3 pairs)."""
        from speechdata.quality.near_dup_postings import _ENVELOPE_SALT, _mix

        bands = self.band_keys(envelope)
        first, second = np.triu_indices(self.bands, k=1)
        shift = np.uint64(self.bits + max(1, (self.bands - 1).bit_length()))
        return _mix(((bands[first] << shift) | bands[second]) ^ _ENVELOPE_SALT)


def envelopes_of(signals: Sequence) -> np.ndarray:
    """float64 ``[n, ENVELOPE_POINTS]``: the envelopes of the utterances that have one."""
    from speechdata.quality.fingerprint_envelope import ENVELOPE_POINTS

    rows = [s.shift.envelope for s in signals if s.shift is not None]
    return np.array(rows, np.float64).reshape(len(rows), ENVELOPE_POINTS)


def random_hashing(bands: int, bits: int) -> EnvelopeHashing:
    """Today's hashing with other band counts and widths (the same seed; 24 of 14: today's hyperplanes)."""
    from speechdata.quality.fingerprint_envelope import ENVELOPE_POINTS, LSH_SEED

    hyperplanes = np.random.default_rng(LSH_SEED).standard_normal((bands * bits, ENVELOPE_POINTS))
    return EnvelopeHashing(hyperplanes, np.zeros(bands * bits), bands, bits)


def balanced_hashing(fit: np.ndarray, bands: int, bits: int) -> EnvelopeHashing:
    """Today's hyperplanes, each bit's threshold at its median over the envelopes ``fit``: every bit
    balanced on that corpus (but still correlated with the others)."""
    plain = random_hashing(bands, bits)
    return EnvelopeHashing(plain.hyperplanes, np.median(fit @ plain.hyperplanes.T, axis=0), bands, bits)


def whitened_hashing(fit: np.ndarray, bands: int, bits: int, components: int | None = None) -> EnvelopeHashing:
    """Gaussian hyperplanes drawn in a whitened basis of the envelopes ``fit``: their mean removed,
    projected on their ``components`` leading principal directions (None: every direction with
    variance), each scaled to unit variance, so on that corpus every bit is balanced and, for
    Gaussian envelopes, independent of the others. The bit is ``g @ W (e - mean) > 0``, that is a
    hyperplane ``W^T g`` with threshold ``(W^T g) @ mean`` over the envelope itself."""
    from speechdata.quality.fingerprint_envelope import LSH_SEED

    mean = fit.mean(axis=0)
    variances, directions = np.linalg.eigh(np.cov((fit - mean).T))
    order = np.argsort(variances)[::-1]
    # The envelopes have no mean and unit norm: two directions carry no variance (a small fit corpus more).
    order = order[variances[order] > variances[order[0]] * 1e-9][:components]
    whitening = (directions[:, order] / np.sqrt(variances[order])).T
    hyperplanes = np.random.default_rng(LSH_SEED).standard_normal((bands * bits, len(order))) @ whitening
    return EnvelopeHashing(hyperplanes, hyperplanes @ mean, bands, bits)


FRONTIER_SHAPES = ((14, 24), (16, 32), (18, 40), (20, 48))
"""``(bits, bands)`` of the band shapes the frontier weighs (today: 14 bits, 24 bands)."""
FRONTIER_COPY_TRANSFORMS = ("tempo", "pitch", "padded", "gain", "same_speaker_reading", "tempo_of_reading")
"""The copies the envelope keys are there to find (the others share audio keys, or no envelope)."""


def envelope_basis(fit: np.ndarray, strength: float, components: int | None, centred: bool) -> Callable:
    """``envelopes -> coordinates``: ``fit``'s principal directions (its ``components`` leading ones;
    None: every one with variance), each scaled by its variance to the power ``-strength / 2`` (0:
    a rotation, today's space; 1: whitened), the fit's mean removed first when ``centred``."""
    mean = fit.mean(axis=0) if centred else np.zeros(fit.shape[1])
    variances, directions = np.linalg.eigh(np.cov((fit - fit.mean(axis=0)).T))
    order = np.argsort(variances)[::-1]
    order = order[variances[order] > variances[order[0]] * 1e-9][:components]
    projection = directions[:, order] * variances[order] ** (-strength / 2)
    return lambda envelopes: (envelopes - mean) @ projection


def _correlations(basis: Callable, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    x, y = basis(first), basis(second)
    return (x * y).sum(axis=1) / np.maximum(np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1), 1e-12)


def _unrelated_correlations(basis: Callable, corpus: Corpus) -> np.ndarray:
    with_envelope = [i for i, s in enumerate(corpus.signals) if s.shift is not None]
    coordinates = basis(envelopes_of(corpus.signals))
    coordinates /= np.maximum(np.linalg.norm(coordinates, axis=1, keepdims=True), 1e-12)
    first, second = np.triu_indices(len(with_envelope), 1)
    groups = corpus.groups[with_envelope]
    unrelated = groups[first] != groups[second]
    return (coordinates[first[unrelated]] * coordinates[second[unrelated]]).sum(axis=1)


def _band_agreement(correlations: np.ndarray, bits: int) -> np.ndarray:
    """The chance that two envelopes of these correlations (in the hashing's space) share a band of
    ``bits`` Gaussian hyperplanes through the origin: each bit agrees with chance 1 - angle / pi."""
    return (1 - np.arccos(np.clip(correlations, -1, 1)) / np.pi) ** bits


def _at_least_3_of(bands: int, share: np.ndarray) -> np.ndarray:
    """The chance that at least 3 of ``bands`` independent bands, each shared with chance ``share``, are."""
    below = sum(math.comb(bands, k) * share**k * (1 - share) ** (bands - k) for k in range(3))
    return 1 - below


def _frontier_copies(planted_sets: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(copies' envelopes, their originals', which are readings)`` of :data:`FRONTIER_COPY_TRANSFORMS`."""
    pairs = []
    for planted, signals in planted_sets.values():
        index = {u.utt_id: i for i, u in enumerate(planted)}
        for i, utterance in enumerate(planted):
            if utterance.transform in FRONTIER_COPY_TRANSFORMS and utterance.copy_of in index:
                copy, original = signals[i].shift, signals[index[utterance.copy_of]].shift
                if copy is not None and original is not None:
                    pairs.append((utterance.transform, copy.envelope, original.envelope))
    return (
        np.array([c for _, c, _ in pairs], np.float64).reshape(len(pairs), -1),
        np.array([o for _, _, o in pairs], np.float64).reshape(len(pairs), -1),
        np.array([t in ("same_speaker_reading", "tempo_of_reading") for t, _, _ in pairs], bool),
    )


_COPY_FIGURES = ("copies_found_mean", "weakest_copy_found", "every_reading_copy_found")


def hashing_frontier(
    fits: dict[str, np.ndarray], planted_sets: dict, measured: Sequence[Corpus], quick: bool = False
) -> dict:
    """Expected over the draws of Gaussian hyperplanes, so free of one draw's luck: for each basis
    (:func:`envelope_basis`: fitted on each of ``fits``, strength 0 / 0.5 / 1, 16 / 32 / every
    component, centred or not; ``quick``: whitened only) and band shape (:data:`FRONTIER_SHAPES`), the chance postings of the
    band-pair keys per unrelated pair of each ``measured`` corpus (``C(bands, 2)`` times the mean
    squared band agreement) and how the copies of :data:`FRONTIER_COPY_TRANSFORMS` fare (their
    chance of sharing 3 bands: the mean, the weakest copy's, and that of finding every reading's
    copy). ``best_keeping_recall``: per fit, the basis and shape with the most fold fewer chance
    postings on the least improved out-of-sample corpus, among those whose copies fare no worse than
    today's on all three."""
    copies, originals, readings = _frontier_copies(planted_sets)

    def weighed(basis: Callable) -> dict[tuple[int, int], dict]:
        copy_correlations = _correlations(basis, copies, originals)
        unrelated = {corpus.name: _unrelated_correlations(basis, corpus) for corpus in measured}
        made = {}
        for bits, bands in FRONTIER_SHAPES:
            found = _at_least_3_of(bands, _band_agreement(copy_correlations, bits))
            made[bits, bands] = {
                "keys_per_utterance": bands * (bands - 1) // 2,
                "copies_found_mean": round(float(found.mean()), 4),
                "weakest_copy_found": round(float(found.min()), 4),
                "every_reading_copy_found": round(float(np.prod(found[readings])), 4),
                "chance_per_unrelated_pair": {
                    name: float(f"{bands * (bands - 1) / 2 * np.mean(_band_agreement(r, bits) ** 2):.4g}")
                    for name, r in unrelated.items()
                },
            }
        return made

    today = weighed(lambda envelopes: envelopes)[14, 24]
    rows = []
    grid = ((True,), (1.0,), (None,)) if quick else ((False, True), (0.0, 0.5, 1.0), (16, 32, None))
    for (fitted_on, fit), centred, strength, components in product(fits.items(), *grid):
        for (bits, bands), figures in weighed(envelope_basis(fit, strength, components, centred)).items():
            rate = figures["chance_per_unrelated_pair"]
            fewer = {
                name: round(today["chance_per_unrelated_pair"][name] / max(rate[name], 1e-300), 2) for name in rate
            }
            rows.append(
                {
                    "fitted_on": fitted_on,
                    "centred": centred,
                    "strength": strength,
                    "components": components or "all",
                    "bits": bits,
                    "bands": bands,
                    **figures,
                    "times_fewer_chance_postings": fewer,
                }
            )
    best = {}
    for fitted_on in fits:
        out_of_sample = [c.name for c in measured if c.name != fitted_on]
        keeping = [
            row
            for row in rows
            if row["fitted_on"] == fitted_on and all(row[k] >= today[k] - 1e-9 for k in _COPY_FIGURES)
        ]
        if keeping:
            best[fitted_on] = max(
                keeping, key=lambda row: min(row["times_fewer_chance_postings"][n] for n in out_of_sample)
            )
    return {"today": today, "copies_weighed": len(copies), "best_keeping_recall": best, "rows": rows}


@dataclass(frozen=True)
class Variant:
    name: str
    audio_keys: Callable | None = None
    """Replaces ``near_dup_postings.sampled_audio_keys`` (index and lookup alike)."""
    envelope_keys: Callable | None = None
    """Replaces ``near_dup_postings.envelope_keys``; a candidate then needs one shared key (three bands),
    or, with ``envelope_hashing``, three shared band pairs as today."""
    probe_bits: int = 0
    """Keys alone: ``audio_keys`` of n + these bits of n+1, looked up with every value within one bit of them."""
    soft_probe: tuple[int, int, int] | None = None
    """Keys alone: ``(step, bits, flips)``: the index holds ``wider_audio_keys(step, bits)``; a lookup
    probes every active frame's key with each subset of its ``flips`` least reliable bits toggled
    (:func:`soft_probes`)."""
    decided: bool = True
    envelope_hashing: EnvelopeHashing | None = None
    """Band-pair keys of these hyperplanes (``envelope_keys`` is its ``pair_keys``): a candidate still
    shares 3 bands."""
    fitted_on: str | None = None
    """The corpus whose envelopes chose ``envelope_hashing`` (its figures there are in-sample)."""


@contextlib.contextmanager
def keys_of(variant: Variant) -> Iterator[None]:
    """Today's decision procedure with the variant's keys."""
    from speechdata.quality import near_dup_matching, near_dup_postings

    with contextlib.ExitStack() as stack:
        if variant.audio_keys is not None:
            stack.enter_context(mock.patch.object(near_dup_postings, "sampled_audio_keys", variant.audio_keys))
        if variant.envelope_keys is not None:
            stack.enter_context(mock.patch.object(near_dup_postings, "envelope_keys", variant.envelope_keys))
        if variant.envelope_hashing is not None:
            pairs = variant.envelope_hashing.bands * (variant.envelope_hashing.bands - 1) // 2
            # where an utterance's envelope keys end before its audio keys (their span contexts)
            stack.enter_context(mock.patch.object(near_dup_postings, "LSH_BAND_PAIRS", pairs))
        elif variant.envelope_keys is not None:
            stack.enter_context(mock.patch.object(near_dup_matching, "MIN_SHARED_ENVELOPE_PAIRS", 1))
        yield


def envelope_variants(fits: dict[str, np.ndarray], quick: bool) -> list[Variant]:
    """Envelope hashings that keep the band-pair keys and the 3-band rule: hyperplanes in a whitened
    basis (every direction, or the leading ones), balanced thresholds, other band counts and widths.
    ``fits``: the envelopes each fitted variant is fitted on, by corpus name ("synthetic", and a
    speech corpus), so each is measured out of sample on the others."""
    from speechdata.quality.fingerprint_envelope import LSH_BAND_BITS, LSH_BANDS

    made = []
    for fitted_on, fit in fits.items():
        made.append(
            Variant(
                f"envelope_whitened_fit_{fitted_on}",
                envelope_hashing=whitened_hashing(fit, LSH_BANDS, LSH_BAND_BITS),
                fitted_on=fitted_on,
            )
        )
    if quick:
        return [replace(v, envelope_keys=v.envelope_hashing.pair_keys) for v in made]
    synthetic = fits["synthetic"]
    made += [
        Variant(
            f"envelope_whitened_top_{components}_fit_synthetic",
            envelope_hashing=whitened_hashing(synthetic, LSH_BANDS, LSH_BAND_BITS, components),
            fitted_on="synthetic",
        )
        for components in (32, 16)
    ]
    made.append(
        Variant(
            "envelope_balanced_fit_synthetic",
            envelope_hashing=balanced_hashing(synthetic, LSH_BANDS, LSH_BAND_BITS),
            fitted_on="synthetic",
        )
    )
    for bands, bits in ((24, 12), (32, 16)):
        made.append(
            Variant(
                f"envelope_whitened_{bands}_bands_of_{bits}_fit_synthetic",
                envelope_hashing=whitened_hashing(synthetic, bands, bits),
                fitted_on="synthetic",
            )
        )
        made.append(Variant(f"envelope_{bands}_bands_of_{bits}", envelope_hashing=random_hashing(bands, bits)))
    return [replace(v, envelope_keys=v.envelope_hashing.pair_keys) for v in made]


def variants(corpora: Sequence[Corpus], quick: bool, fits: dict[str, np.ndarray] | None = None) -> list[Variant]:
    widths = ((1, 8), (2, 16)) if quick else ((1, 4), (1, 8), (1, 16), (1, 32), (2, 8), (2, 16), (2, 32))
    made = [Variant("today")]
    made += [
        Variant(f"audio_n_and_{bits}_bits_of_n+{step}", audio_keys=wider_audio_keys(step, bits))
        for step, bits in widths
    ]
    made.append(
        Variant(
            "audio_n_and_8_bits_of_n+1_probed_within_1_bit",
            audio_keys=wider_audio_keys(1, 8),
            probe_bits=8,
            decided=False,
        )
    )
    soft = ((2, 16, 4),) if quick else ((2, 16, 4), (2, 32, 4), (2, 32, 6))
    made += [
        Variant(
            f"audio_n_and_{bits}_bits_of_n+{step}_probing_the_{flips}_least_reliable",
            soft_probe=(step, bits, flips),
            decided=False,
        )
        for step, bits, flips in soft
    ]
    # A stop-list of the values most common in the corpora themselves: the most it could remove.
    every_key = np.concatenate([audio_keys_and_contexts(s)[0] for corpus in corpora for s in corpus.signals])
    values, counts = np.unique(every_key, return_counts=True)
    for listed in (100,) if quick else (100, 1_000):
        stop_list = np.sort(values[np.argsort(-counts, kind="stable")[:listed]])
        made.append(
            Variant(
                f"audio_stop_list_of_{listed}_most_common", audio_keys=stop_listed_audio_keys(stop_list), decided=False
            )
        )
    for groups_of_bands in (3,) if quick else (1, 2, 3):
        name = "envelope_every_band_triple" if groups_of_bands == 1 else f"envelope_triples_in_{groups_of_bands}_groups"
        made.append(Variant(name, envelope_keys=triple_envelope_keys(band_triples(groups_of_bands))))
    return made + envelope_variants(fits or {}, quick)


def _probe_pairs(keys_per_utterance, low_bits_per_utterance, groups, bits) -> int:
    """Chance pairs of a probed key: the same sub-fingerprint n, its ``bits`` bits of n+1 within one bit."""
    first, second = _group_pairs(keys_per_utterance, groups)  # pairs with n equal (today's keys)
    low = np.concatenate(low_bits_per_utterance)
    return int((_bit_counts(low[first] ^ low[second]) <= 1).sum())


def variant_key_figures(variant: Variant, corpus: Corpus) -> dict:
    """The variant's audio or envelope keys on ``corpus`` (:func:`key_figures`)."""
    from speechdata.quality.near_dup_postings import sampled_audio_keys

    if variant.envelope_keys is not None:
        keys = [variant.envelope_keys(s.shift.envelope) if s.shift else np.zeros(0, np.uint64) for s in corpus.signals]
        figures = key_figures(keys, corpus.groups, positional=True)
        if variant.envelope_hashing is not None:
            bands = variant.envelope_hashing.band_keys
            single = key_figures(
                [bands(s.shift.envelope) if s.shift else np.zeros(0, np.uint64) for s in corpus.signals],
                corpus.groups,
                positional=True,
            )
            figures["single_band_effective_bits"] = single["effective_bits"]
            figures["bits_off_balance"] = round(bit_imbalance(variant.envelope_hashing, corpus.signals), 4)
            figures["bands_shared"] = shared_band_figures(corpus.signals, corpus.groups, bands)
        return figures
    if variant.soft_probe is not None:
        step, bits, flips = variant.soft_probe
        indexed = wider_audio_keys(step, bits)
        keys = [indexed(s.fingerprint.sub_fingerprints, s.fingerprint.active)[0] for s in corpus.signals]
        probes = [
            soft_probes(s, r, step, bits, flips) for s, r in zip(corpus.signals, corpus.reliabilities, strict=True)
        ]
        figures = key_figures(keys, corpus.groups)
        chance = _probes_finding(probes, keys, corpus.groups)
        lookups = float(np.mean([len(p) for p in probes]))
        ordered_pairs = 2 * figures["unrelated_utterance_pairs"]
        per_pair = chance / max(ordered_pairs, 1)
        figures.update(
            chance_postings=chance,
            chance_per_utterance_pair=float(f"{per_pair:.4g}"),
            effective_bits=round(
                -math.log2(max(chance, 1) / max(ordered_pairs, 1) / max(lookups * figures["keys_per_utterance"], 1)), 1
            ),
            effective_bits_is_lower_bound=chance == 0,
            lookups_per_utterance=round(lookups, 1),
        )
        return figures
    if variant.probe_bits:
        keys, low = [], []
        for s in corpus.signals:
            found, frames = sampled_audio_keys(s.fingerprint.sub_fingerprints, s.fingerprint.active)
            keys.append(found)
            low.append(_probed_bits(s, frames, variant.probe_bits))
        figures = key_figures(keys, corpus.groups)
        chance = _probe_pairs(keys, low, corpus.groups, variant.probe_bits)
        _, key_pairs = _unrelated_counts(np.array([len(k) for k in keys]), corpus.groups)
        figures.update(
            chance_postings=chance,
            chance_per_utterance_pair=float(f"{chance / max(figures['unrelated_utterance_pairs'], 1):.4g}"),
            chance_per_key_pair=float(f"{chance / max(key_pairs, 1):.4g}"),
            effective_bits=round(-math.log2(max(chance, 1) / max(key_pairs, 1)), 1),
            lookups_per_key=1 + variant.probe_bits,
        )
        return figures
    audio = variant.audio_keys or sampled_audio_keys
    keys = [audio(s.fingerprint.sub_fingerprints, s.fingerprint.active)[0] for s in corpus.signals]
    return key_figures(keys, corpus.groups)


def copies_sharing_no_key(variant: Variant, planted, signals, reliabilities: Sequence) -> dict[str, int]:
    """Per transform, the planted copies whose original shares none of the variant's audio keys (a
    probed key: today's key, with its probed bits within one bit; soft probes: any probe of the copy
    is a key of the original)."""
    from speechdata.quality.near_dup_postings import sampled_audio_keys

    audio = variant.audio_keys if variant.audio_keys is not None and not variant.probe_bits else sampled_audio_keys
    index = {u.utt_id: i for i, u in enumerate(planted)}
    lost = Counter()
    for i, utterance in enumerate(planted):
        if utterance.copy_of is None:
            continue
        pair = [signals[i], signals[index[utterance.copy_of]]]
        if variant.soft_probe is not None:
            probes = soft_probes(pair[0], reliabilities[i], *variant.soft_probe)
            original = wider_audio_keys(*variant.soft_probe[:2])(
                pair[1].fingerprint.sub_fingerprints, pair[1].fingerprint.active
            )[0]
            lost[utterance.transform] += not np.isin(probes, original).any()
            continue
        keys = [audio(s.fingerprint.sub_fingerprints, s.fingerprint.active) for s in pair]
        if variant.probe_bits:
            low = [_probed_bits(s, frames, variant.probe_bits) for s, (_, frames) in zip(pair, keys, strict=True)]
            first, second = _group_pairs([keys[0][0], keys[1][0]], np.array([0, 1]))
            every_low = np.concatenate(low)
            shared = (_bit_counts(every_low[first] ^ every_low[second]) <= 1).any()
        else:
            shared = np.isin(keys[0][0], keys[1][0]).any()
        lost[utterance.transform] += not shared
    return dict(sorted(lost.items()))


def bit_imbalance(hashing: EnvelopeHashing, signals: Sequence) -> float:
    """The mean over the hashing's bits of ``|P(bit set) - 0.5|`` on these utterances' envelopes."""
    envelopes = envelopes_of(signals)
    return float(np.abs((envelopes @ hashing.hyperplanes.T > hashing.thresholds).mean(axis=0) - 0.5).mean())


def copies_sharing_few_bands(hashing: EnvelopeHashing, planted_sets: dict) -> dict[str, dict]:
    """Per planted set and transform, of the copies with an envelope (and an original with one), how
    many share fewer than 3 of the hashing's bands with their original (no envelope candidate), and
    the fewest shared."""
    figures: dict[str, dict] = {}
    for set_name, (planted, signals) in planted_sets.items():
        index = {u.utt_id: i for i, u in enumerate(planted)}
        shared_by: dict[str, list[int]] = {}
        for i, utterance in enumerate(planted):
            if utterance.copy_of is None:
                continue
            pair = signals[i].shift, signals[index[utterance.copy_of]].shift
            if pair[0] is None or pair[1] is None:
                continue
            shared = int((hashing.band_keys(pair[0].envelope) == hashing.band_keys(pair[1].envelope)).sum())
            shared_by.setdefault(utterance.transform, []).append(shared)
        figures[set_name] = {
            transform: {"under_3": sum(n < 3 for n in shared), "of": len(shared), "fewest": min(shared)}
            for transform, shared in sorted(shared_by.items())
        }
    return figures


def _probed_bits(signals, frames: np.ndarray, bits: int) -> np.ndarray:
    """The low ``bits`` bits of the sub-fingerprint after each of ``frames`` (the frame's own at the end)."""
    values = signals.fingerprint.sub_fingerprints
    return values[np.minimum(frames + 1, len(values) - 1)].astype(np.uint64) & np.uint64((1 << bits) - 1)


def _bit_counts(values: np.ndarray) -> np.ndarray:
    return np.unpackbits(values.astype("<u8").view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)


# Deciding with a variant's keys


def decided(variant: Variant, planted, signals) -> dict:
    """Precision, recall per transform and the decisions, all signals and audio alone."""
    from benchmarks.accuracy.bench_near_duplicates import recall_by_transform
    from speechdata.quality.near_dup_matching import KINDS, NearDuplicateThresholds, find_representatives
    from speechdata.quality.near_dup_planted import score

    figures = {}
    with keys_of(variant):
        for label, thresholds in (
            ("all_signals", NearDuplicateThresholds()),
            ("audio_alone", NearDuplicateThresholds(check_transcripts=False)),
        ):
            decisions = find_representatives([], signals, thresholds)
            flagged = {d.utt_id: (d.kind, d.representative_utt) for d in decisions if d.kind in KINDS}
            counted = () if label == "all_signals" else _audio_transforms()
            measured = score(planted, flagged, counted)
            figures[label] = {
                "precision": round(measured.precision, 4),
                "recall": round(measured.recall, 4),
                "recall_by_transform": recall_by_transform(planted, measured),
                "decisions": [(d.utt_id, d.kind, d.representative_shard, d.representative_utt) for d in decisions],
            }
    return figures


def _audio_transforms() -> tuple[str, ...]:
    from speechdata.quality.near_dup_planted import AUDIO_TRANSFORMS, EXTENDED_AUDIO_TRANSFORMS, READING_TRANSFORMS

    return AUDIO_TRANSFORMS + EXTENDED_AUDIO_TRANSFORMS + READING_TRANSFORMS[1:]


# The corpora


def corpora(
    originals: int, seed: int, espeak_folders: Sequence[str], with_readings: bool = True
) -> tuple[list[Corpus], dict]:
    """The two corpora and the planted sets their signals came from (for deciding). Only
    ``with_readings``: the readings (with their speaker embeddings) and the extended planted set
    (tempo and pitch copies, made by librosa's phase vocoder: seconds to import and run)."""
    from speechdata.quality.near_dup_planted import planted_readings, planted_set
    from speechdata.quality.speakers import shipped_speaker_encoder

    planted = planted_set(originals, seed=seed, extended=with_readings)
    synthetic = [_measured("synthetic", u.utt_id, u.samples, 24_000, u.text) for u in planted]
    synthetic_groups = np.array([int(u.utt_id.rsplit("-", 1)[1]) for u in planted])
    readings = planted_readings(FIXTURES / "readings") if with_readings else []
    encoder = shipped_speaker_encoder() if with_readings else None
    espeak = [_measured("readings", u.utt_id, u.samples, 24_000, u.text, lambda: encoder) for u in readings]
    group_names = [u.utt_id.split("-")[1] for u in readings]
    for folder in espeak_folders:
        for path in sorted((FIXTURES / folder).glob("*.flac")):
            espeak.append(_file_measured(path, f"{folder}/{path.stem}"))
            group_names.append(f"{folder}/{path.stem}")
    hashes: dict[str, str] = {}
    for (signals, _), name in zip(espeak, group_names, strict=True):
        if signals.exact_hash is not None:  # the same samples in two folders: one group
            hashes.setdefault(signals.exact_hash, name)
    names = [hashes.get(s.exact_hash, n) if s.exact_hash else n for (s, _), n in zip(espeak, group_names, strict=True)]
    numbered = {name: number for number, name in enumerate(dict.fromkeys(names))}
    made = [
        Corpus("synthetic", [s for s, _ in synthetic], synthetic_groups, [r for _, r in synthetic]),
        Corpus("espeak", [s for s, _ in espeak], np.array([numbered[n] for n in names]), [r for _, r in espeak]),
    ]
    planted_sets = {"synthetic": (planted, made[0].signals)}
    if with_readings:
        planted_sets["readings"] = (readings, made[1].signals[: len(readings)])
    return made, planted_sets


def _measured(shard_id: str, utt_id: str, samples, rate: int, text: str | None, speakers=None) -> tuple:
    """The utterance's signals, as the stage computes them, and its fingerprint bits' reliabilities."""
    from speechdata.quality.fingerprint_audio import bit_reliabilities
    from speechdata.quality.near_duplicates import utterance_signals

    signals = utterance_signals(shard_id, utt_id, samples, rate, text, speakers)
    return signals, bit_reliabilities(samples, rate)


def _file_measured(path: Path, utt_id: str) -> tuple:
    import soundfile as sf

    samples, rate = sf.read(path, dtype="float32")
    return _measured("speech", utt_id, samples.mean(axis=1) if samples.ndim > 1 else samples, rate, None)


SPEECH_SUFFIXES = (".flac", ".wav", ".ogg", ".mp3")


def speech_folder_corpus(folder: Path) -> Corpus:
    """Every audio file under ``folder`` (``--speech-dir``: a sample of one's own corpus), each file
    unrelated to the others but those with the same samples. No two files should be copies of each
    other: a copy's hits would count as chance."""
    paths = sorted(p for p in folder.rglob("*") if p.suffix.lower() in SPEECH_SUFFIXES)
    measured = [_file_measured(path, str(path.relative_to(folder))) for path in paths]
    first_of: dict[str, int] = {}
    groups = [first_of.setdefault(s.exact_hash, i) if s.exact_hash else i for i, (s, _) in enumerate(measured)]
    return Corpus(f"speech_dir:{folder.name}", [s for s, _ in measured], np.array(groups), [r for _, r in measured])


# The record


def corpus_figures(corpus: Corpus) -> dict:
    from speechdata.quality.fingerprint_envelope import envelope_band_keys
    from speechdata.quality.near_dup_postings import envelope_keys, exact_key, transcript_keys

    audio = [audio_keys_and_contexts(s) for s in corpus.signals]
    every_frame = [s.fingerprint.sub_fingerprints[s.fingerprint.active].astype(np.uint64) for s in corpus.signals]
    no_keys = np.zeros(0, np.uint64)
    kinds = {
        "exact": key_figures(
            [np.array([exact_key(s.exact_hash)]) if s.exact_hash else no_keys for s in corpus.signals], corpus.groups
        ),
        "transcript_bands": key_figures(
            [
                transcript_keys(s.transcript_signature) if s.transcript_signature is not None else no_keys
                for s in corpus.signals
            ],
            corpus.groups,
            positional=True,
        ),
        "envelope_band_pairs": key_figures(
            [envelope_keys(s.shift.envelope) if s.shift is not None else no_keys for s in corpus.signals],
            corpus.groups,
            positional=True,
        ),
        "audio_sampled": key_figures([k for k, _ in audio], corpus.groups, [c for _, c in audio]),
    }
    figures = {
        "utterances": len(corpus.signals),
        "audio_seconds_per_utterance": round(
            float(np.mean([s.fingerprint.frames for s in corpus.signals])) * 128 / 8_000, 2
        ),
        "keys": kinds,
        "audio_every_active_sub_fingerprint": key_figures(every_frame, corpus.groups),
        # Not a lookup key since band pairs: how far the envelope's 14-bit SimHash bands are from uniform.
        "envelope_single_bands": key_figures(
            [envelope_band_keys(s.shift.envelope) if s.shift is not None else no_keys for s in corpus.signals],
            corpus.groups,
            positional=True,
        ),
        "envelope_bands_shared": shared_band_figures(corpus.signals, corpus.groups),
    }
    postings = sum(kind["keys_per_utterance"] for kind in kinds.values())
    rates = {name: (kind["keys_per_utterance"], kind["chance_per_utterance_pair"]) for name, kind in kinds.items()}
    figures["at_hours"] = {str(hours): block_reads(rates, hours, postings) for hours in HOURS}
    return figures


def variant_figures(
    variant: Variant, made: list[Corpus], planted_sets: dict, today_keys: dict[str, dict], today: dict | None
) -> dict:
    """A variant's keys per utterance, index bytes, chance figures and (decided) its planted scores.
    ``today_keys``: each corpus's key figures of today's keys; ``today``: today's decisions (None:
    this is today's keys, whose decisions the result holds)."""
    figures: dict = {}
    for corpus in made:
        keys = variant_key_figures(variant, corpus)
        kind = "envelope_band_pairs" if variant.envelope_keys is not None else "audio_sampled"
        rates = {
            name: (k["keys_per_utterance"], k["chance_per_utterance_pair"])
            for name, k in today_keys[corpus.name].items()
        }
        postings = sum(k for k, _ in rates.values()) - rates[kind][0] + keys["keys_per_utterance"]
        rates[kind] = (keys.get("lookups_per_utterance", keys["keys_per_utterance"]), keys["chance_per_utterance_pair"])
        figures[corpus.name] = {
            "fitted_on_this_corpus": variant.fitted_on == corpus.name if variant.fitted_on else None,
            "keys": {k: keys[k] for k in keys if k not in ("unrelated_utterance_pairs",)},
            "index_bytes_per_utterance": round(postings * (28 + FILTER_BYTES_PER_POSTING)),
            "at_hours": {str(hours): block_reads(rates, hours, postings) for hours in HOURS},
        }
    if variant.envelope_keys is None:
        planted, signals = planted_sets["synthetic"]
        synthetic = next(corpus for corpus in made if corpus.name == "synthetic")
        figures["copies_sharing_no_audio_key"] = copies_sharing_no_key(
            variant, planted, signals, synthetic.reliabilities
        )
    if variant.envelope_hashing is not None:
        figures["copies_sharing_under_3_bands"] = copies_sharing_few_bands(variant.envelope_hashing, planted_sets)
    if variant.decided:
        for set_name, (planted, signals) in planted_sets.items():
            scored = decided(variant, planted, signals)
            for label, result in scored.items():
                decisions = result.pop("decisions")
                if today is not None:
                    reference = today[f"{set_name}_{label}_decisions"]
                    result["decisions_differing_from_today"] = sum(
                        a != b for a, b in zip(decisions, reference, strict=True)
                    )
                else:
                    figures[f"{set_name}_{label}_decisions"] = decisions
                figures[f"{set_name}_{label}"] = result
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="8 originals (not the extended set), the speech fixtures only (no readings), 7 variants",
    )
    parser.add_argument("--originals", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="of the planted set's generator")
    parser.add_argument("--variants", action="store_true", help="also measure and decide with wider keys")
    parser.add_argument(
        "--speech-dir",
        action="append",
        default=[],
        type=Path,
        help="a folder of speech files (FLAC, WAV, Ogg, MP3; no two copies of each other) measured as a corpus of its own",
    )
    parser.add_argument(
        "--fit-dir",
        type=Path,
        help="a folder of speech files whose envelopes fit the speech-fitted envelope hashing (default: the"
        " espeak corpus, then in-sample there); the synthetic-fitted ones fit the planted set",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="with --variants: only the variants whose name contains this (repeatable; today's keys always)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.originals = 8
    folders = ESPEAK_FOLDERS[:1] if args.quick else ESPEAK_FOLDERS
    with stdout_to_stderr():
        started = time.perf_counter()
        made, planted_sets = corpora(args.originals, args.seed, folders, with_readings=not args.quick)
        made += [speech_folder_corpus(folder) for folder in args.speech_dir]
        progress(f"signals of {sum(len(c.signals) for c in made)} utterances in {time.perf_counter() - started:.1f} s")
        figures: dict = {"corpora": {}}
        for corpus in made:
            figures["corpora"][corpus.name] = corpus_figures(corpus)
        today_keys = {name: corpus["keys"] for name, corpus in figures["corpora"].items()}
        figures["uniform_keys_at_hours"] = uniform_reads(figures["corpora"]["synthetic"]["keys"])
        if args.variants or args.quick:
            figures["variants"] = {}
            today = None
            speech = speech_folder_corpus(args.fit_dir) if args.fit_dir else made[1]
            fits = {"synthetic": envelopes_of(made[0].signals), speech.name: envelopes_of(speech.signals)}
            chosen = [
                v
                for v in variants(made, args.quick, fits)
                if v.name == "today" or not args.only or any(part in v.name for part in args.only)
            ]
            figures["envelope_hashing_frontier"] = hashing_frontier(fits, planted_sets, made, args.quick)
            progress(f"envelope hashing frontier: {time.perf_counter() - started:.1f} s")
            for variant in chosen:
                started = time.perf_counter()
                measured = variant_figures(variant, made, planted_sets, today_keys, today)
                if today is None:
                    today = {k: measured.pop(k) for k in list(measured) if k.endswith("_decisions")}
                figures["variants"][variant.name] = measured
                progress(f"{variant.name}: {time.perf_counter() - started:.1f} s")
    emit(
        "near_dup_keyspace",
        {
            "quick": args.quick,
            "originals": args.originals,
            "seed": args.seed,
            "variants": args.variants,
            "espeak_folders": list(folders),
            "speech_dirs": [str(folder) for folder in args.speech_dir],
            "fit_dir": str(args.fit_dir) if args.fit_dir else None,
            "only": args.only,
        },
        figures,
    )


if __name__ == "__main__":
    main()
