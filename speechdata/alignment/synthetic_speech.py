"""Synthesized speech with known text and known word boundaries, for the ``small`` aligner.

Speech comes from Debian's ``espeak-ng`` binary (a formant synthesizer: many languages, voice
variants, speeds and pitches, fully offline and deterministic). It is used only by the committed
scripts that build the small model and its fixtures (:mod:`speechdata.alignment.train_small`,
``benchmarks/bench_alignment_accuracy.py``); tests and the demo read what those scripts wrote,
so nothing at run time needs ``espeak-ng``.

Text comes from :mod:`speechdata.alignment.synthetic_text` (word lists, numbers written as
words). Word boundaries are known by construction in :func:`synthesize_words`: each word is
synthesized on its own, its leading and trailing silence trimmed (frames of 10 ms below
:data:`TRIM_THRESHOLD_DB` under the word's loudest frame), and the words joined with gaps of known
length. Evaluation uses sentences from another seed and voice variants the training never hears
(:data:`HELD_OUT_VARIANTS`).

Augmentation: white or pink noise at 10-30 dB SNR and a synthetic room (an exponentially decaying
noise impulse response, RT60 0.15-0.6 s).
"""

from __future__ import annotations

import io
import subprocess
from dataclasses import dataclass

import numpy as np

from speechdata.alignment.synthetic_text import sentence

SAMPLE_RATE = 16_000
TRIM_THRESHOLD_DB = -35.0
"""A 10 ms frame counts as speech when its RMS level is at most this far below the word's loudest frame."""
TRIM_FRAME_S = 0.01


ENGLISH_ACCENTS = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en-029", "en-gb-x-gbclan")
GERMAN_ACCENTS = ("de",)
TRAIN_VARIANTS = ("", "m1", "m2", "m3", "m4", "m5", "m6", "f1", "f2", "f3", "f5", "klatt", "klatt3", "adam", "linda")
HELD_OUT_VARIANTS = ("f4", "m7", "steph")
"""Voice variants no training utterance uses: the held-out speakers of the accuracy benchmark."""
SPEEDS = (130, 200)
"""espeak-ng ``-s`` words per minute, drawn uniformly."""
PITCHES = (25, 75)


@dataclass(frozen=True)
class Voice:
    language: str
    """ISO 639-1: ``en`` or ``de``."""
    espeak_voice: str
    """``accent+variant`` as ``espeak-ng -v`` takes it."""
    speed: int
    pitch: int


@dataclass(frozen=True)
class SynthesizedUtterance:
    text: str
    audio: np.ndarray
    """16 kHz mono float32."""
    word_spans_s: list[tuple[float, float]] | None
    """Each word's (start, end) in seconds when known by construction, else None."""


def pick_voice(rng: np.random.Generator, language: str, variants: tuple[str, ...] = TRAIN_VARIANTS) -> Voice:
    accents = ENGLISH_ACCENTS if language == "en" else GERMAN_ACCENTS
    accent = accents[int(rng.integers(0, len(accents)))]
    variant = variants[int(rng.integers(0, len(variants)))]
    return Voice(
        language,
        f"{accent}+{variant}" if variant else accent,
        int(rng.integers(SPEEDS[0], SPEEDS[1] + 1)),
        int(rng.integers(PITCHES[0], PITCHES[1] + 1)),
    )


