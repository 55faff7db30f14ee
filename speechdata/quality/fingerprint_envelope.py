"""A tempo- and pitch-invariant audio signature: the shape of an utterance's loudness over its speech.

The Haitsma-Kalker fingerprint (:mod:`.fingerprint_audio`) compares spectra frame by frame, so a copy
played 10 % faster (its frames drift off the grid) or shifted by 2 semitones (its energy moves two
bands) reads as other audio. This signature reads what neither change moves: *when* the utterance
is loud relative to its own length. The loudness in 300-3400 Hz (broadband: a pitch shift moves
harmonics, not how loud the voice is) is taken every 10 ms; the span from the first to the last frame
within 20 dB of the loudest (silence padding and trimmed silence do not count) is smoothed and read
at :data:`ENVELOPE_POINTS` + 1 evenly spread points, so a uniform tempo change, which scales the span,
reads the same points; bit n is whether the loudness rose from point n to n + 1 (a sign of a
difference of log energies: gain never changes a bit). A flat envelope (a steady tone, hum, silence)
has no signature: its bits would be noise, and all such utterances alike.

The envelope alone cannot tell a copy from the same sentence read at the same pace by another voice
(espeak-ng's voices share their timing: 0.98). The *spectral shape* can: the speech span cut into
:data:`SHAPE_SEGMENTS` equal parts, each part's log energy in semitone-wide bands; a pitch shift
moves it by whole bands, a tempo change not at all, while another voice has other formants and
another pitch (measured: copies 0.93-0.99 at their best shift, other voices reading the same
sentence at most 0.80, unrelated synthetic utterances at most 0.70).

Matching (:mod:`.near_dup_matching`): the envelope is hashed by random hyperplanes (SimHash) into
:data:`LSH_BANDS` bands of :data:`LSH_BAND_BITS` bits; each *pair* of bands is a lookup key
(:func:`envelope_band_pair_keys`), so a candidate sharing 3 bands (3 pairs) is found without reading
the chance hits of single bands, which grow with the corpus; it is verified on the envelope's correlation (``min_envelope_correlation``), the spectral shape's
(``min_shape_correlation``) and the durations of the two spans (a tempo change within
``max_tempo_change``). It finds whole-utterance copies that the frame fingerprint cannot; a copy both
trimmed and tempo-shifted changes its span and is not found.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import soxr

ENVELOPE_SAMPLE_RATE = 8_000
ENVELOPE_FRAME_SAMPLES = 256
"""32 ms frames every 10 ms."""
ENVELOPE_HOP_SAMPLES = 80
ENVELOPE_BAND_HZ = (300.0, 3_400.0)
ENVELOPE_POINTS = 64
"""Points read over the speech span (about 13 a second for 5 s of speech: a few per syllable)."""
SMOOTHING = 3.0
"""The envelope is averaged over this many points' distance before it is read: what falls between
points is averaged, not aliased, so a copy read on a slightly shifted grid reads nearly the same."""
ACTIVE_FLOOR_DB = 40.0
"""Frames quieter than this below the loudest are read at that floor: their level is noise, and
would differ between copies."""
SPAN_FLOOR_DB = 20.0
"""The speech span runs from the first to the last 10 ms frame within this of the loudest: quiet
edges (a breath, a fade, a phase vocoder's smear) move with the transform and would shift the span.
Measured on 64 planted tempo and pitch copies: the least envelope correlation 0.66 with a 40 dB
floor, 0.96 with 20 dB (unrelated utterances: at most 0.67 either way)."""
MIN_SPAN_S = 1.0
"""A shorter span of sound has too few syllables for its shape to name it."""
MIN_STRONG_SHARE = 0.3
"""At least this share of the point-to-point steps must exceed :data:`STRONG_STEP_DB`, else the
envelope is flat (a tone, hum) and gets no signature."""
STRONG_STEP_DB = 0.5
LSH_BANDS = 24
LSH_BAND_BITS = 14
"""Random-hyperplane (SimHash) bits, 24 bands of 14: a copy whose envelope correlates 0.96 with the
original's (the least of 64 planted tempo and pitch copies) keeps a band with probability 0.27, so
shares about 6 of 24 (a candidate needs 3: ``near_dup_matching.MIN_SHARED_ENVELOPE_BANDS``); an
unrelated utterance shares one with probability about 0.25 % (measured), two (a pair: what the index
keys, :func:`envelope_band_pair_keys`) with probability about 7.5e-6 (0.12 per 16 000)."""
LSH_BAND_PAIRS = LSH_BANDS * (LSH_BANDS - 1) // 2
"""276 band-pair keys per envelope: an earlier envelope shares k bands exactly when it shares k (k - 1)
/ 2 pairs, so "at least 3 shared pairs" is "at least 3 shared bands"."""
_PAIR_FIRST, _PAIR_SECOND = np.triu_indices(LSH_BANDS, k=1)
SHAPE_SEGMENTS = 12
"""The spectral shape: the speech span cut into this many equal parts (so tempo never moves them) ..."""
SHAPE_BAND_EDGES_HZ = 150.0 * 2 ** (np.arange(53) / 12)
"""... each part's mean log energy in 52 bands a semitone wide (150 Hz to 3.2 kHz): a pitch shift
moves the whole shape by whole bands, which the comparison searches (:data:`MAX_SHAPE_SHIFT_BANDS`)."""
SHAPE_FFT_SAMPLES = 2_048
"""256 ms at 8 kHz: 3.9 Hz bins, fine enough for the lowest semitone bands (9 Hz wide)."""
MAX_SHAPE_SHIFT_BANDS = 3
"""Shifts of the spectral shape searched, in bands (semitones): +-2 semitones and a margin."""
SHAPE_QUANTUM = 0.1
"""Stored log energies (natural log, each part's mean removed) in steps of this, as int8."""
LSH_SEED = 20_261_127
"""Fixed forever: keys in the corpus index are compared with keys computed later."""

_HYPERPLANES = np.random.default_rng(LSH_SEED).standard_normal((LSH_BANDS * LSH_BAND_BITS, ENVELOPE_POINTS))
_BAND_WEIGHTS = np.uint64(1) << np.arange(LSH_BAND_BITS, dtype=np.uint64)


@dataclass(frozen=True)
class ShiftSignature:
    """What stays of an utterance under a tempo or pitch change. ``envelope`` float32
    ``[ENVELOPE_POINTS]``, mean removed and L2-normalized (the dot product of two is their
    correlation), rounded to the float16 the index stores; ``spectral_shape`` int8
    ``[SHAPE_SEGMENTS, 52]`` (:data:`SHAPE_QUANTUM` steps); ``span_s`` the seconds of the speech span."""

    envelope: np.ndarray
    spectral_shape: np.ndarray
    span_s: float


def shift_signature(samples: np.ndarray, sample_rate: int) -> ShiftSignature | None:
    """The signature of mono float ``samples``; None for audio whose span of sound is shorter than
    :data:`MIN_SPAN_S` or whose loudness is flat."""
    audio = np.asarray(samples, np.float32)
    if sample_rate != ENVELOPE_SAMPLE_RATE and len(audio):
        audio = soxr.resample(audio, sample_rate, ENVELOPE_SAMPLE_RATE, quality="HQ").astype(np.float32)
    if len(audio) < ENVELOPE_FRAME_SAMPLES:
        return None
    frames = np.lib.stride_tricks.sliding_window_view(audio, ENVELOPE_FRAME_SAMPLES)[::ENVELOPE_HOP_SAMPLES]
    frequencies = np.fft.rfftfreq(ENVELOPE_FRAME_SAMPLES, 1.0 / ENVELOPE_SAMPLE_RATE)
    in_band = (frequencies >= ENVELOPE_BAND_HZ[0]) & (frequencies <= ENVELOPE_BAND_HZ[1])
    energy = np.empty(len(frames), np.float64)
    window = np.hanning(ENVELOPE_FRAME_SAMPLES).astype(np.float32)
    for start in range(0, len(frames), 4_096):  # bounded working memory for long utterances
        spectrum = np.fft.rfft(frames[start : start + 4_096] * window, axis=1)[:, in_band]
        energy[start : start + 4_096] = (spectrum.real**2 + spectrum.imag**2).sum(axis=1)
    loudest = float(energy.max())
    if loudest <= 0.0:
        return None
    level_db = 10 * np.log10(energy + loudest * 1e-9)
    loud = np.flatnonzero(level_db >= level_db.max() - SPAN_FLOOR_DB)
    first, last = int(loud[0]), int(loud[-1])
    span_s = (last - first) * ENVELOPE_HOP_SAMPLES / ENVELOPE_SAMPLE_RATE
    if span_s < MIN_SPAN_S:
        return None
    span = np.maximum(level_db[first : last + 1], level_db.max() - ACTIVE_FLOOR_DB)
    width = max(1, int(round(SMOOTHING * len(span) / ENVELOPE_POINTS)))
    smoothed = np.convolve(np.pad(span, width, mode="edge"), np.ones(width) / width, mode="same")[width:-width]
    points = np.interp(np.linspace(0, len(smoothed) - 1, ENVELOPE_POINTS), np.arange(len(smoothed)), smoothed)
    if float(np.mean(np.abs(np.diff(points)) > STRONG_STEP_DB)) < MIN_STRONG_SHARE:
        return None
    centered = points - points.mean()
    envelope = (centered / np.linalg.norm(centered)).astype(np.float16).astype(np.float32)
    shape = _spectral_shape(audio, first, last)
    return ShiftSignature(envelope, shape, round(span_s, 3))


_SHAPE_FREQUENCIES = np.fft.rfftfreq(SHAPE_FFT_SAMPLES, 1.0 / ENVELOPE_SAMPLE_RATE)
_SHAPE_BINS = np.searchsorted(_SHAPE_FREQUENCIES, SHAPE_BAND_EDGES_HZ)
_SHAPE_WINDOW = np.hanning(SHAPE_FFT_SAMPLES).astype(np.float32)


def _spectral_shape(audio: np.ndarray, first: int, last: int) -> np.ndarray:
    """int8 ``[SHAPE_SEGMENTS, bands]``: the mean band energies of each part of the span (frames
    ``first`` to ``last`` on the envelope's 10 ms grid), log, each part's mean removed."""
    padded = np.pad(audio, (0, SHAPE_FFT_SAMPLES))
    starts = np.arange(first, last + 1) * ENVELOPE_HOP_SAMPLES
    segment_of = np.minimum((np.arange(len(starts)) * SHAPE_SEGMENTS) // len(starts), SHAPE_SEGMENTS - 1)
    sums = np.zeros((SHAPE_SEGMENTS, len(_SHAPE_BINS) - 1))
    every = np.lib.stride_tricks.sliding_window_view(padded, SHAPE_FFT_SAMPLES)
    for chunk in range(0, len(starts), 1_024):  # 1 024 frames of 2 048 samples at once: 8 MiB
        spectrum = np.fft.rfft(every[starts[chunk : chunk + 1_024]] * _SHAPE_WINDOW, axis=1)
        power = spectrum.real**2 + spectrum.imag**2
        bands = np.add.reduceat(power[:, _SHAPE_BINS[0] : _SHAPE_BINS[-1]], _SHAPE_BINS[:-1] - _SHAPE_BINS[0], axis=1)
        np.add.at(sums, segment_of[chunk : chunk + 1_024], bands)
    logs = np.log(sums + max(float(sums.max()), 1e-12) * 1e-9)
    logs -= logs.mean(axis=1, keepdims=True)
    return np.clip(np.rint(logs / SHAPE_QUANTUM), -127, 127).astype(np.int8)


def shape_correlation(first: np.ndarray, second: np.ndarray) -> float:
    """The best correlation of two spectral shapes over shifts of up to :data:`MAX_SHAPE_SHIFT_BANDS`
    bands (over the bands they share at that shift; each part's mean removed again)."""
    a, b = first.astype(np.float64), second.astype(np.float64)
    bands = a.shape[1]
    best = -1.0
    for shift in range(-MAX_SHAPE_SHIFT_BANDS, MAX_SHAPE_SHIFT_BANDS + 1):
        x = a[:, max(0, shift) : bands + min(0, shift)]
        y = b[:, max(0, -shift) : bands - max(0, shift)]
        x = x - x.mean(axis=1, keepdims=True)
        y = y - y.mean(axis=1, keepdims=True)
        norm = float(np.sqrt((x * x).sum() * (y * y).sum()))
        if norm > 0:
            best = max(best, float((x * y).sum()) / norm)
    return best


def envelope_correlation(first: np.ndarray, second: np.ndarray) -> float:
    """Pearson correlation of two envelopes (1: the same shape)."""
    return float(np.dot(first, second) / max(float(np.linalg.norm(first) * np.linalg.norm(second)), 1e-12))


def envelope_band_keys(envelope: np.ndarray) -> np.ndarray:
    """uint64 ``[LSH_BANDS]``: each band's 14 hyperplane signs as an integer, its band number above them
    (keys of different bands never meet)."""
    signs = (_HYPERPLANES @ envelope.astype(np.float64) > 0).reshape(LSH_BANDS, LSH_BAND_BITS)
    values = signs.astype(np.uint64) @ _BAND_WEIGHTS
    return values | (np.arange(LSH_BANDS, dtype=np.uint64) << np.uint64(LSH_BAND_BITS))


def envelope_band_pair_keys(envelope: np.ndarray) -> np.ndarray:
    """uint64 ``[LSH_BAND_PAIRS]``: one key per pair of bands ``i < j`` (in that order), both band keys
    of :func:`envelope_band_keys` side by side (19 bits each: band number and value), so two envelopes
    share a pair's key exactly when they share both bands."""
    bands = envelope_band_keys(envelope)
    return (bands[_PAIR_FIRST] << np.uint64(LSH_BAND_BITS + 5)) | bands[_PAIR_SECOND]
