"""The worst single shard of a run of consecutive new shards: its time and bytes written, with every
due merge run in the shard's own run (the baseline: main before the inline bound) and with merges
bounded to the inline level (the rest run by the compaction job, measured after).

Why: the near-duplicate index merges 8 segments of a level into one of the next. Run by the shard
that makes a merge due, the merge creating level k rewrites 8**k shards' postings in one shard's run:
the median shard is cheap, the worst one's time and I/O grow with the corpus (the L3 merge rewrites
~6 GB at 1 000 h, an L5 merge ~400 GB at 100 000 h). With the bound
(``SPEECHDATA_NEAR_DUP_INLINE_MERGE_LEVEL``, default 2) a shard's run creates at most that level, and
``speechdata near-duplicates compact`` (the Dagster compaction job) runs the larger merges.

The index is synthetic (``bench_near_duplicates_index.build_index``): ``8**(level + 1) - 1`` shards of
``--utterances`` utterances, so the first merge above the bound (it creates level ``level + 1``, over
every indexed shard) comes due at the third new shard. It is built once and hard-linked twice
(``cp -al``: every index write is a new file moved over its name, so the copies never share a
change); each path runs its ``--new-shards`` consecutive shards (the same synthetic shards, a tenth
of their utterances copies) through the stage's order (reserve, look up, wait, decide, commit,
compact) in a fresh process, recording each shard's wall, CPU and bytes written (the process's
``wchar``); the bounded path then runs the compaction job. Both paths' decisions are compared.
Then the compaction sensor's check, timed on shard lists of ``--sensor-shards`` shards.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import subprocess
import tempfile
import time

from benchmarks.corpus.bench_near_duplicates_index import (
    in_fresh_process,
    in_this_process,
    synthetic_signals,
    timed_build,
)
from benchmarks.report import emit, progress, ratio, stdout_to_stderr

BASELINE = "every_merge_inline"
BOUNDED = "bounded_inline"


def _written_bytes() -> int:
    """Bytes this process has written so far (``wchar``: every write, to the page cache or the disk)."""
    with open("/proc/self/io") as handle:
        return next(int(line.split()[1]) for line in handle if line.startswith("wchar:"))


def _one_shard(root, shard_id: str, signals, max_level: int | None) -> tuple[dict, str]:
    from speechdata.quality.near_dup_index import (
        IndexReader,
        commit_shard_entries,
        compact_index,
        index_keys,
        reserve_position,
        wait_for_earlier,
    )
    from speechdata.quality.near_dup_matching import NearDuplicateThresholds, decide_shard

    wall, cpu, written = time.perf_counter(), time.process_time(), _written_bytes()
    with reserve_position(root, shard_id) as reservation:
        reader = IndexReader(root, reservation.position)
        reader.prefetch(index_keys(signals, reservation.position)["key"])
        reader.settle(wait_for_earlier(root, reservation))
        decisions = decide_shard(reservation.position, signals, reader, NearDuplicateThresholds())
        commit_shard_entries(root, reservation, signals, decisions)
    merge_started = time.perf_counter()
    merged = compact_index(root, max_level=max_level)
    figures = {
        "wall_s": round(time.perf_counter() - wall, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
        "written_mb": round((_written_bytes() - written) / 1e6, 1),
        "merge_s": round(time.perf_counter() - merge_started, 3),
        "merged": merged,
        "copies_found": sum(1 for d in decisions if d.kind),
    }
    rows = repr([(d.utt_id, d.representative_shard, d.representative_utt, d.kind, d.similarity) for d in decisions])
    return figures, hashlib.sha256(rows.encode()).hexdigest()


def run_path(url: str, utterances: int, new_shards: int, max_level: int | None, results) -> None:
    """``new_shards`` consecutive shards into the index at ``url``, merges bounded by ``max_level``
    (None: every due merge in the shard's run); with a bound, then the compaction job."""
    import numpy as np

    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_dup_compaction import compact_pending
    from speechdata.quality.near_dup_index import read_order, read_shard_entries

    root = DataRoot(url)
    order = read_order(root)
    rng = np.random.default_rng(7)
    earlier = [signals for signals, _ in read_shard_entries(root, order[int(rng.integers(len(order)))])]
    shards, digests = [], []
    for number in range(new_shards):
        shard_id = f"new{number:03d}"
        signals = synthetic_signals(shard_id, utterances, rng, copies_of=earlier)
        figures, digest = _one_shard(root, shard_id, signals, max_level)
        shards.append(figures)
        digests.append(digest)
        progress(f"{'bounded' if max_level is not None else 'baseline'} {shard_id}: {figures}")
    results["shards"] = shards
    results["decisions_sha256"] = hashlib.sha256("".join(digests).encode()).hexdigest()
    if max_level is not None:
        wall, written = time.perf_counter(), _written_bytes()
        summary = compact_pending(root, on_progress=lambda line: progress(f"compaction job: {line}"))
        results["compaction_job"] = {
            "wall_s": round(time.perf_counter() - wall, 3),
            "written_mb": round((_written_bytes() - written) / 1e6, 1),
            "merges": [f"L{merge.level}->L{merge.level + 1}" for merge in summary.merges],
            "still_due": len(summary.still_due),
        }


def _summary(shards: list[dict]) -> dict:
    worst_wall = max(range(len(shards)), key=lambda n: shards[n]["wall_s"])
    worst_written = max(range(len(shards)), key=lambda n: shards[n]["written_mb"])
    return {
        "worst_wall_s": shards[worst_wall]["wall_s"],
        "worst_wall_shard": worst_wall,
        "worst_written_mb": shards[worst_written]["written_mb"],
        "worst_written_shard": worst_written,
        "median_wall_s": round(statistics.median(s["wall_s"] for s in shards), 3),
        "median_written_mb": round(statistics.median(s["written_mb"] for s in shards), 1),
        "merges": [s["merged"].split("-")[0] for s in shards if s["merged"]],
    }


def measure_sensor_check(url: str, listed: int, results) -> None:
    """The sensor's check (:func:`merges_due_above_or_damage`) on a shard list of ``listed`` committed shards
    mapped to segments as tiered compaction leaves them, then 8 L2 segments of 64 shards each (an L3
    merge due, above the default inline level; no segment files: the check opens none), with 40
    records after the snapshot (commits of new shards at the end); the median of 9, ms."""
    from benchmarks.corpus.bench_near_duplicates_order import _listed
    from speechdata.io.storage import DataRoot
    from speechdata.quality import near_dup_index_order as order
    from speechdata.quality.near_dup_compaction import merges_due_above_or_damage
    from speechdata.quality.near_dup_order_directory import read_directory
    from speechdata.quality.near_dup_order_fold import _append

    root = DataRoot(url)
    rows = _listed(listed)
    rows += [
        order.IndexedShard(
            p, f"shard-{p:07d}", f"{p:016x}", 1_000, order.COMMITTED, f"L2-{listed + (p - listed) // 64:016x}.seg"
        )
        for p in range(listed, listed + 8 * 64)
    ]
    order._write_state(root, rows)
    for number in range(40):
        position = len(rows) + number
        row = order.IndexedShard(
            position, f"new-{position:07d}", f"{position:016x}", 1_000, order.COMMITTED, f"L0-{position:016x}.seg"
        )
        _append(root, read_directory(root), [row])
    seconds = []
    for _ in range(9):
        started = time.perf_counter()
        due, _ = merges_due_above_or_damage(root)
        seconds.append(time.perf_counter() - started)
    results["check_ms"] = round(statistics.median(seconds) * 1000, 2)
    results["due_above_inline"] = [f"L{merge.level} ({merge.waiting})" for merge in due]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="inline level 1: 63 shards of 4 utterances, 4 new, all in this process"
    )
    parser.add_argument("--level", type=int, default=2, help="the inline merge level of the bounded path")
    parser.add_argument("--utterances", type=int, default=100, help="per shard, indexed and new")
    parser.add_argument("--new-shards", type=int, default=12, help="consecutive new shards per path")
    parser.add_argument("--scratch", default=None, help="folder for the index and its copies (default: the temp dir)")
    parser.add_argument(
        "--sensor-shards", type=int, nargs=2, default=(100, 100_000), help="shard lists the sensor's check is timed on"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.level, args.utterances, args.new_shards, args.sensor_shards = 1, 4, 4, (100, 2_000)
    indexed = 8 ** (args.level + 1) - 1
    run = in_this_process if args.quick else in_fresh_process
    paths = {}
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="ndcompact-", dir=args.scratch) as folder:
        built = run(timed_build, f"{folder}/built", indexed, args.utterances)
        progress(f"{indexed} shards of {args.utterances} utterances indexed in {built['build_s']} s")
        for path, max_level in ((BASELINE, None), (BOUNDED, args.level)):
            subprocess.run(["cp", "-al", f"{folder}/built", f"{folder}/{path}"], check=True)
            paths[path] = run(run_path, f"{folder}/{path}", args.utterances, args.new_shards, max_level)
            paths[path].update(_summary(paths[path]["shards"]))
        sensor = {
            listed: run(measure_sensor_check, f"{folder}/listed-{listed}", listed) for listed in args.sensor_shards
        }
        progress(f"the sensor's check: {sensor}")
    baseline, bounded = paths[BASELINE], paths[BOUNDED]
    small, large = args.sensor_shards
    emit(
        "near_duplicates_compaction",
        {
            "quick": args.quick,
            "inline_level": args.level,
            "indexed_shards": indexed,
            "utterances": args.utterances,
            "new_shards": args.new_shards,
        },
        {
            "build_s": built["build_s"],
            "paths": paths,
            "worst_wall_bounded_over_baseline": ratio(bounded["worst_wall_s"], baseline["worst_wall_s"]),
            "worst_written_bounded_over_baseline": ratio(bounded["worst_written_mb"], baseline["worst_written_mb"]),
            "decisions_identical": baseline["decisions_sha256"] == bounded["decisions_sha256"],
            "sensor_check": {str(listed): figures for listed, figures in sensor.items()},
            "sensor_check_growth": ratio(sensor[large]["check_ms"], sensor[small]["check_ms"]),
        },
    )


if __name__ == "__main__":
    main()
