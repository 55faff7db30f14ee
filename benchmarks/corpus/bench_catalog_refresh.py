r"""``manifest_catalog``'s refresh (``refresh_catalog``) over many small shard manifests: full
against incremental.

Why: the catalog asset re-runs whenever any shard's manifest is materialized. A full refresh reads
every manifest, after every shard, so its cost grows with the shard count; the incremental one
(the default) reads only the manifests that changed since the last refresh and sums the stored
per-manifest aggregates.

For each ``--sizes`` N: N shards in a temporary data root, each with a manifest of ``--rows``
samples (``bench_catalog``'s synthetic manifest, two alternating extra columns) and what the
per-product accounting reads besides: landing metadata (the samples + 2 rejected utterances), an
ASR FLAC index, an HF utterance index and an alignments rejects ledger (``--manifests-only``: the
manifests alone, as before); then, wall-clock, median of ``--repeats``:

* ``full``: ``refresh_catalog(full=True)`` into a fresh DuckDB file (list the files, read every
  manifest's aggregates, create the views, sum the totals);
* ``incremental``: one more shard's manifest is written, then ``refresh_catalog`` on the catalog
  the full refresh left (it reads that one manifest);
* ``unchanged``: ``refresh_catalog`` again with nothing new (the listing and the sums alone);
* ``accounting_views`` against ``accounting_state``: the two accounting tables ``manifest_catalog``
  shows after every refresh (``shard_accounting`` and ``rejects_by_product``), from the views over
  the live files (what the asset queried before) and from the per-shard state the refresh keeps
  (what it queries now); ``asset_before`` / ``asset_now``: an incremental refresh plus each, and
  their ratio ``asset_before_over_now``;
* ``in_place`` against ``swapped``: an incremental refresh (one more shard) on a connection to one
  catalog file holding views and state (the refresh holds the file's write lock, so a reader would
  make it wait), and as the asset runs it (``refresh_catalog_file``: the state file updated in place,
  the small views file copied, checkpointed and ``os.replace``\ d over the catalog), and
  ``swap_overhead_s``, their difference; ``catalog_mb``: the size of the views file readers open;
* ``query_plain`` against ``query_read_only``: ``SELECT count(*), sum(duration_s) FROM samples``
  (every manifest's footer and two columns) on a plain read-only connection and on the CLI's
  locked-down one, whose views read through the write-less filesystem
  (:mod:`speechdata.catalog.readonly`).

Reported per N: seconds and ms per manifest of each, and ``full_over_incremental`` (the speedup);
``growth`` of each = (seconds at the largest N / seconds at the smallest) / (largest N / smallest
N), 1 = linear, above 1 = worse than linear.

``per_new_shard``: what ``manifest_catalog`` costs when one shard lands in a corpus of N shards
(``--new-shard-sizes``, each shard ``--new-shard-rows`` utterances with its manifest, landing
metadata, product indexes, a rejects ledger and its quality signals, decisions and near-duplicate
list, as the stages write them): the asset's refresh (``refresh_catalog_file`` with the tables the
asset shows: hours per language, accounting, rejects by product, the quality histograms and the
hours lost) after one more shard, in a fresh subprocess each time, its wall seconds and peak RSS
(``VmHWM``; ``refresh_rss_mb`` is the peak less the process's RSS after its imports), and the
catalog files' sizes. ``growth`` = the figure at the largest N / at the smallest: 1 = a new shard
costs the same whatever the corpus. ``--baseline DIR`` (a folder holding an earlier ``speechdata``
package, e.g. ``git archive <commit> speechdata | tar -x -C DIR``) measures that code the same
way, on the same corpus, beside this one (its histograms binned in Python, as its asset did).
``scoped``: this code told which shard is new (as the asset tells it the shards materialized
since its last refresh), so it stats that shard's files instead of listing the root;
``listed_over_scoped`` per N: the listing refresh's wall over the scoped one's. With ``--baseline``,
``baseline_scoped`` is the earlier code told which shard is new, and
``baseline_scoped_with_periodic_listing_s`` its wall with its full listing of the root once in 100
refreshes spread over them (this code checks a few known shards per refresh instead).

``--first-import N``: instead of the above, the first import (a full refresh of a new state) of a
corpus of N built shards (``write_corpus_shard``, ``--new-shard-rows`` utterances each; kept in
``--corpus DIR`` when given, so a second run reuses it) in a fresh interpreter per
``--memory-limits`` entry (``SPEECHDATA_CATALOG_MEMORY_LIMIT``; ``LIMIT/THREADS`` sets
``SPEECHDATA_CATALOG_THREADS`` too), this code and with ``--baseline`` the earlier one (under
``--baseline-limit``, default none: DuckDB's own), in turn: wall seconds and peak RSS of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from benchmarks.corpus.bench_catalog import shard_manifest
from benchmarks.report import emit, leave_measured, peak_rss_mb, progress, ratio, stdout_to_stderr
from benchmarks.report import timed_call as timed
from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.bridge.manifest import manifest_path
from speechdata.catalog.accounting_state import REJECTS_BY_PRODUCT_FROM_STATE, SHARD_ACCOUNTING_FROM_STATE
from speechdata.catalog.database_file import refresh_catalog_file
from speechdata.catalog.queries import NAMED_QUERIES, run_query
from speechdata.catalog.reading import open_catalog_read_only
from speechdata.catalog.views import refresh_catalog
from speechdata.io import layout
from speechdata.io.duckdb_object_store import enable_data_root_reads
from speechdata.io.storage import DataRoot


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke runs")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000])
    parser.add_argument("--rows", type=int, default=20, help="samples per manifest")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--manifests-only", action="store_true", help="no landing metadata, indexes or ledgers")
    parser.add_argument("--new-shard-sizes", type=int, nargs="+", default=[100, 1_000], help="corpus sizes, shards")
    parser.add_argument("--new-shard-rows", type=int, default=1_000, help="utterances per shard (per_new_shard)")
    parser.add_argument("--baseline", metavar="DIR", help="a folder with an earlier speechdata package to compare")
    parser.add_argument("--first-import", type=int, metavar="SHARDS", help="measure a first import at this size")
    parser.add_argument("--memory-limits", default="none,1GB", help="with --first-import: LIMIT[/THREADS],...")
    parser.add_argument("--corpus", metavar="DIR", help="with --first-import: where the corpus is built and kept")
    parser.add_argument(
        "--baseline-limit", default="none", help="with --first-import: the baseline's LIMIT[/THREADS] (none: DuckDB's)"
    )
    parser.add_argument("--measure", nargs=2, metavar=("DATABASE", "ROOT"), help=argparse.SUPPRESS)
    parser.add_argument("--changed-shards", help=argparse.SUPPRESS)  # with --measure: a JSON list
    args = parser.parse_args(argv)
    if args.measure:
        _measure_refresh(*args.measure, json.loads(args.changed_shards) if args.changed_shards else None)
        leave_measured()
    if args.first_import:
        with stdout_to_stderr():
            figures = first_import(
                args.first_import,
                args.new_shard_rows,
                args.memory_limits,
                args.corpus,
                args.baseline,
                args.baseline_limit,
            )
        emit("catalog_first_import", {"shards": args.first_import, "rows": args.new_shard_rows}, figures)
        return
    if args.quick:
        # Small enough for the smoke test; every path (full, incremental, unchanged, new shard) still runs.
        args.sizes, args.repeats = [10, 40], 1
        args.new_shard_sizes, args.new_shard_rows = [4, 12], 20

    per_size = {}
    with stdout_to_stderr():
        sentences = np.array(["a short synthetic sentence", "another one", "speech data at scale"])
        for n in args.sizes:
            with tempfile.TemporaryDirectory(prefix="bench-catalog-refresh-") as tmp:
                root = DataRoot(os.path.join(tmp, "data"))
                rng = np.random.default_rng(0)

                def add_shard(index: int, rng=rng, root=root) -> None:
                    shard = f"shard-{index:06d}"
                    manifest = shard_manifest(rng, shard, args.rows, sentences, index)
                    root.write_parquet(manifest_path(shard), manifest)
                    if not args.manifests_only:
                        write_accounting_inputs(root, shard, manifest.column("key").to_pylist())

                for index in range(n):
                    add_shard(index)
                added = n + args.repeats
                full, incremental, unchanged, views, state = [], [], [], [], []
                in_place, swapped, query_plain, query_read_only, catalog_mb = [], [], [], [], []
                for repeat in range(args.repeats):
                    connection = duckdb.connect(os.path.join(tmp, f"catalog-{repeat}.duckdb"))
                    full.append(timed(partial(refresh_catalog, connection, root.uri(""), full=True)))
                    # Each repeat adds three shards: one for ``incremental``, one each for ``in_place`` and ``swapped``.
                    assert full[-1][1].manifests_read == n + 3 * repeat
                    add_shard(n + repeat)
                    incremental.append(timed(partial(refresh_catalog, connection, root.uri(""))))
                    assert incremental[-1][1].manifests_read == 1
                    assert incremental[-1][1].samples == (n + 3 * repeat + 1) * args.rows
                    unchanged.append(timed(partial(refresh_catalog, connection, root.uri(""))))
                    assert unchanged[-1][1].manifests_read == 0
                    views.append(timed(partial(accounting_tables, connection, VIEW_QUERIES)))
                    state.append(timed(partial(accounting_tables, connection, STATE_QUERIES)))
                    assert views[-1][1] == state[-1][1]
                    connection.close()

                    database = os.path.join(tmp, f"catalog-{repeat}.duckdb")
                    add_shard(added)
                    added += 1
                    in_place.append(timed(partial(refresh_in_place, database, root)))
                    assert in_place[-1][1].manifests_read == 1
                    # The catalog file as the asset keeps it (views file and state file), brought up to date untimed.
                    published = os.path.join(tmp, f"published-{repeat}", "catalog.duckdb")
                    refresh_catalog_file(published, root)
                    add_shard(added)
                    added += 1
                    swapped.append(
                        timed(lambda published=published, root=root: refresh_catalog_file(published, root).summary)
                    )
                    assert swapped[-1][1].manifests_read == 1
                    catalog_mb.append(os.path.getsize(published) / 2**20)
                    query_plain.append(timed(partial(count_samples_plain, published, root)))
                    query_read_only.append(timed(partial(count_samples_read_only, published, root)))
                    (plain_count, plain_s), (read_only_count, read_only_s) = query_plain[-1][1], query_read_only[-1][1]
                    assert plain_count == read_only_count and abs(plain_s - read_only_s) < 1e-6 * plain_s
                figures = {}
                for name, runs in (
                    ("full", full),
                    ("incremental", incremental),
                    ("unchanged", unchanged),
                    ("accounting_views", views),
                    ("accounting_state", state),
                    ("in_place", in_place),
                    ("swapped", swapped),
                    ("query_plain", query_plain),
                    ("query_read_only", query_read_only),
                ):
                    median = statistics.median(seconds for seconds, _ in runs)
                    figures[name] = {"seconds": round(median, 4), "ms_per_manifest": round(1000 * median / n, 4)}
                figures["full_over_incremental"] = ratio(figures["full"]["seconds"], figures["incremental"]["seconds"])
                figures["asset_before_s"] = round(
                    figures["incremental"]["seconds"] + figures["accounting_views"]["seconds"], 4
                )
                figures["asset_now_s"] = round(
                    figures["incremental"]["seconds"] + figures["accounting_state"]["seconds"], 4
                )
                figures["asset_before_over_now"] = ratio(figures["asset_before_s"], figures["asset_now_s"])
                figures["swap_overhead_s"] = round(figures["swapped"]["seconds"] - figures["in_place"]["seconds"], 4)
                figures["catalog_mb"] = round(statistics.median(catalog_mb), 2)
                per_size[str(n)] = figures
                progress(f"{n} manifests: {figures}")

    with stdout_to_stderr():
        new_shard = per_new_shard(args.new_shard_sizes, args.new_shard_rows, args.repeats, args.baseline)
    small, large = str(min(args.sizes)), str(max(args.sizes))
    emit(
        "catalog_refresh",
        {
            "quick": args.quick,
            "sizes": args.sizes,
            "rows": args.rows,
            "repeats": args.repeats,
            "manifests_only": args.manifests_only,
            "new_shard_sizes": args.new_shard_sizes,
            "new_shard_rows": args.new_shard_rows,
            "baseline": args.baseline,
        },
        {
            "per_size": per_size,
            "growth": {
                name: ratio(
                    per_size[large][name]["seconds"] / per_size[small][name]["seconds"], int(large) / int(small)
                )
                for name in ("full", "incremental", "unchanged", "accounting_views", "accounting_state")
            },
            "per_new_shard": new_shard,
        },
    )


VIEW_QUERIES = (NAMED_QUERIES["shard_accounting"], NAMED_QUERIES["rejects_by_product"])
STATE_QUERIES = (SHARD_ACCOUNTING_FROM_STATE, REJECTS_BY_PRODUCT_FROM_STATE)


def write_accounting_inputs(root: DataRoot, shard: str, keys: list[str]) -> None:
    """What a built shard holds besides its manifest: 2 utterances rejected by alignment, two products."""
    rejected = [f"{shard}_rejected-{i}" for i in range(2)]
    landed = keys + rejected
    root.write_parquet(
        layout.landing_metadata(shard), pa.table({"utt_id": landed, "audio_path": [f"{u}.wav" for u in landed]})
    )
    root.write_parquet(layout.asr_flac_index(shard), pa.table({"utt_id": keys}))
    root.write_parquet(layout.utterance_index(shard), pa.table({"utt_id": landed}))
    ledger = rejects_table(Reject(u, "alignments", "no_alignment", "synthetic") for u in rejected)
    root.write_parquet(layout.rejects(shard, "alignments"), ledger)


def accounting_tables(connection, queries) -> list[list[dict]]:
    return [run_query(connection, sql).to_pylist() for sql in queries]


def refresh_in_place(database: str, root: DataRoot):
    with duckdb.connect(database) as connection:
        summary = refresh_catalog(connection, root.uri(""))
        connection.execute("CHECKPOINT")
    return summary


SAMPLES_QUERY = "SELECT count(*), sum(duration_s) FROM samples"


def count_samples_plain(database: str, root: DataRoot):
    with duckdb.connect(database, read_only=True) as connection:
        enable_data_root_reads(connection, root)
        return connection.execute(SAMPLES_QUERY).fetchone()


def count_samples_read_only(database: str, root: DataRoot):
    with open_catalog_read_only(database, root) as connection:
        return connection.execute(SAMPLES_QUERY).fetchone()


REPO_ROOT = Path(__file__).resolve().parents[2]
CODE = ("new", "scoped", "baseline")
SCOPED = "scoped"
BASELINE_SCOPED = "baseline_scoped"
SCOPED_CODES = (SCOPED, BASELINE_SCOPED)
BASELINE_FULL_LISTING_EVERY = 100
"""The earlier code's scoped refresh listed the whole root once in this many refreshes."""
"""This code told which shard changed (``shards=[the new one]``, as the asset passes the shards
materialized since its last refresh): it stats that shard's files alone instead of listing the root."""


