"""ASR manifest build in polars against the original pandas build, on the same in-memory rows.

Why: the original ASR pipeline's ``build_manifest.py`` merges metadata and audio index in pandas,
filters, and cleans every transcript with ``df.apply(..., axis=1)`` (a Python regex per row).
``build_asr_manifest`` does that and more (language corrections, two deduplications, the recording
split, the eval subset) as polars expressions. This makes ``--rows`` synthetic utterances (Hindi,
English, Tamil and mixed-script transcripts with tags and punctuation, 10 segments per recording) as
Arrow tables and times, wall-clock, ``--repeats`` runs of each, alternating, after one untimed run
of each on ``--warmup-rows`` rows (one-time costs: thread pools, regex compiles, DuckDB's first
connection), and compares the medians (then, untimed, checks that every output equals the
pre-issue-18 build's, kept in ``benchmarks/asr_manifest_reference.py``):

* ``polars``: ``pl.from_arrow`` of both tables + :func:`speechdata.asr.manifest.build_asr_manifest`;
* ``pandas_baseline``: ``to_pandas`` of both + the baseline's merge, filters and row-wise ``apply`` with
  the baseline's own regexes (copied below), nothing more.

Both start from Arrow tables in memory, so parquet reading is outside both figures. The polars side
uses every core; pandas' ``apply`` one.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time

import numpy as np
import pyarrow as pa

from benchmarks.report import emit, progress, ratio, stdout_to_stderr

TARGET_RATIO = 10.0  # the scale target for the manifest build
MIN_DURATION, MAX_DURATION, MIN_QUALITY = 0.5, 20.0, 0.5

# The baseline's cleaning, verbatim, for the baseline.
_TAG_RE = re.compile(r"\[.*?\]|", re.IGNORECASE)
_PUNCT_RE = re.compile(r"[।॥.,!?;:\"'\-—()…%/+=$*@#&_^>|\\<>`~。\u0964\u0965]+")


def clean_text(text):
    if not text:
        return ""
    text = _TAG_RE.sub("", text)
    text = _PUNCT_RE.sub("", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text


def _make_text(text, lang):
    return f"<|{lang}|> {clean_text(text)}"


def synthetic_inputs(rows: int, seed: int = 0) -> tuple[pa.Table, pa.Table]:
    rng = np.random.default_rng(seed)
    sentences = np.array(
        [
            "[music] नमस्ते। आप कैसे हैं?",
            "मैं office जा रहा हूँ, okay?",
            "Hello, world! [laugh] it's fine...",
            "வணக்கம், எப்படி இருக்கிறீர்கள்?",
            "यह (एक) परीक्षण है॥ [noise]",
            'well-known facts: 50% of "them".',
            "[laugh [loud]] हाँ",
            "(आज)",
            "[noise]",
            "the quick brown fox jumps over the lazy dog",
        ]
    )
    # Mostly distinct transcripts, as real ones are: a phrase plus a random number word and words.
    words = np.array(["घर", "पानी", "school", "आज", "kal", "நாள்", "बहुत", "good", "time", "বাংলা", "अच्छा", "road"])
    tails = np.char.add(
        np.char.add(words[rng.integers(0, len(words), rows)], " "), rng.integers(0, 10**6, rows).astype(str)
    )
    tails = np.char.add(np.char.add(tails, " "), words[rng.integers(0, len(words), rows)])
    n = np.arange(rows)
    shard = np.char.add("shard-", (n // 10_000).astype(str))
    utt = np.char.add("u", n.astype(str))
    utterances = pa.table(
        {
            "shard_id": shard,
            "utt_id": utt,
            "text": np.char.add(np.char.add(sentences[rng.integers(0, len(sentences), rows)], " "), tails),
            "language": np.array(["hi", "en", "ta", "hi", "bn"])[rng.integers(0, 5, rows)],
            "recording_id": np.char.add("rec", (n // 10).astype(str)),
            "quality": np.round(rng.uniform(0, 1, rows), 3),
        }
    )
    flac = pa.table(
        {
            "shard_id": shard,
            "utt_id": utt,
            "flac_path": np.char.add(np.char.add(np.char.add("asr/flac/", shard), "/"), np.char.add(utt, ".flac")),
            "duration_s": np.round(rng.gamma(2.0, 3.0, rows) + 0.2, 3),
            "audio_sha1": np.char.add("h", rng.integers(0, rows * 2, rows).astype(str)),
        }
    )
    return utterances, flac


def run_polars(utterances: pa.Table, flac: pa.Table):
    import polars as pl

    from speechdata.asr.manifest import AsrManifestConfig, build_asr_manifest

    return build_asr_manifest(
        pl.from_arrow(utterances),
        pl.from_arrow(flac),
        audio_root="/data",
        config=AsrManifestConfig(min_duration_s=MIN_DURATION, max_duration_s=MAX_DURATION, min_quality=MIN_QUALITY),
    )


def same_outputs_as_reference(utterances: pa.Table, flac: pa.Table, build) -> tuple[bool, float]:
    """Every output of ``build`` equals the pre-issue-18 build's on the same rows (raises if not),
    and the seconds that build took (``pl.from_arrow`` included, as for the timed polars run)."""
    import polars as pl
    from polars.testing import assert_frame_equal

    from benchmarks import asr_manifest_reference
    from speechdata.asr.manifest import AsrManifestConfig

    started = time.perf_counter()
    expected = asr_manifest_reference.build_asr_manifest(
        pl.from_arrow(utterances),
        pl.from_arrow(flac),
        audio_root="/data",
        config=AsrManifestConfig(min_duration_s=MIN_DURATION, max_duration_s=MAX_DURATION, min_quality=MIN_QUALITY),
    )
    seconds = time.perf_counter() - started
    for name in ("train", "validation", "eval", "removed"):
        assert_frame_equal(getattr(build, name), getattr(expected, name))
    assert build.relabeled == expected.relabeled and build.recordings == expected.recordings
    return True, seconds


def run_pandas_baseline(utterances: pa.Table, flac: pa.Table):
    meta_df = utterances.to_pandas()
    idx_df = flac.select(["shard_id", "utt_id", "flac_path", "duration_s"]).to_pandas()
    df = meta_df.merge(idx_df, on=["shard_id", "utt_id"], how="inner")
    df = df[
        (df["duration_s"] >= MIN_DURATION)
        & (df["duration_s"] <= MAX_DURATION)
        & (df["quality"] >= MIN_QUALITY)
        & (df["text"].notna())
        & (df["text"].str.strip().str.len() > 0)
    ].copy()
    df["text"] = df.apply(lambda row: _make_text(row["text"], row["language"]), axis=1)
    df["duration"] = df["duration_s"]
    return df


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 000 rows, for smoke runs")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--no-check", action="store_true", help="skip comparing every output with the pre-issue-18 build (untimed)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, alternating; medians compared")
    parser.add_argument(
        "--warmup-rows", type=int, default=10_000, help="both builds run once on this many rows first, untimed"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.repeats = 50_000, 1
    with stdout_to_stderr():
        import pandas  # noqa: F401  imported before timing: to_pandas would otherwise pay it
        import polars  # noqa: F401

        import speechdata.asr.manifest  # noqa: F401  (DuckDB, polars)

        utterances, flac = synthetic_inputs(args.rows)
        progress(
            f"{args.rows} rows, {len(set(utterances['text'].to_pylist()[:100_000]))} distinct texts in the first 100k"
        )
        # One-time costs (polars' thread pool and regex compiles, DuckDB's first connection, pandas'
        # first apply) are paid by a small run of each, so the figure is per-row throughput.
        if args.warmup_rows:
            run_polars(utterances.slice(0, args.warmup_rows), flac.slice(0, args.warmup_rows))
            run_pandas_baseline(utterances.slice(0, args.warmup_rows), flac.slice(0, args.warmup_rows))
        polars_runs, pandas_runs = [], []
        for _ in range(args.repeats):
            started = time.perf_counter()
            build = run_polars(utterances, flac)
            polars_runs.append(time.perf_counter() - started)
            progress(f"polars: {polars_runs[-1]:.2f} s, train {build.train.height}, removed {build.removed.height}")
            started = time.perf_counter()
            baseline_df = run_pandas_baseline(utterances, flac)
            pandas_runs.append(time.perf_counter() - started)
            progress(f"pandas (baseline): {pandas_runs[-1]:.2f} s, {len(baseline_df)} rows")
        polars_s, pandas_s = statistics.median(polars_runs), statistics.median(pandas_runs)
        same_outputs, previous_s = None, None
        if not args.no_check:
            same_outputs, previous_s = same_outputs_as_reference(utterances, flac, build)
        progress(f"same outputs as the pre-issue-18 build: {same_outputs} (which took {previous_s} s)")
    speedup = ratio(pandas_s, polars_s)
    emit(
        "asr_manifest",
        {
            "quick": args.quick,
            "rows": args.rows,
            "repeats": args.repeats,
            "warmup_rows": args.warmup_rows,
            "target_ratio": TARGET_RATIO,
        },
        {
            "polars_seconds": round(polars_s, 3),
            "pandas_baseline_seconds": round(pandas_s, 3),
            "polars_seconds_each": [round(x, 3) for x in polars_runs],
            "pandas_baseline_seconds_each": [round(x, 3) for x in pandas_runs],
            "ratio_pandas_over_polars": speedup,
            "meets_target": bool(speedup and speedup >= TARGET_RATIO),
            "polars_rows_per_second": round(args.rows / polars_s),
            "rows_kept_polars": build.train.height + build.validation.height,
            "rows_kept_pandas_baseline": len(baseline_df),
            "polars_removed_by_reason": build.removed_by_reason,
            "same_outputs_as_reference": same_outputs,
            # The pre-issue-18 build on the same rows, run last: before and after in one run.
            "previous_build_seconds": round(previous_s, 3) if previous_s else None,
        },
    )


if __name__ == "__main__":
    main()
