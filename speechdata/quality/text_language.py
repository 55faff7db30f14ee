"""Text language ID with the model inside its wheel (py3langid: no download, same in every profile)."""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True)
class TextLanguage:
    """What the text LID says about one transcript."""

    language: str | None
    """ISO 639-1 code (py3langid's labels), None for a transcript with no letters."""
    confidence: float
    """Normalized probability of ``language`` among the model's 200 languages (0 when None)."""
    letters: int
    """Letters in the transcript: short texts are where text LID errs, and the policy can require a minimum."""


@functools.cache
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify_text_language(text: str | None) -> TextLanguage:
    """The most probable language of ``text`` and its normalized probability."""
    letters = sum(1 for c in text or "" if unicodedata.category(c).startswith("L"))
    if letters == 0:
        return TextLanguage(None, 0.0, 0)
    language, confidence = _identifier().classify(text)
    return TextLanguage(str(language), float(confidence), letters)


def primary_language(tag: str | None) -> str | None:
    """``en-US`` / ``en_us`` / ``EN`` -> ``en``: the landed label's primary subtag, lower case."""
    if not tag:
        return None
    return tag.replace("_", "-").split("-", 1)[0].strip().lower() or None
