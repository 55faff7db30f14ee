"""Written words in the form a CTC model can emit: numbers and symbols spoken, other scripts romanized.

A CTC model emits letters (or pieces of them), so a written "1984", "$25" or "Москва" has no target
tokens of its own: without this module it gets a zero-length span. :func:`spoken_form` turns ONE
written word (a whitespace-separated run of the transcript) into the words a speaker says for it:

- numbers through ``num2words`` in the utterance's language: cardinals, years (a 4-digit number from
  1100 to 2099), ordinals (``1st``/``2nd`` in English, ``1er``/``2e`` in French, ``1º``/``2ª`` in
  Spanish), decimals and thousands separators as the language writes them (``1,000.5`` in English,
  ``1.000,5`` in German, French and Spanish), times (``10:30``) and dates (``12/05/2024``,
  ``2024-05-12``: day, month name and year);
- currencies (``$25``, ``25€``, ``£3.50``, and the codes ``EUR``, ``USD``, ``GBP`` as words of their
  own), percentages (``50%``) and the symbols ``&``, ``+``, ``@``, ``=``, ``#``, ``°``;
- letters the model's vocabulary lacks (Cyrillic, Greek, CJK, or ``ñ`` for an English model)
  romanized with ``uroman`` (Hermjakob et al., 2018), one written word at a time.

The written word stays the unit: the alignment gives it the span from the first to the last token of
its spoken form, so every written word keeps its own start and end, with the punctuation attached to
it as written ("$25," spans "twenty five dollars"). Digit runs over 15 digits (ids, phone numbers) are
read digit by digit; a number ``num2words`` cannot say falls back to its digits, and a word that
still defeats the rules is aligned as written: one odd word never costs its utterance. Languages with their own symbol and month names:
en, de, fr, es; any other language gets its numbers from ``num2words`` where it knows the language
(English otherwise) and its symbols dropped, as before. German ordinals written ``3.`` are read as
cardinals (the dot cannot be told from a full stop one word at a time).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Collection
from decimal import Decimal, InvalidOperation

from num2words import num2words

from speechdata.alignment.spoken_names import (
    CURRENCY_CODES,
    CURRENCY_NAMES,
    CURRENCY_SYMBOLS,
    DECIMAL_COMMA_LANGUAGES,
    MONTHS,
    ORDINAL_SUFFIXES,
    SYMBOL_CHARACTERS,
    SYMBOL_NAMES,
)

DEFAULT_LANGUAGE = "en"
"""Numbers of an utterance without a language (or in one ``num2words`` does not know) are spoken in English."""

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})

_LETTERS = r"[^\W\d_]+(?:'[^\W\d_]+)*"
_NUMBER = r"\d+(?:[.,:/-]\d+)*"
_DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}|\d{1,2}([/.-])\d{1,2}\1(?:\d{4}|\d{2})")
_WORD_SPLIT = re.compile(r"[\s\-,]+")


@functools.cache
def _piece_pattern(language: str) -> re.Pattern:
    suffix = ORDINAL_SUFFIXES.get(language)
    ordinal = rf"(?P<ordinal>{suffix})?(?![^\W\d_])" if suffix else ""
    return re.compile(
        rf"(?P<number>{_NUMBER}){ordinal}|(?P<letters>{_LETTERS})|(?P<symbol>[{re.escape(SYMBOL_CHARACTERS)}])"
    )


@functools.cache
def _uroman():
    # Loading uroman's tables takes ~2 s: once per process, and only when a word needs it.
    import uroman

    return uroman.Uroman()


@functools.lru_cache(maxsize=65_536)
def romanize(word: str) -> str:
    """``word`` in Latin letters (uroman), lower case."""
    return unicodedata.normalize("NFKC", _uroman().romanize_string(word)).lower()


@functools.cache
def _num2words_language(language: str) -> str:
    try:
        num2words(1, lang=language)
    except NotImplementedError:
        return DEFAULT_LANGUAGE
    return language


def _words(text: str) -> list[str]:
    return [w for w in _WORD_SPLIT.split(text.lower()) if w]


MAX_CARDINAL_DIGITS = 15
"""Longer digit runs (ids, phone and card numbers) are read digit by digit, as people read them."""

# What num2words raises for input it cannot say: too large for the language, or a case it lacks.
_NUM2WORDS_ERRORS = (OverflowError, KeyError, IndexError, ValueError, TypeError, ArithmeticError, NotImplementedError)


def _cardinal(value: int | Decimal, language: str) -> list[str]:
    digits = str(value)
    if sum(c.isdigit() for c in digits) > MAX_CARDINAL_DIGITS:
        return _digits_one_by_one(digits, language)
    try:
        return _words(num2words(value, lang=_num2words_language(language)))
    except _NUM2WORDS_ERRORS:
        return _digits_one_by_one(digits, language)


def _digits_one_by_one(digits: str, language: str) -> list[str]:
    return [w for d in digits if d.isdigit() for w in _digit_words(int(d), language)]


@functools.cache
def _digit_words(digit: int, language: str) -> tuple[str, ...]:
    return tuple(_words(num2words(digit, lang=_num2words_language(language))))


def _integer(digits: str, language: str, *, as_year: bool) -> list[str]:
    if (len(digits) > 1 and digits.startswith("0")) or len(digits) > MAX_CARDINAL_DIGITS:
        return _digits_one_by_one(digits, language)  # "007", "0800", long ids: read digit by digit
    value = int(digits)
    if as_year and len(digits) == 4 and 1100 <= value <= 2099:
        try:
            return _words(num2words(value, lang=_num2words_language(language), to="year"))
        except _NUM2WORDS_ERRORS:
            pass
    return _cardinal(value, language)


def _date(parts: list[str], language: str) -> list[str] | None:
    """Day, month name and year of a 3-part date (``2024-05-12``, ``12/05/2024``, ``05/12/2024`` in en)."""
    if len(parts) != 3 or language not in MONTHS:
        return None
    numbers = [int(p) for p in parts]
    if len(parts[0]) == 4:
        year, month, day = numbers
    elif len(parts[2]) in (2, 4):
        first, second, year = numbers
        month_first = language == "en" and first <= 12
        month, day = (first, second) if month_first else (second, first)
    else:
        return None
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    month_name = [MONTHS[language][month - 1]]
    year_words = _integer(parts[2] if len(parts[0]) != 4 else parts[0], language, as_year=True)
    if language == "en":
        return [*month_name, *_words(num2words(day, lang="en", to="ordinal")), *year_words]
    if language == "de":
        return [*_words(num2words(day, lang="de", to="ordinal")), *month_name, *year_words]
    if language == "fr":
        day_words = ["premier"] if day == 1 else _cardinal(day, "fr")
        return [*day_words, *month_name, *year_words]
    return [*_cardinal(day, "es"), "de", *month_name, "de", *year_words]


def _thousands_and_decimal(number: str, language: str) -> tuple[str, str | None] | None:
    """``(integer digits, decimal digits or None)`` of a number with separators, or None if it is none."""
    thousands, decimal = (".", ",") if language in DECIMAL_COMMA_LANGUAGES else (",", ".")
    match = re.fullmatch(rf"(\d{{1,3}}(?:{re.escape(thousands)}\d{{3}})+|\d+)(?:{re.escape(decimal)}(\d+))?", number)
    if match is None:
        return None
    return match.group(1).replace(thousands, ""), match.group(2)


def _number(number: str, language: str, *, ordinal: bool, as_year: bool) -> tuple[list[str], Decimal | None]:
    """The spoken words of a number, and its value where it is one amount (for currencies)."""
    if ordinal and number.isdigit() and len(number) <= MAX_CARDINAL_DIGITS:
        try:
            return _words(num2words(int(number), lang=_num2words_language(language), to="ordinal")), None
        except _NUM2WORDS_ERRORS:
            pass
    if ":" in number:
        first, *rest = number.split(":")
        spoken = _integer(first, language, as_year=False)
        minutes = [
            _cardinal(int(part), language) if len(part) <= 2 else _integer(part, language, as_year=False)
            for part in rest
            if part.strip("0")
        ]
        return spoken + [w for words in minutes for w in words], None
    if _DATE.fullmatch(number):
        date = _date(re.split(r"[/.-]", number), language)
        if date is not None:
            return date, None
    parts = re.split(r"[/-]", number)
    if len(parts) > 1:
        return [w for part in parts for w in _integer(part, language, as_year=False)], None
    split = _thousands_and_decimal(number, language)
    if split is None:
        groups = re.split(r"[.,]", number)
        return [w for group in groups for w in _integer(group, language, as_year=False)], None
    integer, decimal = split
    if decimal is None:
        has_separator = integer != number
        return _integer(integer, language, as_year=as_year and not has_separator), Decimal(integer)
    try:
        value = Decimal(f"{integer}.{decimal}")
    except InvalidOperation:
        return _digits_one_by_one(integer + decimal, language), None
    return _cardinal(value, language), value


def _currency_words(amount: Decimal | None, amount_words: list[str], currency: str, language: str) -> list[str]:
    names = CURRENCY_NAMES.get(language)
    if names is None:
        return amount_words
    singular, plural = names[currency]
    if amount is None:
        return [*amount_words, *_words(plural)]
    units = int(amount)
    cents = int((amount - units) * 100)
    words = [*_cardinal(units, language), *_words(singular if units == 1 else plural)]
    if cents:
        cent_singular, cent_plural = names.get(f"cent:{currency}", names["cent"])
        words += [*_cardinal(cents, language), *_words(cent_singular if cents == 1 else cent_plural)]
    return words


def _verbalized(word: str, language: str) -> list[str]:
    """The spoken words of one written word, before romanization."""
    pieces = list(_piece_pattern(language).finditer(word))
    spoken: list[str] = []
    pending_currency: str | None = None
    for i, piece in enumerate(pieces):
        kind = piece.lastgroup if piece.lastgroup != "ordinal" else "number"
        text = piece.group(kind)
        if kind == "letters":
            if text in CURRENCY_CODES and language in CURRENCY_NAMES:
                spoken += _words(CURRENCY_NAMES[language][text][1])
            else:
                spoken.append(text.lower())
        elif kind == "symbol":
            currency = CURRENCY_SYMBOLS.get(text)
            next_is_number = i + 1 < len(pieces) and pieces[i + 1].lastgroup in ("number", "ordinal")
            if currency is not None and next_is_number:
                pending_currency = currency  # "$25": spoken after the amount
            elif currency is not None and language in CURRENCY_NAMES:
                spoken += _words(CURRENCY_NAMES[language][currency][1])
            elif text in SYMBOL_NAMES.get(language, {}):
                spoken += _words(SYMBOL_NAMES[language][text])
        else:
            ordinal = bool(piece.groupdict().get("ordinal"))
            following = pieces[i + 1].group() if i + 1 < len(pieces) else None
            amount_follows = following in CURRENCY_SYMBOLS or following == "%"
            words, amount = _number(text, language, ordinal=ordinal, as_year=not (pending_currency or amount_follows))
            if pending_currency is None and following in CURRENCY_SYMBOLS:
                pending_currency = CURRENCY_SYMBOLS[following]
                pieces[i + 1 : i + 2] = []  # "25€": the symbol is spoken with the amount
            if pending_currency is not None:
                words = _currency_words(amount, words, pending_currency, language)
                pending_currency = None
            spoken += words
    return spoken


_EDGE_PUNCTUATION = "\"'()[]{}<>.,;:!?¡¿«»“”„‘’‚‹›—–-…*/\\|~_"


def _without_edge_punctuation(word: str, characters: Collection[str]) -> str:
    """``word`` without the punctuation (that the vocabulary cannot emit) at its two ends."""
    start, end = 0, len(word)
    while start < end and word[start] in _EDGE_PUNCTUATION and word[start] not in characters:
        start += 1
    while end > start and word[end - 1] in _EDGE_PUNCTUATION and word[end - 1] not in characters:
        end -= 1
    return word[start:end]


def spoken_form(word: str, language: str | None, characters: Collection[str]) -> list[str]:
    """The words a speaker says for the written ``word``, lower case, in ``characters`` where romanizing can.

    ``characters``: the letters the model can emit. A word the vocabulary already spells is returned
    as is (NFKC, lower case, apostrophes unified); punctuation around or inside a word is not spoken.
    """
    normalized = unicodedata.normalize("NFKC", word).translate(_APOSTROPHES)
    lowered = normalized.lower()
    # Most words: letters the vocabulary has, maybe with punctuation around them ("fox,", "(the").
    core = _without_edge_punctuation(lowered, characters)
    if core and all(c in characters for c in core) and normalized.strip(_EDGE_PUNCTUATION) not in CURRENCY_CODES:
        return [core]
    language = (language or DEFAULT_LANGUAGE).split("-")[0].lower()
    try:
        verbalized = _verbalized(normalized, language)
    except Exception:  # noqa: BLE001 - one odd word must never cost its shard: align it as written
        verbalized = [lowered]
    spoken = []
    for spoken_word in verbalized:
        spoken_word = unicodedata.normalize("NFKC", spoken_word).lower()
        if any(c.isalpha() and c not in characters for c in spoken_word):
            for romanized in _words(romanize(spoken_word).translate(_APOSTROPHES)):
                # uroman reads numerals as digits (num2words' Japanese 二十五 comes back as 25): spoken in English.
                if any(c.isdigit() for c in romanized) and not any(c.isdigit() for c in characters):
                    spoken += [w.lower() for w in _verbalized(romanized, DEFAULT_LANGUAGE)]
                else:
                    spoken.append(romanized)
        else:
            spoken.append(spoken_word)
    return spoken
