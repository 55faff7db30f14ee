"""Catalog queries in DuckDB over the shard manifests, against pandas over one CSV manifest.

Why: the original publishing script keeps its manifest as a CSV and answers every question with
``pd.read_csv`` and then a pandas groupby or boolean filter; the catalog answers the same questions
with DuckDB over the per-shard parquet manifests. This writes ``--rows`` synthetic manifest rows
(the manifest schema plus an extra column that differs between even and odd shards, like landed
metadata does), split over ``--shards`` manifests in a temporary data root, and the same rows as one
CSV file, refreshes the catalog (timed once), then times in one process, wall-clock
(``time.perf_counter``):

* ``hours_per_language``: DuckDB runs the named query of that name over the ``samples`` view
  (a full scan of every manifest); pandas reads the CSV and groups by language (samples, hours,
  mean alignment score). The summary table the refresh wrote is timed too;
* ``filtered_selection``: ``select_samples(languages=[lang], min_alignment_score=s,
  min_duration_s=a, max_duration_s=b)`` (values bound as ``?``, all columns, ordered by shard and
  key); pandas reads the CSV, filters with a boolean mask and sorts the same way.

The summary table ``hours_by_language`` answers the first question without a scan; its read time
and ratio are reported too, but the headline ratio is the live scan's.

The pandas figures include ``read_csv`` because that is what the baseline does for each question;
``pandas_in_memory_seconds`` (the groupby or filter on an already-loaded frame) is reported
beside them, so the ratio's source is plain: most of it is CSV parsing against columnar parquet.
DuckDB uses every core, pandas one. Figures are medians of ``--repeats`` runs (the first DuckDB
call is reported separately); both sides are checked to return the same answer.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv

from benchmarks.report import Timing, emit, progress, ratio, stdout_to_stderr, timed, timed_call
from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.catalog.queries import NAMED_QUERIES, run_query, select_samples
from speechdata.catalog.views import CATALOG_FILE, refresh_catalog
from speechdata.io.storage import DataRoot

LANGUAGES = ["en", "de", "fr", "es", "it", "pt", "nl", "pl", "sv", "fi"]
COUNTRIES = [
    "us",
    "gb",
    "de",
    "at",
    "fr",
    "be",
    "es",
    "mx",
    "it",
    "br",
    "pt",
    "nl",
    "pl",
    "se",
    "fi",
    "ca",
    "au",
    "in",
    "ie",
    "ch",
]
FILTER = {"language": "en", "min_alignment_score": -2.5, "min_duration_s": 2.0, "max_duration_s": 15.0}
TARGET_RATIO = 100.0


def shard_manifest(rng: np.random.Generator, shard: str, rows: int, sentences: np.ndarray, index: int) -> pa.Table:
    """One shard's manifest: 256 samples per tar, random languages, durations and scores."""
    n = np.arange(rows)
    duration_s = np.round(rng.gamma(2.0, 3.0, rows) + 0.3, 3)
    columns = {
        "key": [f"{shard}_utt{i:07d}" for i in n],
        "shard": pa.array([shard] * rows, pa.string()),
        "tar_url": [f"bridge/{shard}-{t:06d}.tar" for t in n // 256],
        "offset": (n % 256) * 600_000,
        "size": rng.integers(100_000, 600_000, rows),
        "duration_s": duration_s,
        "n_frames": np.ceil(duration_s * 12.5).astype(np.int32),
        "n_tokens": rng.integers(1, 200, rows, dtype=np.int32),
        "language": np.array(LANGUAGES)[rng.integers(0, len(LANGUAGES), rows)],
        "country": np.array(COUNTRIES)[rng.integers(0, len(COUNTRIES), rows)],
        "source": pa.array(["synthetic"] * rows, pa.string()),
        "text": sentences[rng.integers(0, len(sentences), rows)],
        "text_source": pa.array(["landed"] * rows, pa.string()),
        "asr_confidence": pa.nulls(rows, pa.float32()),
        "alignment_score": (-rng.gamma(2.0, 0.8, rows)).astype(np.float32),
        "zero_duration_token_share": rng.random(rows, dtype=np.float32) * 0.1,
        "clipped_share": np.zeros(rows, dtype=np.float32),
    }
    # Landed extra columns ride in the one ``extra`` JSON field; shards differ in which they carry.
    if index % 2 == 0:
        columns["extra"] = [f'{{"snr_db": {v}}}' for v in np.round(rng.normal(25.0, 8.0, rows), 2)]
    else:
        columns["extra"] = [f'{{"speaker": "spk{v}"}}' for v in rng.integers(0, 5000, rows)]
    return pa.table(columns, schema=MANIFEST_COLUMNS)


def build_data(root: DataRoot, csv_path: str, rows: int, shards: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = np.array(
        ["the", "speech", "data", "model", "of", "a", "river", "city", "green", "seven", "quietly", "train"]
    )
    sentences = np.array([" ".join(rng.choice(words, rng.integers(3, 14))) for _ in range(2000)])
    per_shard = np.full(shards, rows // shards)
    per_shard[: rows % shards] += 1
    tables = []
    for index, count in enumerate(per_shard):
        shard = f"shard-{index:05d}"
        table = shard_manifest(rng, shard, int(count), sentences, index)
        root.write_parquet(manifest_path(shard), table)
        tables.append(table)
    # The baseline's single CSV: every row, the union of the shards' columns (empty where absent).
    pacsv.write_csv(pa.concat_tables(tables, promote_options="default"), csv_path)


def pandas_hours_per_language(frame: pd.DataFrame) -> pd.DataFrame:
    grouped = frame.groupby("language", dropna=False).agg(
        samples=("key", "size"),
        duration_s=("duration_s", "sum"),
        mean_alignment_score=("alignment_score", "mean"),
    )
    grouped["hours"] = grouped.pop("duration_s") / 3600.0
    return grouped.sort_values("hours", ascending=False)


def pandas_filter(frame: pd.DataFrame) -> pd.DataFrame:
    mask = (
        (frame["language"] == FILTER["language"])
        & (frame["alignment_score"] >= FILTER["min_alignment_score"])
        & frame["duration_s"].between(FILTER["min_duration_s"], FILTER["max_duration_s"])
    )
    return frame[mask].sort_values(["shard", "key"])


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 000 rows, for smoke runs")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5, help="DuckDB runs per query (pandas: --pandas-repeats)")
    parser.add_argument("--pandas-repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.rows = 50_000
    return args


def measure_duckdb(root: DataRoot, repeats: int) -> dict:
    """The catalog refreshed from the manifests, then each query ``repeats`` times."""
    connection = duckdb.connect(root.path(CATALOG_FILE))
    refresh_s, summary = timed_call(lambda: refresh_catalog(connection, root.url))
    measured = {
        "refresh_s": refresh_s,
        "summary": summary,
        "hours": timed(lambda: run_query(connection, NAMED_QUERIES["hours_per_language"]), repeats),
        "summary_table": timed(lambda: run_query(connection, "SELECT * FROM hours_by_language"), repeats),
        "filter": timed(
            lambda: select_samples(
                connection,
                languages=[FILTER["language"]],
                min_alignment_score=FILTER["min_alignment_score"],
                min_duration_s=FILTER["min_duration_s"],
                max_duration_s=FILTER["max_duration_s"],
            ),
            repeats,
        ),
    }
    connection.close()
    return measured


def measure_pandas(csv_path: str, repeats: int) -> dict:
    """The same two queries on the CSV with pandas: read each time, and on a frame already in memory."""
    from_csv = {
        "hours": timed(lambda: pandas_hours_per_language(pd.read_csv(csv_path)), repeats),
        "filter": timed(lambda: pandas_filter(pd.read_csv(csv_path)), repeats),
    }
    frame = pd.read_csv(csv_path)
    return {
        **from_csv,
        "hours_in_memory": timed(lambda: pandas_hours_per_language(frame), repeats),
        "filter_in_memory": timed(lambda: pandas_filter(frame), repeats),
    }


def agreement(duck: dict, pandas: dict) -> dict:
    """Whether DuckDB and pandas gave the same answers."""
    duck_by_language = {r["language"]: r for r in duck["hours"].result.to_pylist()}
    pandas_hours = pandas["hours"].result
    return {
        "hours_diff": max(abs(duck_by_language[lang]["hours"] - row["hours"]) for lang, row in pandas_hours.iterrows()),
        "samples_agree": all(
            duck_by_language[lang]["samples"] == row["samples"] for lang, row in pandas_hours.iterrows()
        ),
        "selection_agrees": duck["filter"].result.column("key").to_pylist() == pandas["filter"].result["key"].tolist(),
    }


def figure(duck: Timing, pandas: Timing, in_memory: Timing, **extra) -> dict:
    speedup = ratio(pandas.median_s, duck.median_s)
    return {
        "duckdb_seconds": round(duck.median_s, 5),
        "duckdb_first_call_seconds": round(duck.first_s, 5),
        "pandas_seconds": round(pandas.median_s, 4),
        "pandas_in_memory_seconds": round(in_memory.median_s, 4),
        "ratio_pandas_over_duckdb": speedup,
        "meets_target": bool(speedup and speedup >= TARGET_RATIO),
        **extra,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    load_before = os.getloadavg()[0]
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-catalog-") as tmp:
        root = DataRoot(os.path.join(tmp, "data"))
        csv_path = os.path.join(tmp, "manifest.csv")
        build_s, _ = timed_call(lambda: build_data(root, csv_path, args.rows, args.shards))
        progress(f"{args.rows} rows in {args.shards} manifests + CSV written in {build_s:.1f} s")
        parquet_bytes = sum(root.fs.du(root.path("manifests"), total=False).values())
        csv_bytes = os.path.getsize(csv_path)
        duck = measure_duckdb(root, args.repeats)
        progress(f"duckdb: hours {duck['hours'].median_s:.4f} s, selection {duck['filter'].median_s:.4f} s")
        pandas = measure_pandas(csv_path, args.pandas_repeats)
        progress(f"pandas: hours {pandas['hours'].median_s:.3f} s, selection {pandas['filter'].median_s:.3f} s")
        agree = agreement(duck, pandas)
    summary, selected = duck["summary"], duck["filter"].result
    emit(
        "catalog",
        {
            "quick": args.quick,
            "rows": args.rows,
            "shards": args.shards,
            "repeats": args.repeats,
            "pandas_repeats": args.pandas_repeats,
            "filter": FILTER,
            "target_ratio": TARGET_RATIO,
        },
        {
            "load_average_1m_before": round(load_before, 2),
            "refresh_seconds": round(duck["refresh_s"], 4),
            "catalog": {"shards": summary.shards, "samples": summary.samples, "hours": round(summary.hours, 2)},
            "parquet_mb": round(parquet_bytes / 1e6, 1),
            "csv_mb": round(csv_bytes / 1e6, 1),
            "hours_per_language": figure(
                duck["hours"],
                pandas["hours"],
                pandas["hours_in_memory"],
                summary_table_seconds=round(duck["summary_table"].median_s, 5),
                ratio_pandas_over_summary_table=ratio(pandas["hours"].median_s, duck["summary_table"].median_s),
                max_hours_difference=float(agree["hours_diff"]),
                samples_agree=agree["samples_agree"],
            ),
            "filtered_selection": figure(
                duck["filter"],
                pandas["filter"],
                pandas["filter_in_memory"],
                rows_selected=selected.num_rows,
                pandas_rows_selected=len(pandas["filter"].result),
                same_rows=agree["selection_agrees"],
            ),
        },
    )


if __name__ == "__main__":
    main()
