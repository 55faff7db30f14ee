"""A near-duplicate re-run of a whole corpus after a threshold change: the batch pass (in one
process, and on a local Ray instance) against the incremental stage's path, shard after shard.

Why: a threshold change must re-decide every indexed shard in the index order. The incremental
stage does it one shard at a time (each reserves its position, waits for the one before, reads the
postings of its keys and the entries they name, decides, commits). The batch pass
(speechdata.quality.near_dup_batch) decides them all at once: postings joined by key partition,
each shard decided by the same ``decide_shard``, committed in parallel. Both start from the indexed
signals (``signals_from="index"``; the incremental baseline is the stage after its fingerprinting,
which a threshold change would otherwise repeat), on the same synthetic index
(benchmarks.corpus.bench_near_duplicates_index: random fingerprints, a tenth of each shard copies of
earlier utterances), in the same run, and must write the same files (checked).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.corpus.bench_near_duplicates_index import synthetic_signals
from benchmarks.report import emit, progress, ratio, stdout_to_stderr


def build_index(url: str, shards: int, utterances: int) -> list[str]:
    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_dup_index import write_index
    from speechdata.quality.near_dup_matching import Decision

    rng = np.random.default_rng(shards)
    corpus, made = [], []
    for number in range(shards):
        shard_id = f"s{number:05d}"
        signals = synthetic_signals(shard_id, utterances, rng, copies_of=made or None)
        made += signals
        corpus.append((shard_id, signals, [Decision(s.utt_id, shard_id, s.utt_id, None, 1.0) for s in signals]))
    write_index(DataRoot(url), corpus)
    return [shard_id for shard_id, _, _ in corpus]


def incremental(root, shard_ids, thresholds) -> None:
    """The stage's path for each indexed shard, in order, from its stored signals."""
    from speechdata.io import layout
    from speechdata.quality.near_dup_index import (
        IndexReader,
        commit_shard_entries,
        compact_index,
        read_order,
        read_shard_entries,
        reserve_position,
        wait_for_earlier,
    )
    from speechdata.quality.near_dup_matching import decide_shard
    from speechdata.quality.near_duplicates import near_duplicates_table

    for shard_id in shard_ids:
        indexed = next(shard for shard in read_order(root) if shard.shard_id == shard_id)
        signals = [signals for signals, _ in read_shard_entries(root, indexed)]
        with reserve_position(root, shard_id) as reservation:
            reader = IndexReader(root, reservation.position, wait_for_earlier(root, reservation))
            decisions = decide_shard(reservation.position, signals, reader, thresholds)
            commit_shard_entries(root, reservation, signals, decisions)
            root.write_parquet(layout.near_duplicates(shard_id), near_duplicates_table(decisions))
        compact_index(root)


def written(root) -> dict[str, bytes]:
    return {path: Path(path).read_bytes() for path in root.glob("shards/*/near_duplicates.parquet")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 shards of 40 utterances")
    parser.add_argument("--shards", type=int, default=24)
    parser.add_argument("--utterances", type=int, default=300, help="per shard")
    parser.add_argument("--cpus", type=int, default=os.cpu_count(), help="of the local Ray instance")
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.utterances = 6, 40
    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_dup_batch import LocalEngine, run_near_duplicates_batch
    from speechdata.quality.near_dup_batch_ray import RayEngine, ray_connection
    from speechdata.quality.near_dup_matching import NearDuplicateThresholds

    thresholds = NearDuplicateThresholds(min_transcript_jaccard=0.9)
    figures: dict = {}
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-near-dup-batch-") as folder:
        root = DataRoot(f"{folder}/data")
        started = time.perf_counter()
        shard_ids = build_index(root.url, args.shards, args.utterances)
        progress(f"{args.shards} shards indexed in {time.perf_counter() - started:.1f} s")

        started = time.perf_counter()
        incremental(root, shard_ids, thresholds)
        figures["incremental_wall_s"] = round(time.perf_counter() - started, 2)
        expected = written(root)
        progress(f"incremental, shard after shard: {figures['incremental_wall_s']} s")

        started = time.perf_counter()
        summary = run_near_duplicates_batch(
            root, shard_ids, thresholds, engine=LocalEngine(), signals_from="index", partitions=4
        )
        figures["batch_in_process_wall_s"] = round(time.perf_counter() - started, 2)
        figures["batch_in_process_stage_s"] = {k: round(v, 2) for k, v in summary.stage_seconds.items()}
        assert written(root) == expected, "the batch pass wrote other files than the incremental path"
        progress(f"batch, in process: {figures['batch_in_process_wall_s']} s")

        with ray_connection("local", num_cpus=args.cpus) as cluster:
            started = time.perf_counter()
            summary = run_near_duplicates_batch(
                root, shard_ids, thresholds, engine=RayEngine(), signals_from="index", partitions=max(2, args.cpus)
            )
            figures["batch_ray_wall_s"] = round(time.perf_counter() - started, 2)
            figures["batch_ray_stage_s"] = {k: round(v, 2) for k, v in summary.stage_seconds.items()}
            figures["ray_cluster"] = cluster
        assert written(root) == expected, "the batch pass on Ray wrote other files than the incremental path"
        progress(f"batch, on Ray ({cluster}): {figures['batch_ray_wall_s']} s")
        figures["duplicates"] = summary.by_kind
    figures["ratio_batch_in_process_over_incremental"] = ratio(
        figures["batch_in_process_wall_s"], figures["incremental_wall_s"]
    )
    figures["ratio_batch_ray_over_incremental"] = ratio(figures["batch_ray_wall_s"], figures["incremental_wall_s"])
    emit(
        "near_duplicates_batch",
        {"quick": args.quick, "shards": args.shards, "utterances": args.utterances, "cpus": args.cpus},
        figures,
    )


if __name__ == "__main__":
    main()
