"""Which transcripts NFC normalization could change: a sound quick check as one regex.

NFC is the most expensive step of transcript cleaning and leaves almost every real transcript as it
is. Unicode's quick check (UAX #15 §9) proves a string is already NFC when it has no character
whose NFC_Quick_Check is No or Maybe and its combining marks are in canonical order. Python's
``unicodedata`` has no NFC_Quick_Check, so the classes here are derived from what it does have,
each a superset of what the check needs (a false alarm costs one normalization, never a result).
A string is flagged when it has

* a character of :data:`UNSTABLE`: one that NFC changes on its own (QC No), or a code point
  unassigned in this Python's Unicode version (polars' normalizer may know a newer one);
* two adjacent characters of :data:`COMBINING` (non-zero canonical combining class), which may
  need reordering or let the second compose past the first;
* a character of :data:`SECOND` (the second of a canonical pair, QC Maybe, plus the Hangul vowel
  and trailing jamo) right after one of :data:`PRECEDING`. A second character with combining
  class 0 composes only with the character just before it; one with a non-zero class composes
  past other marks only (caught by the rule above). So the character before it must be able to
  end up as a composition's start: the first of a pair, a character with a decomposition, a
  Hangul L jamo or syllable, or a second or combining character that may itself have composed.
  This is what lets plain Bengali and Tamil through: their vowel signs (া, ா) are seconds, but
  only after the vowel signs ে and ெ, never after a consonant.

Computing the classes walks every code point (seconds); :mod:`speechdata.asr.nfc_ranges` holds them
precomputed for this Python's Unicode version and is used when the versions match.
"""

from __future__ import annotations

import functools
import sys
import unicodedata


def _ranges(codepoints: list[int]) -> str:
    parts, start, previous = [], None, None
    for cp in codepoints:
        if start is None:
            start = previous = cp
        elif cp == previous + 1:
            previous = cp
        else:
            parts.append((start, previous))
            start = previous = cp
    if start is not None:
        parts.append((start, previous))
    return "".join(f"\\x{{{a:x}}}" if a == b else f"\\x{{{a:x}}}-\\x{{{b:x}}}" for a, b in parts)


@functools.cache
def nfc_classes() -> tuple[str, str, str, str]:
    """``(UNSTABLE, COMBINING, SECOND, PRECEDING)`` as regex character classes (``[...]``) for polars / Rust regex."""
    unstable, combining, preceding = set(), set(), set()
    second_of_pair: set[int] = set()
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        if 0xD800 <= cp <= 0xDFFF:
            continue  # surrogates never occur in valid UTF-8 text
        if unicodedata.category(ch) == "Cn" or unicodedata.normalize("NFC", ch) != ch:
            unstable.add(cp)
        if unicodedata.combining(ch):
            combining.add(cp)
        decomposition = unicodedata.decomposition(ch)
        if decomposition and not decomposition.startswith("<"):
            preceding.add(cp)  # its decomposition's last character may compose with what follows
            fields = decomposition.split()
            if len(fields) == 2:
                preceding.add(int(fields[0], 16))
                second_of_pair.add(int(fields[1], 16))
    second_of_pair.update(range(0x1161, 0x1176))  # Hangul V jamo: L + V -> LV
    second_of_pair.update(range(0x11A8, 0x11C3))  # Hangul T jamo: LV + T -> LVT
    preceding.update(range(0x1100, 0x1113))  # Hangul L jamo
    preceding.update(range(0xAC00, 0xD7A4))  # Hangul syllables (their decomposition is algorithmic)
    # A second character composes with the last starter before it: the character just before it,
    # or one that character composed with (it is then itself a second or a combining mark).
    preceding |= second_of_pair | combining
    classes = (unstable, combining, second_of_pair, preceding)
    return tuple(f"[{_ranges(sorted(c))}]" for c in classes)


def may_change_under_nfc_pattern() -> str:
    """One regex: a match means NFC might change the string; no match means it surely does not."""
    from speechdata.asr import nfc_ranges

    if unicodedata.unidata_version == nfc_ranges.UNIDATA_VERSION:
        unstable, combining, second, preceding = (
            nfc_ranges.UNSTABLE,
            nfc_ranges.COMBINING,
            nfc_ranges.SECOND,
            nfc_ranges.PRECEDING,
        )
    else:
        unstable, combining, second, preceding = nfc_classes()
    return f"{unstable}|{combining}{combining}|{preceding}{second}"
