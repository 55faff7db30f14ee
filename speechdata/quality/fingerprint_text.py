"""Transcript identity: a MinHash signature of a transcript's character shingles, and LSH band keys.

Transcripts are compared after normalization (Unicode NFKC, lower case, punctuation dropped,
whitespace collapsed), so case, punctuation and spacing never make two transcripts different. The
signature estimates the Jaccard similarity of two transcripts' sets of character 5-grams (words
joined by single spaces): robust to a changed word or an inflection, and meaningful for short
transcripts where word n-grams would be few. Band keys put each signature into ``LSH_BANDS``
buckets of ``LSH_ROWS`` values; two transcripts become candidates when they share a bucket, and
are then compared on the whole signature.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np

SIGNATURE_SIZE = 128
"""MinHash permutations: the Jaccard estimate's standard error is at most 0.045."""
SHINGLE_CHARS = 5
LSH_BANDS = 32
LSH_ROWS = SIGNATURE_SIZE // LSH_BANDS
"""32 bands of 4: a pair at Jaccard 0.6 becomes a candidate with probability 0.98, at 0.3 with 0.23."""
MINHASH_SEED = 1
"""Fixed forever: signatures in the corpus index are compared with signatures computed later."""

_NOT_WORD = re.compile(r"[^\w]+", re.UNICODE)


def normalized_transcript(text: str | None) -> str:
    """``text`` in NFKC, lower case, words of letters and digits separated by single spaces."""
    if not text:
        return ""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(word for word in _NOT_WORD.split(folded.replace("_", " ")) if word)


def word_count(normalized: str) -> int:
    return len(normalized.split()) if normalized else 0


def transcript_signature(normalized: str) -> np.ndarray | None:
    """The MinHash signature (uint64 ``[SIGNATURE_SIZE]``) of a normalized transcript; None when it
    is empty."""
    # datasketch pulls in scipy (0.7 s): loaded by the step that computes signatures, not by the code location.
    from datasketch import MinHash

    if not normalized:
        return None
    if len(normalized) <= SHINGLE_CHARS:
        shingles = {normalized}
    else:
        shingles = {normalized[i : i + SHINGLE_CHARS] for i in range(len(normalized) - SHINGLE_CHARS + 1)}
    minhash = MinHash(num_perm=SIGNATURE_SIZE, seed=MINHASH_SEED)
    minhash.update_batch([shingle.encode("utf-8") for shingle in sorted(shingles)])
    return np.asarray(minhash.hashvalues, np.uint64)


_BAND_MIX = np.random.default_rng(20_240_611).integers(1, 2**63, size=(LSH_BANDS, LSH_ROWS), dtype=np.uint64) | 1


def band_keys(signatures: np.ndarray) -> np.ndarray:
    """uint64 ``[n, LSH_BANDS]``: one key per band of each signature (``signatures`` ``[n, SIGNATURE_SIZE]``);
    keys of different bands never meet because the band number is mixed in."""
    rows = signatures.reshape(len(signatures), LSH_BANDS, LSH_ROWS).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = (rows * _BAND_MIX).sum(axis=2, dtype=np.uint64)
        return mixed ^ (np.arange(LSH_BANDS, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))


def estimated_jaccard(first: np.ndarray, second: np.ndarray) -> float:
    """The share of equal MinHash values: an unbiased estimate of the shingle sets' Jaccard similarity."""
    return float(np.mean(first == second))
