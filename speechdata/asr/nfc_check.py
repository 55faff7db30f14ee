"""Which transcripts NFC normalization could change: a sound quick check as two regex classes.

NFC is the most expensive step of transcript cleaning and leaves almost every real transcript as it
is. Unicode's quick check (UAX #15 §9) proves a string is already NFC when it has no character
whose NFC_Quick_Check is No or Maybe and its combining marks are in canonical order. Python's
``unicodedata`` has no NFC_Quick_Check, so the classes here are derived from what it does have,
each a superset of what the check needs (a false alarm costs one normalization, never a result):

* :data:`UNSTABLE` = every character that NFC changes on its own (QC No), every character that is
  the second of a canonical pair (QC Maybe: it can compose with what precedes it), the Hangul
  vowel and trailing jamo (algorithmic composition), and every code point unassigned in this
  Python's Unicode version (polars' normalizer may know a newer one);
* :data:`COMBINING` = characters with a non-zero canonical combining class; two in a row may need
  reordering, so any adjacent pair counts.

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
def nfc_classes() -> tuple[str, str]:
    """``(UNSTABLE, COMBINING)`` as regex character classes (``[...]``) for polars / Rust regex."""
    unstable, combining = [], []
    second_of_pair: set[int] = set()
    for cp in range(sys.maxunicode + 1):
        ch = chr(cp)
        if 0xD800 <= cp <= 0xDFFF:
            continue  # surrogates never occur in valid UTF-8 text
        if unicodedata.category(ch) == "Cn" or unicodedata.normalize("NFC", ch) != ch:
            unstable.append(cp)
        if unicodedata.combining(ch):
            combining.append(cp)
        decomposition = unicodedata.decomposition(ch)
        if decomposition and not decomposition.startswith("<"):
            fields = decomposition.split()
            if len(fields) == 2:
                second_of_pair.add(int(fields[1], 16))
    second_of_pair.update(range(0x1161, 0x1176))  # Hangul V jamo: L + V -> LV
    second_of_pair.update(range(0x11A8, 0x11C3))  # Hangul T jamo: LV + T -> LVT
    unstable = sorted(set(unstable) | second_of_pair)
    return f"[{_ranges(unstable)}]", f"[{_ranges(combining)}]"


def may_change_under_nfc_pattern() -> str:
    """One regex: a match means NFC might change the string; no match means it surely does not."""
    from speechdata.asr import nfc_ranges

    if nfc_ranges.UNIDATA_VERSION == unicodedata.unidata_version:
        unstable, combining = nfc_ranges.UNSTABLE, nfc_ranges.COMBINING
    else:
        unstable, combining = nfc_classes()
    return f"{unstable}|{combining}{combining}"
