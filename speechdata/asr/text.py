"""Transcript cleaning for ASR targets, as polars expressions: no per-row Python.

The original ASR pipeline's ``clean_text`` removes bracket tags, deletes Latin and Indic punctuation
and collapses whitespace; the language tag is then prepended (``<|hi|> ...``). Three deliberate
differences, each because the original ASR pipeline's output was wrong on real text:

* Nested tags (``[laugh [loud]] hi``) are removed whole. The original ASR pipeline's non-greedy
  ``\\[.*?\\]`` stops at the first ``]`` and leaves ``] hi``. Tags are removed innermost first,
  :data:`TAG_NESTING_DEPTH` levels.
* Punctuation becomes a space, not nothing: the original ASR pipeline turns ``है।वह`` into one word
  ``हैवह`` and ``well-known`` into ``wellknown``. Apostrophes inside words are still deleted
  (``don't`` -> ``dont``), as the original ASR pipeline does, so contractions stay one token.
* Unicode is NFC-normalized first, so the same word typed with combining marks or precomposed
  characters (common in Devanagari and Bengali input methods) becomes one target string.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import polars as pl

from speechdata.asr.nfc_check import may_change_under_nfc_pattern

TAG_NESTING_DEPTH = 3
_INNERMOST_TAG = r"\[[^\[\]]*\]"
_APOSTROPHES = r"['’‘`]"
# The original ASR pipeline's set (Latin, danda U+0964, double danda U+0965, the ideographic full
# stop) plus stray brackets, curly quotes and guillemets, the Devanagari abbreviation sign and
# Arabic-script marks.
_PUNCTUATION = r"।॥॰.,!?;:\"\-—–()…%/+=$*@#&_^>|\\<~。、，！？：；“”«»„\[\]{}۔،؟"
_PUNCTUATION_OR_SPACE = rf"[\s{_PUNCTUATION}]+"
# The same replacement as ``_PUNCTUATION_OR_SPACE`` -> " ", without matching the lone ASCII spaces
# between words (which it would replace by themselves): a run of two or more, a whitespace other
# than " " (``[^\S ]``), or one punctuation character. A regex replacement costs per match, and
# lone spaces were most of the matches.
_PUNCTUATION_OR_SPACE_CHANGED = rf"[\s{_PUNCTUATION}]{{2,}}|[^\S ]|[{_PUNCTUATION}]"


def clean_transcript_expr(text: pl.Expr) -> pl.Expr:
    """Cleaned text: tags removed, punctuation to spaces, whitespace collapsed, stripped."""
    return text.map_batches(clean_transcript_series, return_dtype=pl.String, is_elementwise=True)


def clean_transcript_series(text: pl.Series) -> pl.Series:
    """:func:`clean_transcript_expr` on a Series (whole-column polars operations, no per-row Python).

    NFC and tag removal run only on the rows they could change (:mod:`speechdata.asr.nfc_check`,
    a literal ``[``): NFC was most of the cleaning's cost and changes almost no real transcript.
    """
    cleaned = _on_rows(text, text.str.contains(may_change_under_nfc_pattern()), lambda s: s.str.normalize("NFC"))

    cleaned = _remove_tags(cleaned, TAG_NESTING_DEPTH)
    cleaned = cleaned.str.replace_all(_APOSTROPHES, "")
    # One pass turns punctuation into spaces and collapses every run of spaces with it; what is
    # left of whitespace is then single " ", so stripping " " strips all of it.
    return cleaned.str.replace_all(_PUNCTUATION_OR_SPACE_CHANGED, " ").str.strip_chars(" ")


PARALLEL_MIN_ROWS = 100_000
"""Below this many rows one thread cleans everything: splitting costs more than it saves."""


def clean_transcript_series_in_threads(text: pl.Series, min_rows: int = PARALLEL_MIN_ROWS) -> pl.Series:
    """:func:`clean_transcript_series` on consecutive slices of ``text``, one per polars thread.

    polars runs each string operation over a column on one thread; the slices run concurrently
    (polars releases the GIL inside them). Rows come back in their order, each cleaned as alone.
    """
    threads = min(pl.thread_pool_size(), text.len() // max(min_rows // 2, 1))
    if threads < 2:
        return clean_transcript_series(text)
    bounds = [text.len() * i // threads for i in range(threads + 1)]
    # Consecutive bounds: the shifted copy is one shorter by design.
    slices = [text.slice(start, end - start) for start, end in zip(bounds, bounds[1:], strict=False)]
    with ThreadPoolExecutor(threads) as pool:
        return pl.concat(list(pool.map(clean_transcript_series, slices)), rechunk=True)


def _remove_tags(text: pl.Series, depth: int) -> pl.Series:
    """Innermost tags removed ``depth`` times over; each pass only on the rows still holding a ``[``."""
    if depth == 0:
        return text
    return _on_rows(
        text,
        text.str.contains("[", literal=True),
        lambda rows: _remove_tags(rows.str.replace_all(_INNERMOST_TAG, " "), depth - 1),
    )


def _on_rows(series: pl.Series, mask: pl.Series, transform) -> pl.Series:
    """``transform`` applied to the rows where ``mask`` is true, the others untouched."""
    rows = mask.arg_true()
    if rows.len() == 0:
        return series
    return series.clone().scatter(rows, transform(series.gather(rows)))  # clone: scatter writes in place


def language_tag_expr(language: pl.Expr) -> pl.Expr:
    """``<|hi|>``: the prefix the multilingual tokenizer knows as one symbol per language."""
    return pl.lit("<|") + language + pl.lit("|>")


def tagged_text_expr(cleaned: pl.Expr, language: pl.Expr) -> pl.Expr:
    """The training target: ``<|lang|> cleaned text``."""
    return language_tag_expr(language) + pl.lit(" ") + cleaned


def clean_transcripts(texts: Iterable[str | None]) -> list[str | None]:
    """Clean a handful of strings (tests, ad-hoc eval text) through the same expressions."""
    series = pl.Series("text", list(texts), dtype=pl.String)
    return series.to_frame().select(clean_transcript_expr(pl.col("text"))).to_series().to_list()