def per_new_shard(sizes: list[int], rows: int, repeats: int, baseline: str | None) -> dict:
    """One shard more in corpora of ``sizes`` shards: the asset's refresh, wall and peak RSS, per code
    (``new``: listing the root; ``scoped``: naming the new shard; ``baseline``: the earlier code)."""
    codes = {"new": str(REPO_ROOT), SCOPED: str(REPO_ROOT)}
    if baseline:
        codes["baseline"] = f"{os.path.abspath(baseline)}{os.pathsep}{REPO_ROOT}"
        codes[BASELINE_SCOPED] = codes["baseline"]
    figures: dict = {code: {} for code in codes}
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-catalog-new-shard-") as tmp:
            root = DataRoot(os.path.join(tmp, "data"))
            rng = np.random.default_rng(1)
            for index in range(n):
                write_corpus_shard(root, rng, index, rows)
            databases = {code: os.path.join(tmp, code, "catalog.duckdb") for code in codes}
            for code, path in codes.items():
                # The corpus before: a full refresh (the first refresh of a state lists the root, told or not).
                measure_refresh_subprocess(databases[code], root, path, [] if code in SCOPED_CODES else None)
            runs: dict = {code: [] for code in codes}
            for repeat in range(repeats):
                shard = write_corpus_shard(root, rng, n + repeat, rows)
                for code, path in codes.items():
                    changed = [shard] if code in SCOPED_CODES else None
                    runs[code].append(measure_refresh_subprocess(databases[code], root, path, changed))
            for code in codes:
                folder = os.path.dirname(databases[code])
                figures[code][str(n)] = {
                    "wall_s": round(statistics.median(r["wall_s"] for r in runs[code]), 4),
                    "peak_rss_mb": round(statistics.median(r["peak_rss_mb"] for r in runs[code]), 1),
                    "refresh_rss_mb": round(statistics.median(r["refresh_rss_mb"] for r in runs[code]), 1),
                    "files_mb": {
                        name: round(os.path.getsize(os.path.join(folder, name)) / 2**20, 3)
                        for name in sorted(os.listdir(folder))
                        if name.endswith((".duckdb", ".state"))
                    },
                }
                progress(f"per new shard, {code} code, {n} shards of {rows}: {figures[code][str(n)]}")
    small, large = str(min(sizes)), str(max(sizes))
    growth = {
        code: {
            name: ratio(figures[code][large][name], figures[code][small][name])
            for name in ("wall_s", "peak_rss_mb", "refresh_rss_mb")
        }
        for code in codes
    }
    result = {**figures, "growth": growth}
    result["listed_over_scoped"] = {
        n: ratio(figures["new"][n]["wall_s"], figures[SCOPED][n]["wall_s"]) for n in figures["new"]
    }
    if baseline:
        # What the earlier scoped refresh cost per refresh with its periodic full listing spread out.
        result["baseline_scoped_with_periodic_listing_s"] = {
            n: round(
                figures[BASELINE_SCOPED][n]["wall_s"]
                + (figures["baseline"][n]["wall_s"] - figures[BASELINE_SCOPED][n]["wall_s"])
                / BASELINE_FULL_LISTING_EVERY,
                4,
            )
            for n in figures["baseline"]
        }
        result["baseline_over_new_at_largest"] = {
            name: ratio(figures["baseline"][large][name], figures["new"][large][name])
            for name in ("wall_s", "peak_rss_mb")
        }
    return result


