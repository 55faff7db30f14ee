"""Spoken-form targets: words per second of ``ctc_targets`` with and without text normalization.

Why: every aligned utterance's transcript goes through ``ctc_targets`` (before alignment, for the
size check, and for the greedy reference), and a 2-hour recording carries ~17 000 words. This
builds transcripts from the fixture sentences with a share of written numbers, currencies,
percentages, dates and Cyrillic words mixed in, and measures in one process: the baseline (each word
NFKC-normalized, lower-cased and tokenized as it is, ``vocabulary.word_tokens``, what alignment did
before spoken forms) and ``ctc_targets`` with spoken forms, as words per second and their ratio.
The first romanization (uroman's tables, ~2 s) is paid in a warm-up, as a long-running stage pays it
once per process.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call
from speechdata.alignment.transcript_units import CharVocabulary, ctc_targets
from speechdata.testing.shards import load_clips

WRITTEN = ["1984", "$25,", "50%", "12/05/2024", "3.5", "21st", "&", "Москва", "Αθήνα", "10:30", "€3.50", "007"]
LABELS = list(" abcdefghijklmnopqrstuvwxyz'")


def transcripts(n: int, words_each: int, written_share: float, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    plain = " ".join(clip.text for clip in load_clips()).split()
    texts = []
    for _ in range(n):
        picks = [
            WRITTEN[int(rng.integers(len(WRITTEN)))]
            if rng.random() < written_share
            else plain[int(rng.integers(len(plain)))]
            for _ in range(words_each)
        ]
        texts.append(" ".join(picks))
    return texts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 transcripts")
    parser.add_argument("--transcripts", type=int, default=2_000)
    parser.add_argument("--words", type=int, default=40, help="words per transcript")
    parser.add_argument("--written-share", type=float, default=0.05, help="share of numbers, symbols, other scripts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.transcripts = 200
    with stdout_to_stderr():
        vocabulary = CharVocabulary(LABELS)
        texts = transcripts(args.transcripts, args.words, args.written_share, args.seed)
        ctc_targets(" ".join(WRITTEN), vocabulary, "en")  # warm-up: uroman's tables, num2words' languages
        n_words = sum(len(t.split()) for t in texts)
        baseline_s, baseline_targets = timed_call(
            lambda: sum(len(vocabulary.word_tokens(w)) for t in texts for w in t.split())
        )
        spoken_s, spoken_targets = timed_call(lambda: sum(len(ctc_targets(t, vocabulary, "en").targets) for t in texts))
        progress(f"{n_words} words: baseline {baseline_s:.3f} s, spoken forms {spoken_s:.3f} s")
    emit(
        "text_normalization",
        {
            "quick": args.quick,
            "transcripts": args.transcripts,
            "words": args.words,
            "written_share": args.written_share,
        },
        {
            "words": n_words,
            "baseline_words_per_s": round(n_words / baseline_s),
            "spoken_words_per_s": round(n_words / spoken_s),
            "ratio_spoken_over_baseline_s": ratio(spoken_s, baseline_s),
            "baseline_targets": baseline_targets,
            "spoken_targets": spoken_targets,
            "seconds_for_17280_words": round(17_280 * spoken_s / n_words, 3),
        },
    )


if __name__ == "__main__":
    main()
