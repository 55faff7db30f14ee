"""``manifest_catalog``'s refresh (``refresh_catalog``) over many small shard manifests.

Why: the catalog asset re-runs whenever any shard's manifest is materialized, and each refresh
lists every manifest and recomputes the summary tables over all of them. With small shards (many
manifests) that must stay linear in the number of manifests, or small shards become unaffordable.

For each ``--sizes`` N: N manifests of ``--rows`` samples each (``bench_catalog``'s synthetic
manifest, two alternating extra columns) in a temporary data root, no rejects ledgers; then,
wall-clock, median of ``--repeats``: ``refresh_catalog`` into a fresh DuckDB file (list the files,
create the views, build ``hours_by_language`` / ``hours_by_country`` / ``hours_by_shard``).

Reported per N: seconds and ms per manifest; ``growth`` = (seconds at the largest N / seconds at
the smallest) / (largest N / smallest N), 1 = linear, above 1 = worse than linear.
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
                for index in range(n):
                    shard = f"shard-{index:06d}"
                    root.write_parquet(manifest_path(shard), shard_manifest(rng, shard, args.rows, sentences, index))
                seconds = []
                for repeat in range(args.repeats):
                    connection = duckdb.connect(os.path.join(tmp, f"catalog-{repeat}.duckdb"))
                    started = time.perf_counter()
                    summary = refresh_catalog(connection, root.uri(""))
                    seconds.append(time.perf_counter() - started)
                    connection.close()
                assert summary.manifest_files == n and summary.samples == n * args.rows
                median = statistics.median(seconds)
                per_size[str(n)] = {"seconds": round(median, 3), "ms_per_manifest": round(1000 * median / n, 3)}
                progress(f"{n} manifests: {per_size[str(n)]}")

    small, large = min(args.sizes), max(args.sizes)
    emit(
        "catalog_refresh",
        {"quick": args.quick, "sizes": args.sizes, "rows": args.rows, "repeats": args.repeats},
        {
            "per_size": per_size,
            "growth": ratio(per_size[str(large)]["seconds"] / per_size[str(small)]["seconds"], large / small),
        },
    )


if __name__ == "__main__":
    main()