def first_import(
    shards: int, rows: int, limits: str, corpus: str | None, baseline: str | None, baseline_limit: str = "none"
) -> dict:
    """The first import of ``shards`` built shards per memory limit (and the ``baseline`` code's,
    under ``baseline_limit``)."""
    with tempfile.TemporaryDirectory(prefix="bench-catalog-first-import-") as tmp:
        root = DataRoot(os.path.join(corpus or tmp, "data"))
        built = root.exists(manifest_path(f"shard-{shards - 1:06d}"))
        if not built:
            rng = np.random.default_rng(1)
            for index in range(shards):
                write_corpus_shard(root, rng, index, rows)
        base_limit, _, base_threads = baseline_limit.partition("/")
        baseline_path = f"{os.path.abspath(baseline)}{os.pathsep}{REPO_ROOT}" if baseline else ""
        runs = [(f"baseline {baseline_limit}", baseline_path, base_limit, base_threads)] if baseline else []
        for entry in limits.split(","):
            limit, _, threads = entry.partition("/")
            runs.append((f"limit {entry}", str(REPO_ROOT), limit, threads))
        figures = {}
        for name, path, limit, threads in runs:
            database = os.path.join(tmp, name.replace(" ", "-").replace("/", "-"), "catalog.duckdb")
            told = {"SPEECHDATA_CATALOG_MEMORY_LIMIT": limit, "SPEECHDATA_CATALOG_THREADS": threads}
            saved = {key: os.environ.get(key) for key in told}
            os.environ.update(told)
            try:
                measured = measure_refresh_subprocess(database, root, path)
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key)
                    else:
                        os.environ[key] = value
            figures[name] = {key: round(value, 2) for key, value in measured.items()}
            progress(f"first import of {shards} shards, {name}: {figures[name]}")
    return figures


