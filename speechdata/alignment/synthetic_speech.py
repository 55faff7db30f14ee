"""Synthesized speech with known text and known word boundaries, for the ``small`` aligner.

Speech comes from Debian's ``espeak-ng`` binary (a formant synthesizer: many languages, voice
variants, speeds and pitches, fully offline and deterministic). It is used only by the committed
scripts that build the small model and its fixtures (:mod:`speechdata.alignment.train_small`,
``benchmarks/bench_alignment_accuracy.py``); tests and the demo read what those scripts wrote,
so nothing at run time needs ``espeak-ng``.

Text is built deterministically from the word lists below and numbers written as words
(``num2words``). Word boundaries are known by construction in :func:`synthesize_words`: each
word is synthesized on its own, its leading and trailing silence trimmed (frames of 10 ms below
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

SAMPLE_RATE = 16_000
TRIM_THRESHOLD_DB = -35.0
"""A 10 ms frame counts as speech when its RMS level is at most this far below the word's loudest frame."""
TRIM_FRAME_S = 0.01

EN_WORDS = ["the", "a", "an", "and", "or", "but", "if", "then", "so", "because", "when", "while", "after", "before", "under", "over", "into", "out", "of", "on", "in", "at", "by", "for", "with", "from", "about", "near", "far", "above", "below", "between", "through", "during", "without", "again", "once", "here", "there", "where", "why", "how", "all", "any", "both", "each", "few", "more", "most", "other", "some", "such", "no", "not", "only", "own", "same", "than", "too", "very", "can", "will", "just", "should", "now", "i", "you", "he", "she", "it", "we", "they", "me", "him", "her", "us", "them", "my", "your", "his", "its", "our", "their", "this", "that", "these", "those", "am", "is", "are", "was", "were", "be", "been", "being", "have", "has", "had", "do", "does", "did", "say", "said", "go", "went", "gone", "get", "got", "make", "made", "know", "knew", "think", "thought", "take", "took", "see", "saw", "come", "came", "want", "look", "use", "find", "give", "tell", "work", "call", "try", "ask", "need", "feel", "become", "leave", "put", "mean", "keep", "let", "begin", "seem", "help", "talk", "turn", "start", "show", "hear", "play", "run", "move", "like", "live", "believe", "hold", "bring", "happen", "write", "provide", "sit", "stand", "lose", "pay", "meet", "include", "continue", "set", "learn", "change", "lead", "understand", "watch", "follow", "stop", "create", "speak", "read", "allow", "add", "spend", "grow", "open", "walk", "win", "offer", "remember", "love", "consider", "appear", "buy", "wait", "serve", "die", "send", "expect", "build", "stay", "fall", "cut", "reach", "kill", "remain", "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child", "world", "school", "state", "family", "student", "group", "country", "problem", "hand", "part", "place", "case", "week", "company", "system", "program", "question", "government", "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story", "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business", "issue", "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game", "line", "end", "member", "law", "car", "city", "community", "name", "president", "team", "minute", "idea", "kid", "body", "information", "back", "parent", "face", "others", "level", "office", "door", "health", "person", "art", "war", "history", "party", "result", "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force", "education", "foot", "boy", "age", "policy", "music", "market", "sense", "nation", "plan", "college", "interest", "death", "experience", "effect", "class", "control", "field", "development", "role", "effort", "rate", "heart", "drug", "show", "leader", "light", "voice", "wife", "police", "mind", "price", "report", "decision", "son", "view", "relationship", "town", "road", "arm", "difference", "value", "building", "action", "model", "season", "society", "tax", "director", "position", "player", "record", "paper", "space", "ground", "form", "event", "official", "matter", "center", "couple", "site", "project", "activity", "star", "table", "need", "court", "oil", "situation", "cost", "industry", "figure", "street", "image", "phone", "data", "picture", "practice", "piece", "land", "product", "doctor", "wall", "patient", "worker", "news", "test", "movie", "north", "love", "support", "technology", "step", "baby", "computer", "type", "attention", "film", "tree", "source", "organization", "hair", "window", "evidence", "population", "truth", "song", "summer", "river", "garden", "kitchen", "winter", "good", "new", "first", "last", "long", "great", "little", "own", "other", "old", "right", "big", "high", "different", "small", "large", "next", "early", "young", "important", "few", "public", "bad", "same", "able", "late", "hard", "major", "better", "economic", "strong", "possible", "whole", "free", "military", "true", "federal", "international", "full", "special", "easy", "clear", "recent", "certain", "personal", "open", "red", "difficult", "available", "likely", "short", "single", "medical", "current", "wrong", "private", "past", "foreign", "fine", "common", "poor", "natural", "significant", "similar", "hot", "dead", "central", "happy", "serious", "ready", "simple", "left", "physical", "general", "environmental", "financial", "blue", "democratic", "dark", "various", "entire", "close", "legal", "religious", "cold", "final", "main", "green", "nice", "huge", "popular", "traditional", "cultural", "quick", "brown", "lazy", "quiet", "bright", "warm", "yellow", "sweet", "weather", "station", "message", "camera", "garden", "silver", "morning", "evening", "yesterday", "tomorrow", "always", "never", "often", "sometimes", "quickly", "slowly", "together", "everyone", "nothing", "something", "anything", "everything", "maybe", "perhaps", "coffee", "train", "apple", "orange", "bread", "butter", "cheese", "chicken", "sugar", "salt", "window", "pencil", "letter", "bottle"]
DE_WORDS = ["der", "die", "das", "ein", "eine", "und", "oder", "aber", "wenn", "dann", "weil", "als", "nach", "vor", "unter", "über", "in", "an", "auf", "aus", "bei", "mit", "von", "zu", "für", "ohne", "gegen", "durch", "um", "hier", "dort", "wo", "warum", "wie", "alle", "jeder", "mehr", "viel", "wenig", "nicht", "nur", "auch", "sehr", "schon", "noch", "immer", "nie", "oft", "heute", "morgen", "gestern", "jetzt", "bald", "ich", "du", "er", "sie", "es", "wir", "ihr", "mein", "dein", "sein", "unser", "euer", "dieser", "jener", "bin", "bist", "ist", "sind", "war", "waren", "sein", "haben", "hat", "hatte", "werden", "wird", "wurde", "kann", "muss", "soll", "will", "darf", "mag", "machen", "sagen", "gehen", "kommen", "sehen", "wissen", "denken", "nehmen", "geben", "finden", "bleiben", "liegen", "stehen", "lesen", "schreiben", "sprechen", "hören", "spielen", "arbeiten", "wohnen", "lernen", "kaufen", "essen", "trinken", "schlafen", "fahren", "laufen", "helfen", "fragen", "antworten", "zeigen", "bringen", "tragen", "öffnen", "schließen", "beginnen", "Zeit", "Jahr", "Tag", "Mann", "Frau", "Kind", "Welt", "Schule", "Familie", "Land", "Stadt", "Haus", "Straße", "Wasser", "Geld", "Buch", "Auge", "Hand", "Kopf", "Tür", "Fenster", "Tisch", "Stuhl", "Auto", "Zug", "Bahnhof", "Arbeit", "Freund", "Vater", "Mutter", "Bruder", "Schwester", "Woche", "Monat", "Stunde", "Minute", "Morgen", "Abend", "Nacht", "Sommer", "Winter", "Frühling", "Herbst", "Wetter", "Sonne", "Regen", "Schnee", "Wind", "Baum", "Blume", "Garten", "Küche", "Zimmer", "Brot", "Käse", "Milch", "Kaffee", "Tee", "Apfel", "Zucker", "Salz", "Musik", "Sprache", "Frage", "Antwort", "Wort", "Satz", "Bild", "Brief", "Nachricht", "Geschichte", "Anfang", "Ende", "Weg", "Reise", "Katze", "Hund", "Vogel", "Fisch", "Pferd", "Berg", "Fluss", "Meer", "See", "Wald", "Feld", "Dorf", "Kirche", "Brücke", "Markt", "Laden", "Preis", "Farbe", "gut", "neu", "erste", "letzte", "lang", "groß", "klein", "alt", "jung", "hoch", "schön", "schnell", "langsam", "warm", "kalt", "hell", "dunkel", "rot", "blau", "grün", "gelb", "weiß", "schwarz", "laut", "leise", "früh", "spät", "leicht", "schwer", "richtig", "falsch", "froh", "müde", "ruhig", "fröhlich", "wichtig", "einfach", "möglich", "sicher", "klar", "ganz", "halb", "voll", "leer", "süß", "sauer", "heiß"]
WORDS = {"en": EN_WORDS, "de": DE_WORDS}

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


def number_words(value: int, language: str) -> str:
    from num2words import num2words

    return num2words(value, lang=language).replace("-", " ").replace(",", " ")


def sentence(rng: np.random.Generator, language: str, min_words: int = 3, max_words: int = 12) -> str:
    """A deterministic pseudo-sentence: random words of ``language``, sometimes a number in words."""
    words = WORDS[language]
    count = int(rng.integers(min_words, max_words + 1))
    picked = [words[int(i)] for i in rng.integers(0, len(words), size=count)]
    if rng.random() < 0.3:
        picked.insert(int(rng.integers(0, count + 1)), number_words(int(rng.integers(0, 2100)), language))
    return " ".join(" ".join(picked).split())


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