def espeak(text: str, voice: Voice) -> np.ndarray:
    """``text`` spoken by ``espeak-ng`` as 16 kHz mono float32."""
    import soundfile as sf
    import soxr

    wav = subprocess.run(
        ["espeak-ng", "-v", voice.espeak_voice, "-s", str(voice.speed), "-p", str(voice.pitch), "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
    if audio.ndim > 1:
        audio = audio.mean(axis=1)
    return soxr.resample(audio, rate, SAMPLE_RATE).astype(np.float32)


def speech_bounds(audio: np.ndarray, threshold_db: float = TRIM_THRESHOLD_DB) -> tuple[int, int]:
    """First and last sample (exclusive) of the 10 ms frames within ``threshold_db`` of the loudest."""
    size = int(TRIM_FRAME_S * SAMPLE_RATE)
    frames = len(audio) // size
    if frames == 0:
        return 0, len(audio)
    rms = np.sqrt(np.mean(audio[: frames * size].reshape(frames, size) ** 2, axis=1) + 1e-12)
    level = 20 * np.log10(rms / rms.max())
    loud = np.flatnonzero(level >= threshold_db)
    return int(loud[0]) * size, (int(loud[-1]) + 1) * size


def synthesize_sentence(text: str, voice: Voice) -> SynthesizedUtterance:
    audio = espeak(text, voice)
    start, end = speech_bounds(audio)
    return SynthesizedUtterance(text, audio[start:end], None)


def synthesize_words(
    words: list[str], voice: Voice, rng: np.random.Generator, gap_s: tuple[float, float] = (0.03, 0.3)
) -> SynthesizedUtterance:
    """Each word synthesized alone, trimmed, and joined with random gaps: boundaries known exactly."""
    pieces: list[np.ndarray] = []
    spans: list[tuple[float, float]] = []
    position = 0
    for index, word in enumerate(words):
        if index:
            gap = np.zeros(int(rng.uniform(*gap_s) * SAMPLE_RATE), dtype=np.float32)
            pieces.append(gap)
            position += len(gap)
        audio = espeak(word, voice)
        start, end = speech_bounds(audio)
        pieces.append(audio[start:end])
        spans.append((position / SAMPLE_RATE, (position + end - start) / SAMPLE_RATE))
        position += end - start
    return SynthesizedUtterance(" ".join(words), np.concatenate(pieces), spans)


def pad_silence(utterance: SynthesizedUtterance, rng: np.random.Generator, pad_s=(0.05, 0.5)) -> SynthesizedUtterance:
    lead = int(rng.uniform(*pad_s) * SAMPLE_RATE)
    tail = int(rng.uniform(*pad_s) * SAMPLE_RATE)
    audio = np.concatenate([np.zeros(lead, np.float32), utterance.audio, np.zeros(tail, np.float32)])
    spans = None
    if utterance.word_spans_s is not None:
        spans = [(s + lead / SAMPLE_RATE, e + lead / SAMPLE_RATE) for s, e in utterance.word_spans_s]
    return SynthesizedUtterance(utterance.text, audio, spans)


def pink_noise(rng: np.random.Generator, length: int) -> np.ndarray:
    spectrum = np.fft.rfft(rng.standard_normal(length))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1))
    return np.fft.irfft(spectrum, n=length)


def add_noise(audio: np.ndarray, rng: np.random.Generator, snr_db: float, pink: bool) -> np.ndarray:
    noise = pink_noise(rng, len(audio)) if pink else rng.standard_normal(len(audio))
    speech_power = float(np.mean(audio**2)) + 1e-12
    noise *= np.sqrt(speech_power / (float(np.mean(noise**2)) + 1e-12) / 10 ** (snr_db / 10))
    return (audio + noise).astype(np.float32)


def reverberate(audio: np.ndarray, rng: np.random.Generator, rt60_s: float) -> np.ndarray:
    """Convolve with exponentially decaying noise (a synthetic room), direct path first, level kept."""
    length = int(rt60_s * SAMPLE_RATE)
    decay = np.exp(-6.9 * np.arange(length) / length)  # -60 dB at rt60
    rir = rng.standard_normal(length) * decay * 0.3
    rir[0] = 1.0
    wet = np.convolve(audio, rir)[: len(audio)]
    return (wet * (np.abs(audio).max() / (np.abs(wet).max() + 1e-9))).astype(np.float32)


def augment(audio: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Clean (30 %), noisy (40 %) or reverberant and possibly noisy (30 %)."""
    choice = rng.random()
    if choice < 0.3:
        return audio
    if choice >= 0.7:
        audio = reverberate(audio, rng, float(rng.uniform(0.15, 0.6)))
        if rng.random() < 0.5:
            return audio
    return add_noise(audio, rng, float(rng.uniform(10, 30)), pink=bool(rng.random() < 0.5))


def training_utterance(index: int, seed: int, german_share: float = 0.3) -> SynthesizedUtterance:
    """The ``index``-th training utterance: its own seeded generator, so any subset is reproducible."""
    rng = np.random.default_rng([seed, index])
    language = "de" if rng.random() < german_share else "en"
    voice = pick_voice(rng, language)
    text = sentence(rng, language)
    # A quarter are words spoken one by one with gaps, as the accuracy benchmark's held-out set is.
    separate_words = rng.random() < 0.25
    utterance = synthesize_words(text.split(), voice, rng) if separate_words else synthesize_sentence(text, voice)
    utterance = pad_silence(utterance, rng)
    return SynthesizedUtterance(utterance.text, augment(utterance.audio, rng), utterance.word_spans_s)
