"""Transcript signals that need no model: speaking rate against the audio, and repetition.

Speaking rate is the transcript's letters (and words) over the seconds of speech: audio cut short
under a whole transcript, or a transcript with an extra sentence, reads far faster than anyone
speaks; a transcript missing half its words reads far slower. Repetition catches what ASR models
hallucinate: the same words looped, one character held, or a stock phrase from subtitled video.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from speechdata.quality.text_language import primary_language


@dataclass(frozen=True)
class RateBounds:
    """Plausible speaking rates of read or conversational speech, per second of speech."""

    min_chars_per_s: float
    max_chars_per_s: float
    min_words_per_s: float
    max_words_per_s: float


SPEAKING_RATE_BOUNDS: dict[str, RateBounds] = {
    "en": RateBounds(6.0, 22.0, 1.0, 5.5),
    "de": RateBounds(6.0, 24.0, 0.8, 5.0),
    "fr": RateBounds(6.0, 24.0, 1.0, 6.0),
    "es": RateBounds(6.0, 24.0, 1.0, 6.0),
    "it": RateBounds(6.0, 24.0, 1.0, 6.0),
    "pt": RateBounds(6.0, 24.0, 1.0, 6.0),
    "nl": RateBounds(6.0, 24.0, 0.8, 5.5),
}
"""Per landed language (primary subtag): letters and words per second of speech that a fast or slow
speaker stays within. Letters, not characters: spaces and punctuation are not spoken. German's
long compounds make fewer, longer words; French and Spanish are spoken with more syllables per
second than English (docs/quality.md has the table and where it comes from)."""

DEFAULT_RATE_BOUNDS = RateBounds(4.0, 26.0, 0.6, 6.5)
"""Any other language: wider, since the table has no measurement for it. Languages written
without spaces (zh, ja, th) have no words-per-second bounds (their "words" are whole phrases)."""

UNSPACED_LANGUAGES = frozenset({"zh", "ja", "th", "lo", "km", "my", "bo"})


def rate_bounds(language: str | None) -> RateBounds:
    return SPEAKING_RATE_BOUNDS.get(primary_language(language) or "", DEFAULT_RATE_BOUNDS)


def letters(text: str) -> int:
    return sum(1 for c in text if unicodedata.category(c).startswith("L"))


def words(text: str) -> list[str]:
    """Lower-cased runs of letters, digits and apostrophes: what a reader says as words."""
    return re.findall(r"[^\W_]+(?:['’][^\W_]+)*", text.lower())


def speaking_rate(text: str, speech_s: float) -> tuple[float | None, float | None]:
    """``(letters per second, words per second)`` over ``speech_s`` seconds of speech; None for
    no text or no speech."""
    if not text or speech_s <= 0:
        return None, None
    return letters(text) / speech_s, len(words(text)) / speech_s


REPETITION_NGRAM = 3
MIN_NGRAMS_JUDGED = 4
"""Transcripts with fewer word trigrams (under six words) get no repetition ratio: too short to tell."""


def ngram_repetition(text: str, n: int = REPETITION_NGRAM) -> float | None:
    """Share (0-1) of the word n-grams that repeat an earlier one: 0 for ordinary sentences,
    near 1 for one phrase looped. None for transcripts too short to judge."""
    tokens = words(text)
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    if len(grams) < MIN_NGRAMS_JUDGED:
        return None
    return 1.0 - len(set(grams)) / len(grams)


def most_repeated_ngram(text: str, n: int = REPETITION_NGRAM) -> int:
    """How many times the most frequent word n-gram occurs (0 for fewer than ``n`` words)."""
    tokens = words(text)
    counts: dict[tuple[str, ...], int] = {}
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        counts[gram] = counts.get(gram, 0) + 1
    return max(counts.values(), default=0)


def longest_character_run(text: str) -> int:
    """The longest run of one character repeated (letters and digits; ``"aaaaaa"`` is 6)."""
    longest, run, previous = 0, 0, None
    for c in text.lower():
        if not c.isalnum():
            previous, run = None, 0
            continue
        run = run + 1 if c == previous else 1
        previous = c
        longest = max(longest, run)
    return longest


HALLUCINATION_PHRASES = (
    "thanks for watching",
    "thank you for watching",
    "please subscribe",
    "subscribe to my channel",
    "like and subscribe",
    "subtitles by",
    "subtitled by",
    "amara.org",
    "transcribed by",
    "www.",
    "untertitel im auftrag",
    "untertitel der amara",
    "sous-titres réalisés par",
    "sous-titrage",
    "subtítulos realizados por",
    "gracias por ver",
)
"""Stock lines that speech recognizers trained on subtitled video emit over silence or music (the
lists NeMo Curator and Granary filter on share these); matched in the lower-cased transcript."""


def hallucination_phrase(text: str) -> str | None:
    """The first stock phrase of :data:`HALLUCINATION_PHRASES` the transcript contains, else None."""
    lowered = " ".join(text.lower().split())
    return next((p for p in HALLUCINATION_PHRASES if p in lowered), None)
