"""Transcript text in a CTC model's vocabulary, word by word.

Forced alignment needs every target token to exist in the acoustic model's vocabulary. Each
whitespace-separated word of the transcript is put in its spoken form
(:func:`speechdata.alignment.text_normalization.spoken_form`: Unicode NFKC, lower case, typographic
apostrophes unified, numbers and symbols spoken in the utterance's language, other scripts
romanized, characters the vocabulary still cannot express dropped) and tokenized on its own, so the
alignment keeps exactly one entry per WRITTEN word: "1984" is one word whose tokens spell "nineteen
eighty four". A word that normalizes to nothing (a lone dash) keeps an entry with no tokens and gets
a zero-length span at the previous word's end.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from speechdata.alignment.text_normalization import spoken_form

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})
_WORD = re.compile(r"\S+")

WORD_DELIMITER = "|"
"""wav2vec2's word-delimiter piece: a letter vocabulary that has it (the small model's) puts it
between words, so a greedy transcript of that model comes out in words."""

DELIMITER_SEPARATOR_POLICY = "optional"
"""How forced alignment treats ``|`` (:data:`speechdata.alignment.forced.SEPARATOR_POLICIES`): as a
blank, not a target. Measured on the held-out speech with the small model
(``benchmarks/accuracy/bench_alignment_accuracy.py --separator-policy required --separator-policy
optional``): median word-boundary error 19.5 ms (en) and 22.9 ms (de) optional, 23.7 and 25.0 ms
required. A required delimiter must take a frame of its own between two words, which pulls a
word's last letter early where the model fires the delimiter late; word starts are the same."""


@dataclass(frozen=True)
class CtcTargets:
    """Target token ids for the whole utterance and which targets belong to which word."""

    words: list[str]
    """The transcript's words as written (one per whitespace-separated run)."""
    targets: list[int]
    """Model token ids without blanks, including word separators for character models."""
    word_target_ranges: list[tuple[int, int]]
    """``[first, last)`` indices into ``targets`` per word; empty for a word that normalized to nothing."""
    token_texts: list[str]
    """Printable text of each target (for token-level CTM rows)."""


def normalize_word(word: str) -> str:
    return unicodedata.normalize("NFKC", word).translate(_APOSTROPHES).lower()


class CharVocabulary:
    """A character CTC vocabulary (a list of labels); the blank is the last class."""

    def __init__(self, labels: list[str]):
        self.labels = list(labels)
        self.index = {label: i for i, label in enumerate(self.labels)}
        self.blank_id = len(self.labels)
        self.separator_id = self.index.get(" ")
        self.separator_policy = "required"
        self.characters = set(self.labels) - {" "}
        self.marks_word_boundaries = self.separator_id is not None

    def word_tokens(self, word: str) -> list[int]:
        return [self.index[c] for c in normalize_word(word) if c in self.index and c != " "]

    def spoken_tokens(self, spoken: list[str]) -> list[int]:
        """Tokens of a written word's spoken words, with the separator between them."""
        tokens: list[int] = []
        for word in spoken:
            word_tokens = self.word_tokens(word)
            if word_tokens and tokens and self.separator_id is not None:
                tokens.append(self.separator_id)
            tokens += word_tokens
        return tokens

    def token_text(self, token_id: int) -> str:
        return "<space>" if token_id == self.separator_id else self.labels[token_id]


class SubwordVocabulary:
    """A SentencePiece/BPE CTC vocabulary (a transformers tokenizer); the blank is the class after the pieces."""

    def __init__(self, tokenizer, blank_id: int):
        self.tokenizer = tokenizer
        self.blank_id = blank_id
        self.unk_id = tokenizer.unk_token_id
        pieces = tokenizer.convert_ids_to_tokens(list(range(blank_id)))
        # Characters some piece spells; anything else would become <unk>, which aligns to nothing real.
        self.characters = {c for piece in pieces if not (piece.startswith("<") and piece.endswith(">")) for c in piece}
        # SentencePiece pieces carry the word start (a "|" piece there spells a bar); a letter
        # vocabulary with wav2vec2's delimiter (the small model) separates words by that token, as a
        # CharVocabulary's space does.
        is_sentencepiece = "\u2581" in self.characters
        self.separator_id = pieces.index(WORD_DELIMITER) if not is_sentencepiece and WORD_DELIMITER in pieces else None
        self.separator_policy = DELIMITER_SEPARATOR_POLICY
        self.marks_word_boundaries = is_sentencepiece or self.separator_id is not None
        self.characters.discard("\u2581")
        if self.separator_id is not None:
            self.characters.discard(WORD_DELIMITER)

    def word_tokens(self, word: str) -> list[int]:
        kept = "".join(c for c in normalize_word(word) if c in self.characters)
        if not kept:
            return []
        return [t for t in self.tokenizer.encode(kept, add_special_tokens=False) if t != self.unk_id]

    def spoken_tokens(self, spoken: list[str]) -> list[int]:
        """Tokens of a written word's spoken words, encoded as one phrase (each word gets its ``\u2581``),
        or with the delimiter between them where the vocabulary has one."""
        if self.separator_id is not None:
            tokens: list[int] = []
            for word in spoken:
                word_tokens = self.word_tokens(word)
                if word_tokens and tokens:
                    tokens.append(self.separator_id)
                tokens += word_tokens
            return tokens
        kept = " ".join(w for w in ("".join(c for c in normalize_word(s) if c in self.characters) for s in spoken) if w)
        if not kept:
            return []
        return [t for t in self.tokenizer.encode(kept, add_special_tokens=False) if t != self.unk_id]

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.convert_ids_to_tokens(token_id)


def vocabulary_of(acoustic) -> SubwordVocabulary:
    """The vocabulary a :class:`~speechdata.alignment.acoustic_models.CtcAcousticModel` emits over."""
    return SubwordVocabulary(acoustic.tokenizer, acoustic.blank_id)


def ctc_targets(text: str, vocabulary: CharVocabulary | SubwordVocabulary, language: str | None = None) -> CtcTargets:
    """Tokenize ``text`` word by word in its spoken form; character models get a separator token
    between words. ``language`` (ISO 639-1) picks how numbers and symbols are spoken (English if None)."""
    words = _WORD.findall(text or "")
    targets: list[int] = []
    ranges: list[tuple[int, int]] = []
    for word in words:
        tokens = vocabulary.spoken_tokens(spoken_form(word, language, vocabulary.characters))
        if tokens and targets and vocabulary.separator_id is not None:
            targets.append(vocabulary.separator_id)
        start = len(targets)
        targets.extend(tokens)
        ranges.append((start, len(targets)))
    return CtcTargets(words, targets, ranges, [vocabulary.token_text(t) for t in targets])
