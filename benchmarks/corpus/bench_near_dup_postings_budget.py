"""Near duplicates per new shard with the earlier postings held at once bounded by a budget
(``SPEECHDATA_NEAR_DUP_POSTINGS_BUDGET_MB``): no budget (one lookup of every key, as before) against
a budget below the postings that lookup holds (the prefetch stops past it; the candidates are gathered
in chunks of utterances that fit), on the same speech-like capped index.

The index is ``bench_near_dup_skip_capped``'s (``bench_near_dup_capped_keys``'s synthetic entries,
every sub-fingerprint from a pool of ``2^--pool-bits`` values, written with ``write_index``); the
vote's limit is raised (``--max-occurrences``) so that the pool's keys stay under it and the new shard
holds tens of MB of postings, as a speech-like shard does at 10^4-10^6 h with hundreds of MB to GB.
The new shard goes through the stage's path (reserve, prefetch with the budget as its limit,
settle, decide with the budget) without committing, in a fresh process each time, off and on
alternating. Figures: the decide step's peak RSS (sampled) and what it added, the process's
``VmHWM``, CPU and wall, postings, blocks and segment bytes read (a block read twice where two chunks
need it counts twice), the lookups answered and refused; the decisions must be the same.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from benchmarks.corpus.bench_near_dup_capped_keys import _limits, _new_shard
from benchmarks.corpus.bench_near_dup_skip_capped import _built
from benchmarks.corpus.bench_near_duplicates_index import in_fresh_process, in_this_process
from benchmarks.report import RssSampler, emit, peak_rss_mb, progress, ratio, stdout_to_stderr


def _measure(url: str, utterances: int, bits: int, max_occurrences: int | None, budget_mb: float, results) -> None:
    """The new shard decided (not committed) under ``budget_mb`` (0: no budget), read by the setting."""
    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_dup_index import IndexReader
    from speechdata.quality.near_dup_matching import POSTINGS_BUDGET_ENV, postings_budget

    os.environ[POSTINGS_BUDGET_ENV] = f"{budget_mb:.6f}"
    budget = postings_budget()
    lookups = {"answered": 0, "refused": 0}
    looked_up = IndexReader.postings

    def counted(reader, keys, audio_only=None, limit=None):
        found = looked_up(reader, keys, audio_only, limit)
        lookups["refused" if found is None else "answered"] += 1
        return found

    IndexReader.postings = counted
    saved = os.environ.get(POSTINGS_BUDGET_ENV)
    try:
        _decide_new(DataRoot(url), utterances, bits, max_occurrences, budget, results)
    finally:
        IndexReader.postings = looked_up  # a quick run measures again in this process
        if saved is None:
            os.environ.pop(POSTINGS_BUDGET_ENV, None)
        else:
            os.environ[POSTINGS_BUDGET_ENV] = saved
    results.update({"lookups_answered": lookups["answered"], "lookups_refused": lookups["refused"]})


def _decide_new(root, utterances: int, bits: int, max_occurrences: int | None, budget: int | None, results) -> None:
    from speechdata.quality.near_dup_index import (
        IndexReader,
        index_keys,
        read_order,
        reserve_position,
        wait_for_earlier,
    )
    from speechdata.quality.near_dup_matching import NearDuplicateThresholds, decide_shard
    from speechdata.quality.near_dup_postings import audio_only_keys

    with _limits(max_occurrences, capped=True):
        signals = _new_shard(root, utterances, bits)
        read_order(root)
        with RssSampler() as rss:
            wall, cpu = time.perf_counter(), time.process_time()
            with reserve_position(root, "new") as reservation:
                own = index_keys(signals, reservation.position)
                reader = IndexReader(root, reservation.position)
                reader.prefetch(own["key"], audio_only_keys(own), limit=budget)
                reader.settle(wait_for_earlier(root, reservation))
                decisions = decide_shard(
                    reservation.position, signals, reader, NearDuplicateThresholds(), own_postings=own, budget=budget
                )
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    results.update(
        {
            "budget_postings": budget,
            "decide_peak_rss_mb": round(rss.peak_mb, 1),
            "decide_added_rss_mb": round(rss.added_mb, 1),
            "process_peak_rss_mb": round(peak_rss_mb(), 1),
            "decide_wall_s": round(wall, 2),
            "decide_cpu_s": round(cpu, 2),
            "postings_read": reader.postings_read,
            "blocks_read": reader.blocks_read,
            "segment_bytes_read": reader.segment_bytes_read,
            "copies_found": sum(1 for d in decisions if d.kind),
            "decisions": [(d.utt_id, d.representative_shard, d.representative_utt, d.kind) for d in decisions],
        }
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="11 shards of 20 utterances, in this process")
    parser.add_argument("--shards", type=int, default=83, help="indexed shards (live segments of 64, 8, 8, 1, 1, 1)")
    parser.add_argument("--utterances", type=int, default=100, help="per shard, and in the new shard")
    parser.add_argument("--pool-bits", type=int, default=12, help="2^bits sub-fingerprint values")
    parser.add_argument("--max-occurrences", type=int, default=2_000, help="the vote's limit (the cap: one more)")
    parser.add_argument(
        "--fraction", type=float, default=0.125, help="the budget, as a share of the postings read without one"
    )
    parser.add_argument("--repeats", type=int, default=2, help="measurements off and on, alternating")
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.utterances, args.max_occurrences, args.repeats = 11, 20, 3, 1
    from speechdata.quality.near_dup_postings import POSTING_DTYPE

    run = in_this_process if args.quick else in_fresh_process
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-near-dup-postings-budget-") as folder:
        url = f"{folder}/index"
        built = run(_built, url, args.shards, args.utterances, args.pool_bits, args.max_occurrences)
        measured: dict[str, list[dict]] = {"off": [], "on": []}
        budget_mb = 0.0
        for _ in range(args.repeats):
            for layout in ("off", "on"):
                if layout == "on" and not budget_mb:
                    held = measured["off"][0]["postings_read"]
                    budget_mb = held * args.fraction * POSTING_DTYPE.itemsize / 2**20
                figures = run(
                    _measure,
                    url,
                    args.utterances,
                    args.pool_bits,
                    args.max_occurrences,
                    budget_mb if layout == "on" else 0.0,
                )
                measured[layout].append(figures)
                progress(f"budget {layout}: {figures['decide_peak_rss_mb']} MB peak, {figures['decide_cpu_s']} s CPU")
    decisions = [m.pop("decisions") for runs in measured.values() for m in runs]
    result: dict = {"build_s": built["build_s"], "budget_mb": round(budget_mb, 3)}
    result["same_decisions"] = all(d == decisions[0] for d in decisions)
    for layout, runs in measured.items():
        best = dict(runs[0])
        for name in ("decide_cpu_s", "decide_wall_s", "decide_peak_rss_mb", "decide_added_rss_mb"):
            best[name] = min(m[name] for m in runs)
            best[f"{name}_each"] = [m[name] for m in runs]
        result[layout] = best
    result["on_over_off"] = {
        name: ratio(result["on"][name], result["off"][name])
        for name in (
            "decide_added_rss_mb",
            "decide_peak_rss_mb",
            "decide_cpu_s",
            "decide_wall_s",
            "postings_read",
            "blocks_read",
            "segment_bytes_read",
        )
    }
    emit(
        "near_dup_postings_budget",
        {
            "quick": args.quick,
            "shards": args.shards,
            "utterances": args.utterances,
            "pool_bits": args.pool_bits,
            "max_occurrences": args.max_occurrences,
            "fraction": args.fraction,
            "repeats": args.repeats,
        },
        result,
    )


if __name__ == "__main__":
    main()
