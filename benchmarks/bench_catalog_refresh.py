"""``manifest_catalog``'s refresh (``refresh_catalog``) over many small shard manifests: full
against incremental.

Why: the catalog asset re-runs whenever any shard's manifest is materialized. A full refresh reads
every manifest (9 ms each: 3 minutes at 20 000 shards, after every shard); the incremental one
(the default) reads only the manifests that changed since the last refresh and sums the stored
per-manifest aggregates.

For each ``--sizes`` N: N manifests of ``--rows`` samples each (``bench_catalog``'s synthetic
manifest, two alternating extra columns) in a temporary data root, no rejects ledgers; then,
wall-clock, median of ``--repeats``:

* ``full``: ``refresh_catalog(full=True)`` into a fresh DuckDB file (list the files, read every
  manifest's aggregates, create the views, sum the totals);
* ``incremental``: one more shard's manifest is written, then ``refresh_catalog`` on the catalog
  the full refresh left (it reads that one manifest);
* ``unchanged``: ``refresh_catalog`` again with nothing new (the listing and the sums alone).

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

import duckdb
import numpy as np

from benchmarks.bench_catalog import shard_manifest
from benchmarks.report import emit, progress, ratio, stdout_to_stderr
from speechdata.bridge.manifest import manifest_path
from speechdata.catalog.views import refresh_catalog
from speechdata.io.storage import DataRoot


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke runs")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000, 20_000])
    parser.add_argument("--rows", type=int, default=20, help="samples per manifest")
    parser.add_argument("--repeats", type=int, default=2)
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

                def add_shard(index: int) -> None:
                    shard = f"shard-{index:06d}"
                    root.write_parquet(manifest_path(shard), shard_manifest(rng, shard, args.rows, sentences, index))

                for index in range(n):
                    add_shard(index)
                full, incremental, unchanged = [], [], []
                for repeat in range(args.repeats):
                    connection = duckdb.connect(os.path.join(tmp, f"catalog-{repeat}.duckdb"))
                    full.append(timed(lambda: refresh_catalog(connection, root.uri(""), full=True)))
                    assert full[-1][1].manifests_read == n + repeat
                    add_shard(n + repeat)
                    incremental.append(timed(lambda: refresh_catalog(connection, root.uri(""))))
                    assert incremental[-1][1].manifests_read == 1
                    assert incremental[-1][1].samples == (n + repeat + 1) * args.rows
                    unchanged.append(timed(lambda: refresh_catalog(connection, root.uri(""))))
                    assert unchanged[-1][1].manifests_read == 0
                    connection.close()
                figures = {}
                for name, runs in (("full", full), ("incremental", incremental), ("unchanged", unchanged)):
                    median = statistics.median(seconds for seconds, _ in runs)
                    figures[name] = {"seconds": round(median, 4), "ms_per_manifest": round(1000 * median / n, 4)}
                figures["full_over_incremental"] = ratio(figures["full"]["seconds"], figures["incremental"]["seconds"])
                per_size[str(n)] = figures
                progress(f"{n} manifests: {figures}")

    small, large = str(min(args.sizes)), str(max(args.sizes))
    emit(
        "catalog_refresh",
        {"quick": args.quick, "sizes": args.sizes, "rows": args.rows, "repeats": args.repeats},
        {
            "per_size": per_size,
            "growth": {
                name: ratio(
                    per_size[large][name]["seconds"] / per_size[small][name]["seconds"], int(large) / int(small)
                )
                for name in ("full", "incremental", "unchanged")
            },
        },
    )


def timed(refresh):
    started = time.perf_counter()
    summary = refresh()
    return time.perf_counter() - started, summary


if __name__ == "__main__":
    main()