def write_corpus_shard(root: DataRoot, rng: np.random.Generator, index: int, rows: int) -> str:
    """One built shard: manifest, accounting inputs and the quality stages' three files; its id."""
    shard = f"shard-{index:06d}"
    sentences = np.array(["a short synthetic sentence", "another one", "speech data at scale"])
    manifest = shard_manifest(rng, shard, rows, sentences, index)
    root.write_parquet(manifest_path(shard), manifest)
    keys = manifest.column("key").to_pylist()
    write_accounting_inputs(root, shard, keys)
    from speechdata.quality import paths as quality_paths
    from speechdata.quality.near_duplicates import NEAR_DUPLICATES_SCHEMA
    from speechdata.quality.schema import QUALITY_DECISIONS_SCHEMA, QUALITY_SIGNALS_SCHEMA

    values = {
        "utt_id": keys,
        "language": manifest.column("language").to_pylist(),
        "has_audio": rng.random(rows) > 0.02,
        "duration_s": manifest.column("duration_s").to_numpy(),
        "snr_db": np.clip(rng.normal(25.0, 10.0, rows), -20, 100),
        "bandwidth_hz": rng.choice([3_400.0, 7_000.0, 8_000.0, 11_025.0], rows) - rng.random(rows) * 400,
        "speech_share": rng.random(rows),
        "cer": np.where(rng.random(rows) < 0.1, np.nan, rng.gamma(1.0, 0.08, rows)),
    }
    root.write_parquet(quality_paths.quality_signals(shard), _table(QUALITY_SIGNALS_SCHEMA, rows, values, rng))
    products = ("bridge", "asr")
    decisions = {
        "utt_id": [k for k in keys for _ in products],
        "product": [p for _ in keys for p in products],
        "reason": [("no_speech" if r < 0.05 else None) for r in rng.random(rows * len(products))],
        "policy_sha256": ["0" * 64] * (rows * len(products)),
    }
    root.write_parquet(
        quality_paths.quality_decisions(shard), _table(QUALITY_DECISIONS_SCHEMA, rows * len(products), decisions, rng)
    )
    copies = keys[: max(1, rows // 100)]
    near = {"utt_id": copies, "representative_shard": [shard] * len(copies), "kind": ["exact_audio"] * len(copies)}
    root.write_parquet(quality_paths.near_duplicates(shard), _table(NEAR_DUPLICATES_SCHEMA, len(copies), near, rng))
    return shard


def _table(schema: pa.Schema, rows: int, given: dict, rng: np.random.Generator) -> pa.Table:
    """Rows of ``schema``: the ``given`` columns, the others filled by type."""
    columns = []
    for f in schema:
        if f.name in given:
            columns.append(pa.array(given[f.name], f.type, from_pandas=True))
        elif pa.types.is_floating(f.type):
            columns.append(pa.array(rng.random(rows), f.type))
        elif pa.types.is_integer(f.type):
            columns.append(pa.array(rng.integers(0, 100, rows), f.type))
        elif pa.types.is_boolean(f.type):
            columns.append(pa.array(rng.random(rows) > 0.5, f.type))
        elif pa.types.is_fixed_size_list(f.type) or pa.types.is_list(f.type):
            columns.append(pa.nulls(rows, f.type))
        else:
            columns.append(pa.array(["x"] * rows, f.type))
    return pa.Table.from_arrays(columns, schema=schema)


def measure_refresh_subprocess(
    database: str, root: DataRoot, pythonpath: str, changed_shards: list[str] | None = None
) -> dict:
    """The asset's refresh in a fresh interpreter running the code on ``pythonpath`` (told which
    shards changed when ``changed_shards`` is given)."""
    os.makedirs(os.path.dirname(database), exist_ok=True)
    told = [] if changed_shards is None else ["--changed-shards", json.dumps(changed_shards)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.corpus.bench_catalog_refresh", "--measure", database, root.root, *told],
        # Not the repository: ``-m`` puts the working folder first on the path, before ``pythonpath``.
        cwd=os.path.dirname(database),
        env={**os.environ, "PYTHONPATH": pythonpath},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"the refresh subprocess failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _measure_refresh(database: str, root_dir: str, changed_shards: list[str] | None = None) -> None:
    """The subprocess: ``manifest_catalog``'s refresh and the tables it shows, with whichever
    ``speechdata`` is first on the path; prints its wall seconds and peak RSS as JSON."""
    root = DataRoot(root_dir)
    try:  # this code: every table from the refresh's state, histograms binned by DuckDB
        from speechdata.catalog.database_file import REFRESH_SUMMARY_QUERIES as queries

        bin_in_python = False
    except ImportError:  # an earlier one: the asset's queries as it asked them, histograms binned in Python
        from speechdata.catalog.accounting_state import REJECTS_BY_PRODUCT_FROM_STATE, SHARD_ACCOUNTING_FROM_STATE
        from speechdata.catalog.incremental import HOURS_PER_LANGUAGE_FROM_STATE
        from speechdata.catalog.quality import QUALITY_NAMED_QUERIES, SIGNALS_PER_LANGUAGE

        lost = "hours_lost_per_reason_per_language"
        queries = {
            "by_language": HOURS_PER_LANGUAGE_FROM_STATE,
            "by_product": REJECTS_BY_PRODUCT_FROM_STATE,
            "accounting": SHARD_ACCOUNTING_FROM_STATE,
            "signals_per_language": SIGNALS_PER_LANGUAGE,
            lost: QUALITY_NAMED_QUERIES[lost],
        }
        bin_in_python = True
    imported_rss = peak_rss_mb()
    started = time.perf_counter()
    with stdout_to_stderr():
        told = {} if changed_shards is None else {"shards": changed_shards}
        refreshed = refresh_catalog_file(database, root, queries=queries, **told)
        if bin_in_python:
            for row in refreshed.tables["signals_per_language"].to_pylist():
                for values in row.values():
                    if isinstance(values, list):
                        _python_histogram(values)
        else:
            for table in refreshed.tables.values():
                table.to_pylist()
    wall_s = time.perf_counter() - started
    peak = peak_rss_mb()
    print(json.dumps({"wall_s": wall_s, "peak_rss_mb": peak, "refresh_rss_mb": peak - imported_rss}))


def _python_histogram(values: list, bins: int = 10) -> list[int]:
    """What the asset did before (``assets.reporting.markdown_histogram``'s binning), without Dagster."""
    present = [float(v) for v in values if v is not None and v == v]
    if not present:
        return []
    low, high = min(present), max(present)
    step = (high - low) / bins or 1.0
    counts = [0] * bins
    for value in present:
        counts[min(int((value - low) / step), bins - 1)] += 1
    return counts


if __name__ == "__main__":
    main()
