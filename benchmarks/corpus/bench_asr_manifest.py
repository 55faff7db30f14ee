"""ASR manifest build in polars against the original pandas build, on the same in-memory rows.

Why: the original ASR pipeline's ``build_manifest.py`` merges metadata and audio index in pandas,
filters, and cleans every transcript with ``df.apply(..., axis=1)`` (a Python regex per row).
``build_asr_manifest`` does that and more (language corrections, two deduplications, the recording
split, the eval subset) as polars expressions. This makes ``--rows`` synthetic utterances (Hindi,
English, Tamil and mixed-script transcripts with tags and punctuation, 10 segments per recording) as
Arrow tables and times, wall-clock, ``--repeats`` runs of each, alternating, after one untimed run
of each on ``--warmup-rows`` rows (one-time costs: thread pools, regex compiles, DuckDB's first
connection), and compares the medians (then, untimed, checks that every output equals the
pre-issue-18 build's, kept in ``benchmarks/corpus/asr_manifest_reference.py``):

* ``polars``: ``pl.from_arrow`` of both tables + :func:`speechdata.asr.manifest.build_asr_manifest`;
* ``pandas_baseline``: ``to_pandas`` of both + the baseline's merge, filters and row-wise ``apply`` with
  the baseline's own regexes (copied below), nothing more.

Both start from Arrow tables in memory, so parquet reading is outside both figures. The polars side
uses every core; pandas' ``apply`` one.

**Per new shard** (``per_new_shard``): the cost of one more shard of ``--shard-rows`` utterances
landing on a corpus of each of ``--corpus-shards`` shards (stored inputs: each shard's utterance and
FLAC index written with the project's writer), through the stage's entry point
(:func:`speechdata.asr.stage.build_and_write_asr_manifests`), each run in a fresh process (wall
seconds inside it, peak RSS from ``VmHWM``):

* ``incremental``: the build with the corpus-wide files (a streamed concatenation of the parts);
* ``incremental_parts_only``: ``combined=False`` (the per-shard parts are the manifests);
* ``corpus_wide_baseline``: the build before it was incremental: every shard read, one
  :func:`~speechdata.asr.manifest.build_asr_manifest` over all, every manifest file rewritten.

``growth`` is each figure at the largest corpus over the smallest (1.0: a new shard costs the same
whatever the corpus).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

from benchmarks.report import emit, leave_measured, peak_rss_mb, progress, ratio, stdout_to_stderr, timed_call

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

    from benchmarks.corpus import asr_manifest_reference
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


def write_stored_shard(root: str, shard_id: str, rows: int, seed: int) -> None:
    """One shard's stored ASR inputs (utterance index, FLAC index), as the project's writer stores them."""
    from speechdata.io import layout
    from speechdata.io.storage import DataRoot

    utterances, flac = synthetic_inputs(rows, seed=seed)
    # Audio hashes unique to the shard (a new shard rarely repeats another's audio), a few repeated inside it.
    sha = np.char.add(f"{seed:08x}", np.char.zfill(np.arange(rows).astype(str), 32))
    flac = flac.set_column(flac.schema.get_field_index("audio_sha1"), "audio_sha1", pa.array(sha))
    flac = flac.set_column(
        flac.schema.get_field_index("flac_path"),
        "flac_path",
        pa.array([f"{layout.asr_flac_dir(shard_id)}/{u}.flac" for u in flac["utt_id"].to_pylist()]),
    )
    data_root = DataRoot(root)
    utterances = utterances.drop_columns(["shard_id"]).rename_columns(
        ["utt_id", "text", "language", "recording_id", "tx_quality_score"]
    )
    recordings = pa.array([f"{shard_id}-{r}" for r in utterances["recording_id"].to_pylist()])
    utterances = utterances.set_column(utterances.schema.get_field_index("recording_id"), "recording_id", recordings)
    data_root.write_parquet(layout.utterance_index(shard_id), utterances)
    data_root.write_parquet(layout.asr_flac_index(shard_id), flac.drop_columns(["shard_id"]))


def corpus_wide_build(root: str) -> None:
    """The build before it was incremental: every shard read, one build over all, every file rewritten."""
    from speechdata.asr.flac_retention import remove_unreferenced_flacs
    from speechdata.asr.manifest import AsrManifestConfig, build_asr_manifest, nemo_jsonl_bytes
    from speechdata.asr.stage import MANIFEST_TO_ROOT, read_asr_inputs, shards_with_asr_flac
    from speechdata.io import layout
    from speechdata.io.storage import DataRoot

    data_root = DataRoot(root)
    utterances, flac = read_asr_inputs(data_root, shards_with_asr_flac(data_root))
    build = build_asr_manifest(utterances, flac, audio_root=MANIFEST_TO_ROOT, config=AsrManifestConfig())
    for split, frame in (("train", build.train), ("validation", build.validation), ("eval", build.eval)):
        data_root.write_parquet(f"baseline/{layout.asr_manifest(split)}", frame.to_arrow())
        data_root.write_bytes(f"baseline/{layout.asr_manifest(split, 'jsonl')}", nemo_jsonl_bytes(frame))
    data_root.write_parquet(f"baseline/{layout.asr_manifest_removed()}", build.removed.to_arrow())
    remove_unreferenced_flacs(data_root)


def measure_child(mode: str, root: str) -> None:
    """Run one build in this (fresh) process and print its wall seconds and peak RSS as JSON."""
    # pyarrow imports pandas on its first from_pylist or compute call: a one-time cost, outside the figure.
    import pandas  # noqa: F401
    import polars  # noqa: F401  imports outside the figure

    from speechdata.asr.manifest import AsrManifestConfig
    from speechdata.asr.stage import build_and_write_asr_manifests
    from speechdata.io.storage import DataRoot

    started = time.perf_counter()
    if mode == "corpus_wide_baseline":
        corpus_wide_build(root)
        changed = None
    else:
        summary = build_and_write_asr_manifests(
            DataRoot(root), AsrManifestConfig(), combined=mode != "incremental_parts_only"
        )
        changed = len(summary.shards_changed)
    wall = time.perf_counter() - started
    print(json.dumps({"wall_s": round(wall, 3), "peak_rss_mb": round(peak_rss_mb(), 1), "shards_changed": changed}))


def _catch_up(root: str) -> None:
    """The incremental build of the corpus as it stands, untimed: in this process (a fresh interpreter
    would be one more start of polars and pandas, for no figure)."""
    from speechdata.asr.manifest import AsrManifestConfig
    from speechdata.asr.stage import build_and_write_asr_manifests
    from speechdata.io.storage import DataRoot

    build_and_write_asr_manifests(DataRoot(root), AsrManifestConfig(), combined=True)


def _in_child(mode: str, root: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.corpus.bench_asr_manifest", "--measure", mode, root],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def per_new_shard(corpus_shards: list[int], shard_rows: int) -> dict:
    """Each mode's cost of one new shard at each corpus size, and its growth from the smallest to the largest."""
    figures: dict[str, dict] = {}
    for shards in corpus_shards:
        root = tempfile.mkdtemp(prefix=f"bench-asr-{shards}-")
        try:
            for number in range(shards):
                write_stored_shard(root, f"shard-{number:05d}", shard_rows, seed=number)
            _catch_up(root)
            size: dict[str, dict] = {}
            for offset, mode in enumerate(("incremental", "incremental_parts_only")):
                write_stored_shard(root, f"shard-{shards + offset:05d}", shard_rows, seed=shards + offset)
                size[mode] = _in_child(mode, root)
            size["corpus_wide_baseline"] = _in_child("corpus_wide_baseline", root)
            progress(f"{shards} shards + 1: {size}")
            figures[str(shards)] = size
        finally:
            shutil.rmtree(root, ignore_errors=True)
    smallest, largest = str(corpus_shards[0]), str(corpus_shards[-1])
    growth = {
        mode: {
            "wall": ratio(figures[largest][mode]["wall_s"], figures[smallest][mode]["wall_s"]),
            "peak_rss": ratio(figures[largest][mode]["peak_rss_mb"], figures[smallest][mode]["peak_rss_mb"]),
        }
        for mode in figures[smallest]
    }
    return {"shard_rows": shard_rows, "by_corpus_shards": figures, "growth": growth}


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 000 rows, for smoke runs")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument(
        "--no-check", action="store_true", help="skip comparing every output with the pre-issue-18 build (untimed)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, alternating; medians compared")
    parser.add_argument(
        "--corpus-shards", type=int, nargs="+", default=[10, 200], help="corpus sizes (shards) a new shard lands on"
    )
    parser.add_argument("--shard-rows", type=int, default=1000, help="utterances per shard (per_new_shard)")
    parser.add_argument("--measure", nargs=2, metavar=("MODE", "ROOT"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--warmup-rows", type=int, default=10_000, help="both builds run once on this many rows first, untimed"
    )
    args = parser.parse_args(argv)
    if args.quick and not args.measure:
        args.rows, args.repeats = 50_000, 1
        args.corpus_shards, args.shard_rows = [2, 8], 200
    return args


def time_builds(utterances, flac, args: argparse.Namespace) -> dict:
    """polars and the pandas baseline in turn, ``--repeats`` times, after a small untimed run of each:
    one-time costs (polars' thread pool and regex compiles, DuckDB's first connection, pandas' first
    apply) are paid there, so the figure is per-row throughput."""
    if args.warmup_rows:
        run_polars(utterances.slice(0, args.warmup_rows), flac.slice(0, args.warmup_rows))
        run_pandas_baseline(utterances.slice(0, args.warmup_rows), flac.slice(0, args.warmup_rows))
    polars_runs, pandas_runs = [], []
    for _ in range(args.repeats):
        seconds, build = timed_call(lambda: run_polars(utterances, flac))
        polars_runs.append(seconds)
        progress(f"polars: {seconds:.2f} s, train {build.train.height}, removed {build.removed.height}")
        seconds, baseline_df = timed_call(lambda: run_pandas_baseline(utterances, flac))
        pandas_runs.append(seconds)
        progress(f"pandas (baseline): {seconds:.2f} s, {len(baseline_df)} rows")
    return {"polars": polars_runs, "pandas": pandas_runs, "build": build, "baseline_df": baseline_df}


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    if args.measure:
        measure_child(*args.measure)
        leave_measured()
    with stdout_to_stderr():
        import pandas  # noqa: F401  imported before timing: to_pandas would otherwise pay it
        import polars  # noqa: F401

        import speechdata.asr.manifest  # noqa: F401  (DuckDB, polars)

        utterances, flac = synthetic_inputs(args.rows)
        progress(
            f"{args.rows} rows, {len(set(utterances['text'].to_pylist()[:100_000]))} distinct texts in the first 100k"
        )
        runs = time_builds(utterances, flac, args)
        build = runs["build"]
        same_outputs, previous_s = None, None
        if not args.no_check:
            same_outputs, previous_s = same_outputs_as_reference(utterances, flac, build)
        progress(f"same outputs as the pre-issue-18 build: {same_outputs} (which took {previous_s} s)")
        new_shard = per_new_shard(args.corpus_shards, args.shard_rows)
    polars_s, pandas_s = statistics.median(runs["polars"]), statistics.median(runs["pandas"])
    speedup = ratio(pandas_s, polars_s)
    emit(
        "asr_manifest",
        {
            "quick": args.quick,
            "rows": args.rows,
            "repeats": args.repeats,
            "warmup_rows": args.warmup_rows,
            "target_ratio": TARGET_RATIO,
            "corpus_shards": args.corpus_shards,
            "shard_rows": args.shard_rows,
        },
        {
            "polars_seconds": round(polars_s, 3),
            "pandas_baseline_seconds": round(pandas_s, 3),
            "polars_seconds_each": [round(x, 3) for x in runs["polars"]],
            "pandas_baseline_seconds_each": [round(x, 3) for x in runs["pandas"]],
            "ratio_pandas_over_polars": speedup,
            "meets_target": bool(speedup and speedup >= TARGET_RATIO),
            "polars_rows_per_second": round(args.rows / polars_s),
            "rows_kept_polars": build.train.height + build.validation.height,
            "rows_kept_pandas_baseline": len(runs["baseline_df"]),
            "polars_removed_by_reason": build.removed_by_reason,
            "same_outputs_as_reference": same_outputs,
            # The pre-issue-18 build on the same rows, run last: before and after in one run.
            "previous_build_seconds": round(previous_s, 3) if previous_s else None,
            "per_new_shard": new_shard,
        },
    )


if __name__ == "__main__":
    main()
