"""A planted set for measuring near-duplicate detection: distinct speech-like utterances, copies
of some of them under the transforms corpora really carry, and look-alikes that are not copies.

Utterances are synthetic speech: a harmonic source whose pitch glides around the speaker's own,
shaped by three formants per syllable (vowel-like), with noise-band syllables (fricative-like) and
pauses, in a syllable-rate envelope. A *speaker* fixes the pitch range and the formant scale, so
two utterances of one speaker share a timbre and differ only in what is "said". Everything is
drawn from one seeded generator: the same arguments give the same set.

Planted audio copies (same transcript): ``rewrapped`` (identical samples), ``reencoded`` (MP3 or
Ogg Vorbis and back, or 8-bit and back), ``trimmed`` (0.2 to 1 s cut at the start and at the end),
``gain`` (+-6 dB), ``resampled`` (24 kHz to 16 kHz and back), ``compound`` (all four of trimmed,
gain, re-encoded and resampled, in turn). Planted transcript copies: the same
words (case and punctuation changed) under another utterance of another speaker. Negatives:
another utterance of an original's speaker; an original's first 30-50 % spliced onto new speech
(containment, not a copy); half an original's words followed by others, under new audio.

The *extended* set (``planted_set(extended=True)``) adds copies ``tempo`` (x0.9 or x1.1, pitch
kept), ``pitch`` (-2 or +2 semitones, duration kept), ``padded`` (0.5-2 s of noise at -60 dBFS at
both ends) and ``clip`` (1.5 s or a quarter of the original from its middle: contained in it), and
the negative ``container`` (an original followed by 2-4 s of new speech of its speaker: it holds
the original plus new speech, and must be kept). :func:`planted_readings` adds real voices: the same
sentences read by espeak-ng voices (the committed fixtures ``tests/fixtures/readings``), where
another voice's reading must be kept and the same voice's second reading is a duplicate.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import soxr

from speechdata.quality.near_dup_matching import (
    CONTAINED_AUDIO,
    EXACT_AUDIO,
    NEAR_AUDIO,
    NEAR_TRANSCRIPT,
    SHIFTED_AUDIO,
)

SAMPLE_RATE = 24_000
AUDIO_TRANSFORMS = ("rewrapped", "reencoded", "trimmed", "gain", "resampled", "compound")
COMPOUND_STEPS = ("trimmed", "gain", "reencoded", "resampled")
"""``compound``: every one of these in turn, as a copy that went through several hands."""
TRANSCRIPT_TRANSFORMS = ("same_words_other_audio",)
EXTENDED_AUDIO_TRANSFORMS = ("tempo", "pitch", "padded", "clip")
"""Copies only the extended set plants (tempo and pitch are found by the loudness envelope)."""
READING_TRANSFORMS = ("same_speaker_reading", "tempo_of_reading")
EXPECTED_KIND = {
    "tempo": SHIFTED_AUDIO,
    "pitch": SHIFTED_AUDIO,
    "padded": NEAR_AUDIO,
    "clip": CONTAINED_AUDIO,
    "same_speaker_reading": NEAR_TRANSCRIPT,
    "tempo_of_reading": SHIFTED_AUDIO,
    "rewrapped": EXACT_AUDIO,
    "reencoded": NEAR_AUDIO,
    "trimmed": NEAR_AUDIO,
    "gain": NEAR_AUDIO,
    "resampled": NEAR_AUDIO,
    "compound": NEAR_AUDIO,
    "same_words_other_audio": NEAR_TRANSCRIPT,
}

_VOWEL_FORMANTS_HZ = [
    (730, 1090, 2440),
    (270, 2290, 3010),
    (300, 870, 2240),
    (530, 1840, 2480),
    (570, 840, 2410),
    (440, 1020, 2240),
    (660, 1720, 2410),
    (490, 1350, 1690),
]
_VOCABULARY = (
    "the of and to in is that it was for on are as with his they at be this from have or by one had not "
    "but what all were when we there can an your which their said if do will each about how up out them "
    "then she many some so these would other into has more her two like him see time could no make than "
    "first been its who now people my made over did down only way find use may water long little very "
    "after words called just where most know get through back much before go good new write our used me "
    "man too any day same right look think also around another came come work three word must because "
    "does part even place well such here take why things help put years different away again off went old"
)
_WORDS = _VOCABULARY.split()


@dataclass(frozen=True)
class Speaker:
    pitch_hz: float
    formant_scale: float


@dataclass(frozen=True)
class PlantedUtterance:
    """One utterance of the planted set. ``copy_of``: the utterance it was made from (None for an
    original or a negative); ``transform`` names how."""

    utt_id: str
    samples: np.ndarray
    text: str
    copy_of: str | None = None
    transform: str | None = None
    negative: str | None = None
    """For a look-alike that is no copy: how it resembles its original (:data:`NEGATIVE_KINDS`)."""

    @property
    def expected_kind(self) -> str | None:
        return EXPECTED_KIND.get(self.transform) if self.transform else None


def speech_like(rng: np.random.Generator, speaker: Speaker, seconds: float) -> np.ndarray:
    """``seconds`` of synthetic speech at 24 kHz by ``speaker``, peak about -3 dBFS."""
    pieces = [np.zeros(int(rng.uniform(0.05, 0.2) * SAMPLE_RATE), np.float32)]
    total = len(pieces[0])
    while total < seconds * SAMPLE_RATE:
        kind = rng.choice(["vowel", "vowel", "vowel", "fricative", "pause"])
        length = int(rng.uniform(0.08, 0.3) * SAMPLE_RATE)
        if kind == "vowel":
            piece = _voiced(rng, speaker, length)
        elif kind == "fricative":
            piece = _fricative(rng, length)
        else:
            piece = np.zeros(length, np.float32)
        pieces.append(piece)
        total += length
    audio = np.concatenate(pieces)[: int(seconds * SAMPLE_RATE)]
    return (0.7 * audio / max(float(np.abs(audio).max()), 1e-9)).astype(np.float32)


def _voiced(rng: np.random.Generator, speaker: Speaker, length: int) -> np.ndarray:
    t = np.arange(length) / SAMPLE_RATE
    start, end = speaker.pitch_hz * rng.uniform(0.8, 1.25, size=2)
    pitch = np.linspace(start, end, length) * (1 + 0.03 * np.sin(2 * np.pi * rng.uniform(3, 6) * t))
    phase = 2 * np.pi * np.cumsum(pitch) / SAMPLE_RATE
    formants = np.array(_VOWEL_FORMANTS_HZ[rng.integers(len(_VOWEL_FORMANTS_HZ))]) * speaker.formant_scale
    mean_pitch = float(pitch.mean())
    audio = np.zeros(length)
    for harmonic in range(1, int(4_000 / mean_pitch)):
        frequency = harmonic * mean_pitch
        gain = sum(1.0 / (1.0 + ((frequency - f) / (60 + 0.06 * f)) ** 2) for f in formants) / harmonic**0.5
        audio += gain * np.sin(harmonic * phase)
    return (audio * np.sin(np.pi * np.arange(length) / length) ** 0.6).astype(np.float32)


def _fricative(rng: np.random.Generator, length: int) -> np.ndarray:
    spectrum = np.fft.rfft(rng.standard_normal(length))
    frequencies = np.fft.rfftfreq(length, 1 / SAMPLE_RATE)
    low = rng.uniform(2_000, 4_000)
    spectrum[(frequencies < low) | (frequencies > low + 3_000)] = 0
    noise = np.fft.irfft(spectrum, length)
    return (0.3 * noise / max(float(np.abs(noise).max()), 1e-9) * np.hanning(length)).astype(np.float32)


def sentence(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(_WORDS, size=int(rng.integers(6, 15)))).capitalize() + "."


def transformed(rng: np.random.Generator, samples: np.ndarray, transform: str) -> np.ndarray:
    """``samples`` as a corpus would carry a copy of them after ``transform``."""
    if transform == "rewrapped":
        return samples.copy()
    if transform == "reencoded":
        return _reencoded(rng, samples)
    if transform == "trimmed":
        start, end = (int(rng.uniform(0.2, 1.0) * SAMPLE_RATE) for _ in range(2))
        return samples[start : len(samples) - end].copy()
    if transform == "gain":
        return np.clip(samples * 10 ** (rng.choice([-6.0, 6.0]) / 20), -1, 1).astype(np.float32)
    if transform == "compound":
        for step in COMPOUND_STEPS:
            samples = transformed(rng, samples, step)
        return samples
    if transform in ("tempo", "pitch"):
        import librosa  # only the extended planted set needs it (about 1 s to import)

        if transform == "tempo":
            return librosa.effects.time_stretch(samples, rate=float(rng.choice([0.9, 1.1]))).astype(np.float32)
        steps = float(rng.choice([-2.0, 2.0]))
        return librosa.effects.pitch_shift(samples, sr=SAMPLE_RATE, n_steps=steps).astype(np.float32)
    if transform == "padded":
        pads = [rng.standard_normal(int(rng.uniform(0.5, 2.0) * SAMPLE_RATE)) * 10 ** (-60 / 20) for _ in range(2)]
        return np.concatenate([pads[0], samples, pads[1]]).astype(np.float32)
    if transform == "clip":
        length = min(len(samples), max(int(1.5 * SAMPLE_RATE), len(samples) // 4))
        start = int(rng.integers(0, len(samples) - length + 1))
        return samples[start : start + length].copy()
    if transform == "resampled":
        narrow = soxr.resample(samples, SAMPLE_RATE, 16_000)
        return soxr.resample(narrow, 16_000, SAMPLE_RATE).astype(np.float32)
    raise ValueError(f"unknown planted transform {transform!r}; use one of {AUDIO_TRANSFORMS}")


def _reencoded(rng: np.random.Generator, samples: np.ndarray) -> np.ndarray:
    container = ["MP3", "OGG", "8-bit"][int(rng.integers(3))]
    if container == "8-bit":
        return (np.round(samples * 127) / 127).astype(np.float32)
    subtype = "MPEG_LAYER_III" if container == "MP3" else "VORBIS"
    buffer = io.BytesIO()
    sf.write(buffer, samples, SAMPLE_RATE, format=container, subtype=subtype)
    buffer.seek(0)
    decoded, rate = sf.read(buffer, dtype="float32")
    decoded = decoded if rate == SAMPLE_RATE else soxr.resample(decoded, rate, SAMPLE_RATE)
    return decoded.astype(np.float32)


def planted_set(
    originals: int = 40, *, seed: int = 0, speakers: int = 6, extended: bool = False
) -> list[PlantedUtterance]:
    """``originals`` distinct utterances (3 to 7 s, ``speakers`` speakers), then for each original in
    turn one planted copy (the transforms in rotation, the transcript transform every seventh), and as
    many look-alikes that are no copies (:data:`NEGATIVE_KINDS` in rotation). ``extended``: the
    rotations also hold :data:`EXTENDED_AUDIO_TRANSFORMS` and the ``container`` negative."""
    rng = np.random.default_rng(seed)
    voices = [Speaker(float(rng.uniform(90, 230)), float(rng.uniform(0.85, 1.2))) for _ in range(speakers)]
    made: list[PlantedUtterance] = []
    for number in range(originals):
        made.append(
            PlantedUtterance(
                f"orig-{number:04d}",
                speech_like(rng, voices[number % speakers], rng.uniform(3.0, 7.0)),
                sentence(rng),
            )
        )
    transforms = AUDIO_TRANSFORMS + (EXTENDED_AUDIO_TRANSFORMS if extended else ()) + TRANSCRIPT_TRANSFORMS
    negatives = NEGATIVE_KINDS + (("container",) if extended else ())
    for number in range(originals):
        original = made[number]
        transform = transforms[number % len(transforms)]
        if transform == "same_words_other_audio":
            other_speaker = voices[(number + 1) % speakers]
            samples = speech_like(rng, other_speaker, rng.uniform(3.0, 7.0))
            text = original.text.upper().replace(".", "!")
        else:
            samples, text = transformed(rng, original.samples, transform), original.text
        made.append(PlantedUtterance(f"copy-{number:04d}", samples, text, original.utt_id, transform))
        made.append(_negative(rng, original, voices[number % speakers], negatives[number % len(negatives)], number))
    return made


NEGATIVE_KINDS = ("same_speaker", "spliced", "shared_words")


def _negative(
    rng: np.random.Generator, original: PlantedUtterance, speaker: Speaker, kind: str, number: int
) -> PlantedUtterance:
    """Not a copy of ``original``, but close: another utterance of its speaker (``same_speaker``),
    its first 30-50 % followed by new speech of its speaker (``spliced``), half its words followed by
    others, under new audio (``shared_words``), or all of it followed by 2-4 s of new speech of its
    speaker, with its words and more (``container``)."""
    samples = speech_like(rng, speaker, rng.uniform(3.0, 7.0))
    text = sentence(rng)
    if kind == "container":
        samples = np.concatenate([original.samples, samples[: int(rng.uniform(2.0, 4.0) * SAMPLE_RATE)]])
        text = original.text.rstrip(".") + " " + text.lower()
    elif kind == "spliced":
        kept = original.samples[: int(len(original.samples) * rng.uniform(0.3, 0.5))]
        samples = np.concatenate([kept, samples[: max(len(original.samples) - len(kept), 0)]])
    elif kind == "shared_words":
        words = original.text.rstrip(".").split()
        text = " ".join(words[: len(words) // 2] + sentence(rng).rstrip(".").lower().split()) + "."
    return PlantedUtterance(f"negative-{number:04d}", samples, text, transform=None, negative=kind)


def planted_readings(directory) -> list[PlantedUtterance]:
    """The same sentences read by several voices, from the fixtures in ``directory`` (``readings.json``
    and its FLAC files, made by ``tests/fixtures/readings/generate.py``), at 24 kHz, in ``utt_id``
    order per sentence: the ``male`` reading first (``read-<s>-0``); ``female`` and ``female2``
    (another speaker's readings: negatives ``other_speaker_reading``, to be kept); ``male_slow`` (the
    same voice again: a ``same_speaker_reading`` copy of the first); and the female reading at x1.1
    tempo (a ``tempo_of_reading`` copy of the female reading)."""
    import json
    from pathlib import Path

    import librosa

    folder = Path(directory)
    by_sentence: dict[str, dict[str, tuple[np.ndarray, str]]] = {}
    for row in json.loads((folder / "readings.json").read_text()):
        samples, rate = sf.read(folder / row["file"], dtype="float32")
        samples = soxr.resample(samples, rate, SAMPLE_RATE).astype(np.float32)
        by_sentence.setdefault(row["sentence"], {})[row["reading"]] = (samples, row["text"])
    made = []
    for name, readings in sorted(by_sentence.items()):
        male, female = f"read-{name}-0-male", f"read-{name}-1-female"
        made += [
            PlantedUtterance(male, *readings["male"]),
            PlantedUtterance(female, *readings["female"], negative="other_speaker_reading"),
            PlantedUtterance(f"read-{name}-2-female2", *readings["female2"], negative="other_speaker_reading"),
            PlantedUtterance(f"read-{name}-3-male-again", *readings["male_slow"], male, "same_speaker_reading"),
            PlantedUtterance(
                f"read-{name}-4-female-faster",
                librosa.effects.time_stretch(readings["female"][0], rate=1.1).astype(np.float32),
                readings["female"][1],
                female,
                "tempo_of_reading",
            ),
        ]
    return made


@dataclass(frozen=True)
class PlantedScore:
    true_positives: int
    false_positives: int
    false_negatives: int
    outcome: dict[str, str]
    """``{utt_id of a counted copy: "found" | "missed" | "wrong representative"}``."""

    @property
    def precision(self) -> float:
        flagged = self.true_positives + self.false_positives
        return self.true_positives / flagged if flagged else 1.0

    @property
    def recall(self) -> float:
        planted = self.true_positives + self.false_negatives
        return self.true_positives / planted if planted else 1.0


def score(
    planted: list[PlantedUtterance], flagged: dict[str, tuple[str, str]], transforms: tuple[str, ...] = ()
) -> PlantedScore:
    """Score ``flagged`` (``{utt_id: (kind, representative utt_id)}``) against the planted truth.

    A planted copy of one of ``transforms`` (default: every transform) counts as found when flagged
    with its original as representative, whatever the signal; a copy of another transform is left
    out of the score. Any other flag (a negative or an original flagged, a wrong representative) is
    a false positive.
    """
    counted = transforms or AUDIO_TRANSFORMS + EXTENDED_AUDIO_TRANSFORMS + TRANSCRIPT_TRANSFORMS + READING_TRANSFORMS
    true_positives = false_positives = 0
    outcome = {}
    for utterance in planted:
        verdict = flagged.get(utterance.utt_id)
        if utterance.copy_of is None:
            false_positives += verdict is not None
        elif utterance.transform in counted:
            if verdict is None:
                outcome[utterance.utt_id] = "missed"
            elif verdict[1] == utterance.copy_of:
                outcome[utterance.utt_id] = "found"
                true_positives += 1
            else:
                outcome[utterance.utt_id] = "wrong representative"
                false_positives += 1
    false_negatives = sum(1 for value in outcome.values() if value != "found")
    return PlantedScore(true_positives, false_positives, false_negatives, outcome)
