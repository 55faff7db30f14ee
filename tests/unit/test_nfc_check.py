"""The NFC pre-check never lets through a string that NFC would change."""

import random
import re
import sys
import unicodedata

import polars as pl
import pytest

from speechdata.asr import nfc_ranges
from speechdata.asr.nfc_check import may_change_under_nfc_pattern, nfc_classes


def flagged(texts: list[str]) -> list[bool]:
    return pl.Series(texts, dtype=pl.String).str.contains(may_change_under_nfc_pattern()).to_list()


@pytest.mark.skipif(unicodedata.unidata_version != nfc_ranges.UNIDATA_VERSION, reason="computed at run time instead")
def test_precomputed_ranges_are_current():
    assert nfc_classes() == (nfc_ranges.UNSTABLE, nfc_ranges.COMBINING, nfc_ranges.SECOND, nfc_ranges.PRECEDING)


def test_every_composable_pair_is_flagged():
    pairs = []
    for cp in range(sys.maxunicode + 1):
        fields = unicodedata.decomposition(chr(cp)).split()
        if len(fields) == 2 and not fields[0].startswith("<"):
            text = "".join(chr(int(f, 16)) for f in fields)
            if unicodedata.normalize("NFC", text) != text:
                pairs.append(text)
    pairs += ["\u1100\u1161", "\uac00\u11a8"]  # Hangul L+V and LV+T
    assert len(pairs) > 900
    assert all(flagged(pairs))


def test_every_pair_before_a_second_character_that_nfc_changes_is_flagged():
    """Any character before any character that can end a composition, against polars' own NFC (the
    one the cleaning runs): the ``PRECEDING SECOND`` rule is what lets plain Indic text through."""
    seconds = [chr(cp) for cp in _codepoints(nfc_ranges.SECOND)]
    before = [chr(cp) for cp in [*range(0x20, 0x2000), *range(0x3040, 0x3100), *range(0xAC00, 0xAC00 + 28 * 40)]]
    texts = pl.Series([p + x for x in seconds for p in before], dtype=pl.String)
    changed = texts.str.normalize("NFC") != texts
    assert changed.sum() > 1000
    missed = texts.filter(changed & ~texts.str.contains(may_change_under_nfc_pattern()))
    assert missed.to_list() == []


def _codepoints(character_class: str) -> list[int]:
    codepoints = []
    for low, high in re.findall(r"\\x\{([0-9a-f]+)\}(?:-\\x\{([0-9a-f]+)\})?", character_class):
        codepoints += range(int(low, 16), int(high or low, 16) + 1)
    return codepoints


def test_unflagged_random_strings_are_already_nfc():
    rng = random.Random(0)
    alphabet = [chr(c) for c in range(0x20, 0x250)] + [chr(c) for c in range(0x300, 0x370)]
    alphabet += [chr(c) for c in range(0x900, 0x980)] + [chr(c) for c in range(0x980, 0xA00)]
    alphabet += [chr(c) for c in range(0xB80, 0xC00)] + [chr(c) for c in range(0x1100, 0x1200)] + ["\uac00", "\u212b"]
    alphabet += [chr(c) for c in range(0x1E00, 0x1F00)] + [chr(c) for c in range(0x3040, 0x30A0)] + ["\uac01", "\ud7a3"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(50_000)]
    texts += ["नमस्ते", "வணக்கம்", "hello", "e\u0301", "\u0958"]
    changed = [unicodedata.normalize("NFC", t) != t for t in texts]
    assert sum(changed) > 1000  # the sample does exercise normalization
    assert not [t for t, f, c in zip(texts, flagged(texts), changed) if c and not f]
    # And common text passes unflagged, Bengali and Tamil vowel signs after a consonant included.
    assert flagged(["hello", "नमस्ते", "বাংলা", "நாள்", "வணக்கம்"]) == [False] * 5
