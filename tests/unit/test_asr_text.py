"""Transcript cleaning on the cases the original script's regexes got wrong or never met."""

import polars as pl
import pytest

from speechdata.asr.text import clean_transcripts


@pytest.mark.parametrize(
    "raw, cleaned",
    [
        ("[laugh] hello [music] world", "hello world"),
        ("[laugh [loud]] hi there", "hi there"),  # the original non-greedy regex leaves "] hi there"
        ("x [a [b [c]]] y", "x y"),
        ("नमस्ते। आप कैसे हैं॥", "नमस्ते आप कैसे हैं"),
        ("है।वह", "है वह"),  # the original script deletes the danda and glues the words
        ("मैं office जा रहा हूँ, okay?", "मैं office जा रहा हूँ okay"),
        ("don't stop—now", "dont stop now"),
        ("“quoted” «text» 50%", "quoted text 50"),
        ("...!!! ।।", ""),
        ("  spaced \t out \n text ", "spaced out text"),
        ("stray ] brackets [ left", "stray brackets left"),
    ],
)
def test_hard_cases(raw, cleaned):
    assert clean_transcripts([raw]) == [cleaned]


def test_nfc_normalization_makes_one_spelling():
    decomposed = "क\u093c"  # KA + NUKTA
    precomposed = "\u0958"  # QA
    assert clean_transcripts([decomposed]) == clean_transcripts([precomposed])


def test_null_stays_null():
    assert clean_transcripts([None]) == [None]


def test_cleaning_in_threads_gives_each_row_what_one_thread_gives():
    import polars as pl

    from speechdata.asr.text import clean_transcript_series, clean_transcript_series_in_threads

    rows = ["[laugh [loud]] है।वह", None, "  a\tb.. c ", "don't", "", "e\u0301"] * 997
    series = pl.Series("text", rows, dtype=pl.String)
    in_threads = clean_transcript_series_in_threads(series, min_rows=1_000)
    assert in_threads.to_list() == clean_transcript_series(series).to_list()
    assert in_threads.name == "text" and in_threads.len() == len(rows)


def test_blank_text_of_any_whitespace_cleans_to_nothing():
    # The manifest checks for blank text only where the cleaned text is empty (``empty_text_reasons``):
    # that is sound only if every blank transcript cleans to nothing.
    characters = pl.Series([chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF], dtype=pl.String)
    whitespace = characters.filter(characters.str.strip_chars() == "")
    assert whitespace.len() >= 20  # Unicode's White_Space: tab to CR, space, NBSP, U+2000-U+200A, ...
    blanks = [*whitespace.to_list(), "".join(whitespace.to_list()), " \u2000 ", ""]
    assert set(clean_transcripts(blanks)) == {""}
