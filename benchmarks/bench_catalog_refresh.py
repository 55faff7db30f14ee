"""``manifest_catalog``'s refresh (``refresh_catalog``) over many small shard manifests: full
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
* ``in_place`` against ``swapped``: an incremental refresh (one more shard) as the asset ran it
  before, on a connection to the catalog file itself (the refresh held the file's write lock, so a
  reader made it wait), and as it runs now (``refresh_catalog_file``: copy the file, refresh the
  copy, checkpoint, ``os.replace`` it over the catalog), and ``swap_overhead_s``, their difference;
  ``catalog_mb``: the file's size;
* ``query_plain`` against ``query_read_only``: ``SELECT count(*), sum(duration_s) FROM samples``
  (every manifest's footer and two columns) on a plain read-only connection and on the CLI's
  locked-down one, whose views read through the write-less filesystem
  (:mod:`speechdata.catalog.readonly`).

Reported per N: seconds and ms per manifest of each, and ``full_over_incremental`` (the speedup);
``growth`` of each = (seconds at the largest N / seconds at the smallest) / (largest N / smallest
N), 1 = linear, above 1 = worse than linear.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from functools import partial

import duckdb
import numpy as np
import pyarrow as pa

from benchmarks.bench_catalog import shard_manifest
from benchmarks.report import emit, progress, ratio, stdout_to_stderr
from speechdata.bridge.manifest import manifest_path
from speechdata.catalog.accounting_state import REJECTS_BY_PRODUCT_FROM_STATE, SHARD_ACCOUNTING_FROM_STATE
from speechdata.catalog.database_file import open_catalog_read_only, refresh_catalog_file
from speechdata.catalog.queries import NAMED_QUERIES, run_query
from speechdata.catalog.views import refresh_catalog
from speechdata.io import layout
from speechdata.io.duckdb_object_store import enable_data_root_reads
from speechdata.io.storage import DataRoot
from speechdata.rejects import Reject, rejects_table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke runs")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000])
    parser.add_argument("--rows", type=int, default=20, help="samples per manifest")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--manifests-only", action="store_true", help="no landing metadata, indexes or ledgers")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = [20, 100], 1

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
                    add_shard(added)
                    added += 1
                    swapped.append(
                        timed(lambda database=database, root=root: refresh_catalog_file(database, root).summary)
                    )
                    assert swapped[-1][1].manifests_read == 1
                    catalog_mb.append(os.path.getsize(database) / 2**20)
                    query_plain.append(timed(partial(count_samples_plain, database, root)))
                    query_read_only.append(timed(partial(count_samples_read_only, database, root)))
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

    small, large = str(min(args.sizes)), str(max(args.sizes))
    emit(
        "catalog_refresh",
        {
            "quick": args.quick,
            "sizes": args.sizes,
            "rows": args.rows,
            "repeats": args.repeats,
            "manifests_only": args.manifests_only,
        },
        {
            "per_size": per_size,
            "growth": {
                name: ratio(
                    per_size[large][name]["seconds"] / per_size[small][name]["seconds"], int(large) / int(small)
                )
                for name in ("full", "incremental", "unchanged", "accounting_views", "accounting_state")
            },
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


def timed(refresh):
    started = time.perf_counter()
    summary = refresh()
    return time.perf_counter() - started, summary


if __name__ == "__main__":
    main()
