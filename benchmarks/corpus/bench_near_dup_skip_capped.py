"""Near duplicates per new shard on a capped index of several live segments (levels 2, 1 and 0) whose
audio keys are speech-like: a sampled audio key past the cap in one segment looked up in the others
too (off: main's reader, every key in every live segment) against not (on: the reader's
``SKIP_CAPPED_KEYS``), on the same index.

Why: every segment keeps a sampled audio key's earliest ``MAX_KEY_OCCURRENCES + 1`` postings
(``bench_near_dup_capped_keys``), so a common key costs about 3 blocks per live segment; but once one
segment (read largest first) shows more than ``MAX_KEY_OCCURRENCES`` of its postings before the new
shard, the key never votes, and the other segments need not be read for it.

The index is ``bench_near_dup_capped_keys``'s (synthetic entries, every sub-fingerprint drawn from a
pool of ``2^--pool-bits`` values, ``write_index``: the shards in order, merged 8 at a time), of
``--shards`` shards (83: one level-2 segment of 64, two level-1 of 8, three level-0); the new shard
(a tenth of it copies) goes through the stage's path (reserve, prefetch the postings of its keys,
settle, decide) without committing, so every measurement decides the same shard at the same
position, off and on alternating, each in a fresh process (``--quick``: one process, 11 shards of 20
utterances, the cap lowered to 4). Figures: blocks, postings and segment bytes read, the keys looked
up per live segment, the decide CPU and wall time; the decisions must be the same. Beside them, what
the keyspace model (``bench_near_dup_capped_keys.modelled_blocks``) computes for these segments.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from benchmarks.corpus.bench_near_dup_capped_keys import _build, _limits, _new_shard, modelled_blocks
from benchmarks.corpus.bench_near_duplicates_index import in_fresh_process, in_this_process
from benchmarks.report import emit, progress, ratio, stdout_to_stderr


def _built(url: str, shards: int, utterances: int, bits: int, max_occurrences: int | None, results) -> None:
    with _limits(max_occurrences, capped=True):
        _build(url, shards, utterances, bits, results)


def _measure(url: str, utterances: int, bits: int, max_occurrences: int | None, skip: bool, results) -> None:
    """The new shard decided (not committed) with the reader's skipping ``skip``."""
    from speechdata.io.storage import DataRoot
    from speechdata.quality import near_dup_index_reader
    from speechdata.quality.near_dup_index import (
        IndexReader,
        index_keys,
        read_order,
        reserve_position,
        wait_for_earlier,
    )
    from speechdata.quality.near_dup_matching import NearDuplicateThresholds, decide_shard
    from speechdata.quality.near_dup_postings import audio_only_keys, read_segment_header

    near_dup_index_reader.SKIP_CAPPED_KEYS = skip
    root = DataRoot(url)
    with _limits(max_occurrences, capped=True):
        signals = _new_shard(root, utterances, bits)
        read_order(root)
        wall, cpu = time.perf_counter(), time.process_time()
        with reserve_position(root, "new") as reservation:
            own = index_keys(signals, reservation.position)
            reader = IndexReader(root, reservation.position)
            reader.prefetch(own["key"], audio_only_keys(own))
            reader.settle(wait_for_earlier(root, reservation))
            decisions = decide_shard(reservation.position, signals, reader, NearDuplicateThresholds(), own_postings=own)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    live = {}
    for name in reader._lookup_order():
        with root.fs.open(root.path(f"index/near_duplicates/segments/{name}"), "rb") as handle:
            header = read_segment_header(handle, name)
        read = reader._read.get(name)
        live[name] = {
            "records": header.records,
            "shards": len(header.shards),
            "keys_looked_up": 0 if read is None else int(read[2].sum()),
        }
    results.update(
        {
            "decide_wall_s": round(wall, 2),
            "decide_cpu_s": round(cpu, 2),
            "segment_bytes_read": reader.segment_bytes_read,
            "blocks_read": reader.blocks_read,
            "blocks_read_by_chance": reader.blocks_read_by_chance,
            "filter_bytes_read": reader.filter_bytes_read,
            "postings_read": reader.postings_read,
            "keys": len(reader._keys),
            "audio_only_keys": len(audio_only_keys(own)),
            "copies_found": sum(1 for d in decisions if d.kind),
            "decisions": [(d.utt_id, d.representative_shard, d.representative_utt, d.kind) for d in decisions],
            "live_segments": live,
        }
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="11 shards of 20 utterances, the cap lowered to 4")
    parser.add_argument(
        "--shards", type=int, default=83, help="indexed shards (83: live segments of 64, 8, 8, 1, 1, 1)"
    )
    parser.add_argument("--utterances", type=int, default=200, help="per shard, and in the new shard")
    parser.add_argument("--pool-bits", type=int, nargs="+", default=[10, 12], help="2^bits sub-fingerprint values")
    parser.add_argument("--repeats", type=int, default=2, help="measurements off and on, alternating")
    parser.add_argument(
        "--max-occurrences", type=int, default=None, help="the vote's limit (the cap: one more); default the stage's"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.utterances, args.pool_bits, args.max_occurrences, args.repeats = 11, 20, [12], 3, 1
    from speechdata.quality.near_dup_matching import MAX_KEY_OCCURRENCES
    from speechdata.quality.near_dup_postings import AUDIO_KEY_SAMPLING

    cap = MAX_KEY_OCCURRENCES if args.max_occurrences is None else args.max_occurrences
    run = in_this_process if args.quick else in_fresh_process
    per_pool: dict = {}
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-near-dup-skip-capped-") as folder:
        for bits in args.pool_bits:
            url = f"{folder}/b{bits}"
            built = run(_built, url, args.shards, args.utterances, bits, args.max_occurrences)
            figures: dict = {"build_s": built["build_s"]}
            measured: dict[str, list[dict]] = {"off": [], "on": []}
            for _ in range(args.repeats):
                for layout, skip in (("off", False), ("on", True)):
                    measured[layout].append(run(_measure, url, args.utterances, bits, args.max_occurrences, skip))
                    progress(f"2^{bits} values, skip {layout}: {measured[layout][-1]['blocks_read']} blocks")
            decisions = [m.pop("decisions") for layouts in measured.values() for m in layouts]
            figures["same_decisions"] = all(d == decisions[0] for d in decisions)
            for layout, runs in measured.items():
                best = dict(runs[0])
                for name in ("decide_cpu_s", "decide_wall_s"):
                    best[name] = min(m[name] for m in runs)
                    best[f"{name}_each"] = [m[name] for m in runs]
                figures[layout] = best
            figures["on_over_off"] = {
                name: ratio(figures["on"][name], figures["off"][name])
                for name in ("blocks_read", "postings_read", "segment_bytes_read", "decide_cpu_s", "decide_wall_s")
            }
            # per indexed posting: the audio share (frames 200-400, 85 % active, half sampled; the rest 309)
            audio_share = 0.85 * 300 / AUDIO_KEY_SAMPLING / (0.85 * 300 / AUDIO_KEY_SAMPLING + 309)
            keys = (args.utterances * 0.85 * 300 / AUDIO_KEY_SAMPLING, args.utterances * 309)
            pool_keys = 2**bits // AUDIO_KEY_SAMPLING
            # A segment's postings had it kept them all (what the model takes): its shards' postings.
            per_shard = args.utterances * (0.85 * 300 / AUDIO_KEY_SAMPLING + 309)
            held = [segment["shards"] for segment in figures["off"]["live_segments"].values()]
            records = [shards * per_shard for shards in held]
            figures["modelled_blocks"] = {
                layout: modelled_blocks(records, audio_share, pool_keys, keys, cap + 1, one_segment=skip)
                for layout, skip in (("off", False), ("on", True))
            }
            figures["largest_segment_postings_a_key"] = round(max(records) * audio_share / pool_keys)
            per_pool[f"2^{bits}"] = figures
    emit(
        "near_dup_skip_capped",
        {
            "quick": args.quick,
            "shards": args.shards,
            "utterances": args.utterances,
            "pool_bits": args.pool_bits,
            "max_occurrences": cap,
            "repeats": args.repeats,
        },
        per_pool,
    )


if __name__ == "__main__":
    main()
