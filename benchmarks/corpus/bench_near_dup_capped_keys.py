"""Near duplicates per new shard on an index whose audio keys are speech-like: segments that keep a
sampled audio key's earliest ``MAX_KEY_OCCURRENCES + 1`` postings (capped) against segments that keep
them all (uncapped, what main writes), at two index sizes.

Why: on speech the sampled audio key behaves as a 16-21-bit key (``bench_near_dup_keyspace``), so a
common key's postings grow with the corpus and each lookup read all of them in every live segment,
although a key with more than ``MAX_KEY_OCCURRENCES`` earlier postings never votes. Capped, a key
costs at most ``(MAX_KEY_OCCURRENCES + 1) / 256`` blocks more than its first per segment.

The index is synthetic (``bench_near_duplicates_index.synthetic_signals``) except its audio: every
sub-fingerprint is drawn from a pool of ``2^--pool-bits`` values, so each sampled key holds about
``indexed audio keys / 2^(bits - 1)`` postings, as a key of speech does. What capping saves depends
on a key's postings per segment against the cap (and against a block's 256), and a 16-21-bit key
reaches thousands of postings only at 10^4-10^5 hours; the few tens of thousands of utterances that
fit in minutes on this machine reach them with a smaller pool: ``2^10`` values give a key about
3 200 postings in 64 shards of 200 utterances (an espeak-like key at ~75 000 h, a synthetic-like one
at ~2 000 h), ``2^12`` about 800 (espeak-like at ~19 000 h). The cap is the stage's own
(``MAX_KEY_OCCURRENCES``), unless ``--max-occurrences`` lowers it (and the vote's limit with it).
Both indexes are built the same (``write_index``: the shards in order, merged 8 at a time), one
with capped segments, one without; a new shard (a tenth of it copies of indexed utterances) then
goes through each with the stage's path (reserve, read the postings of its keys and the entries they
name, decide, commit) in the same fresh process (``--quick``: all in one): the segment bytes and blocks it read, the postings,
its CPU and wall time. The decisions must be the same. Beside them, what the keyspace model
(:func:`modelled_blocks`: per live segment, a key present reads a block, one more per 256 postings
read; absent, a filter's false positive) computes for the same segments, uncapped and capped.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import tempfile
import time
from collections.abc import Iterator

import numpy as np

from benchmarks.corpus.bench_near_duplicates_index import in_fresh_process, synthetic_signals
from benchmarks.report import emit, progress, ratio, stdout_to_stderr


@contextlib.contextmanager
def _limits(max_occurrences: int | None, capped: bool) -> Iterator[None]:
    """The vote's and the segments' limits while the block runs (None: the stage's)."""
    from speechdata.quality import near_dup_matching, near_dup_postings

    saved = near_dup_matching.MAX_KEY_OCCURRENCES, near_dup_postings.key_posting_cap
    if max_occurrences is not None:
        near_dup_matching.MAX_KEY_OCCURRENCES = max_occurrences
    if not capped:
        near_dup_postings.key_posting_cap = lambda: 1 << 62
    try:
        yield
    finally:
        near_dup_matching.MAX_KEY_OCCURRENCES, near_dup_postings.key_posting_cap = saved


def _pooled(signals, pool: np.ndarray, rng: np.random.Generator):
    """``signals`` with every sub-fingerprint drawn from ``pool`` (a copy's: its original's, with the
    bits ``synthetic_signals`` flipped)."""
    from dataclasses import replace

    from speechdata.quality.fingerprint_audio import AudioFingerprint

    made = []
    for utterance in signals:
        fingerprint = utterance.fingerprint
        values = pool[rng.integers(0, len(pool), len(fingerprint.sub_fingerprints))]
        made.append(replace(utterance, fingerprint=AudioFingerprint(values, fingerprint.active)))
    return made


def _pool(bits: int) -> np.ndarray:
    return np.random.default_rng(bits).choice(2**32, 2**bits, replace=False).astype(np.uint32)


def _build(url: str, shards: int, utterances: int, bits: int, results) -> None:
    from speechdata.io.storage import DataRoot
    from speechdata.quality.near_dup_index import write_index
    from speechdata.quality.near_dup_matching import Decision

    rng, pool = np.random.default_rng(shards), _pool(bits)

    def corpus():
        for number in range(shards):
            shard_id = f"s{number:06d}"
            signals = _pooled(synthetic_signals(shard_id, utterances, rng), pool, rng)
            yield shard_id, signals, [Decision(s.utt_id, shard_id, s.utt_id, None, 1.0) for s in signals]

    started = time.perf_counter()
    write_index(DataRoot(url), corpus())
    results["build_s"] = round(time.perf_counter() - started, 1)


def _build_and_measure(
    url: str, shards: int, utterances: int, bits: int, max_occurrences: int | None, capped: bool, results
):
    """Both in one process: the measurement's own figures are taken around the new shard only."""
    with _limits(max_occurrences, capped):
        _build(url, shards, utterances, bits, results)
        _measure(url, utterances, bits, results)


def _new_shard(root, utterances: int, bits: int):
    """The new shard: its originals pooled like the index's; its copies (one in ten) of utterances
    of one indexed shard."""
    from speechdata.quality.near_dup_index import read_order, read_shard_entries

    rng = np.random.default_rng(7)
    order = read_order(root)
    earlier = [signals for signals, _ in read_shard_entries(root, order[int(rng.integers(len(order)))])]
    signals = synthetic_signals("new", utterances, rng, copies_of=earlier)
    pooled = _pooled(signals, _pool(bits), rng)
    return [pooled[n] if n % 10 else signals[n] for n in range(len(signals))]


def _measure(url: str, utterances: int, bits: int, results) -> None:
    from speechdata.io.storage import DataRoot
    from speechdata.quality import near_dup_index_reader
    from speechdata.quality.near_dup_index import (
        IndexReader,
        commit_shard_entries,
        read_order,
        reserve_position,
        wait_for_earlier,
    )
    from speechdata.quality.near_dup_matching import NearDuplicateThresholds, decide_shard
    from speechdata.quality.near_dup_postings import read_segment_header

    # The cap alone: a key past it is read in every live segment, as before the reader stopped
    # reading it there (``bench_near_dup_skip_capped`` measures that).
    near_dup_index_reader.SKIP_CAPPED_KEYS = False
    root = DataRoot(url)
    signals = _new_shard(root, utterances, bits)
    read_order(root)
    wall, cpu = time.perf_counter(), time.process_time()
    with reserve_position(root, "new") as reservation:
        reader = IndexReader(root, reservation.position, wait_for_earlier(root, reservation))
        decisions = decide_shard(reservation.position, signals, reader, NearDuplicateThresholds())
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        commit_shard_entries(root, reservation, signals, decisions)
    live = {}
    for name in sorted(reader._live):
        with root.fs.open(root.path(f"index/near_duplicates/segments/{name}"), "rb") as handle:
            header = read_segment_header(handle, name)
        live[name] = {"records": header.records, "shards": len(header.shards)}
    results.update(
        {
            "decide_wall_s": round(wall, 2),
            "decide_cpu_s": round(cpu, 2),
            "segment_bytes_read": reader.segment_bytes_read,
            "blocks_read": reader.blocks_read,
            "filter_bytes_read": reader.filter_bytes_read,
            "postings_read": reader.postings_read,
            "entries_fetched": reader.entries_fetched,
            "copies_found": sum(1 for d in decisions if d.kind),
            "decisions": [(d.utt_id, d.representative_shard, d.representative_utt, d.kind) for d in decisions],
            "live_segments": live,
        }
    )


def modelled_blocks(
    records: list[int],
    audio_share: float,
    pool_keys: int,
    new_keys: tuple[float, float],
    cap: int | None,
    one_segment: bool = False,
) -> int:
    """The keyspace model's block reads for the new shard on live segments of ``records`` postings
    each (uncapped): a key of the pool holds ``audio postings / pool_keys`` of them (uniform over the
    pool), is present with probability ``1 - exp(-that)`` and then reads ``1 + min(postings, cap) /
    256`` blocks, absent a filter's false positive (0.6 %); the new shard's other keys
    (``new_keys``: its distinct audio keys, its other keys) are absent; a segment's blocks (capped:
    its postings less what the cap drops) bound what it reads. ``one_segment``: the segments read
    largest first, a pool key no longer looked up (no block, no filter line) once the segments before
    hold ``cap`` of its postings: it is still looked up with probability ``P(Poisson(L) < cap)``, ``L``
    its mean postings in them (``bench_near_dup_skip_capped``)."""
    from scipy.special import gammaincc

    blocks, before = 0.0, 0.0
    audio, other = new_keys
    distinct = pool_keys * -math.expm1(-audio / pool_keys)
    for postings in sorted(records, reverse=True) if one_segment else records:
        per_key = postings * audio_share / pool_keys
        read = per_key if cap is None else min(per_key, cap)
        present = -math.expm1(-per_key)
        looked_up = float(gammaincc(cap, before)) if one_segment and before and cap is not None else 1.0
        before += per_key
        wanted = distinct * looked_up * (present * (1 + read / 256) + (1 - present) * 0.006) + other * 0.006
        kept = postings - (0 if cap is None else pool_keys * present * max(per_key - cap, 0))
        blocks += kept / 256 * -math.expm1(-wanted / (kept / 256))
    return round(blocks)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="indexes of 2 and 4 shards of 30 utterances")
    parser.add_argument("--shards", type=int, nargs=2, default=(16, 64), help="the two index sizes")
    parser.add_argument("--utterances", type=int, default=200, help="per shard, and in the new shard")
    parser.add_argument("--pool-bits", type=int, nargs="+", default=[10, 12], help="2^bits sub-fingerprint values")
    parser.add_argument(
        "--max-occurrences", type=int, default=None, help="the vote's limit (the cap: one more); default the stage's"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.utterances, args.pool_bits, args.max_occurrences = (2, 4), 30, [12], 3
    from speechdata.quality.near_dup_matching import MAX_KEY_OCCURRENCES
    from speechdata.quality.near_dup_postings import AUDIO_KEY_SAMPLING

    cap = MAX_KEY_OCCURRENCES if args.max_occurrences is None else args.max_occurrences

    per_pool: dict = {}
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-near-dup-capped-") as folder:
        for bits in args.pool_bits:
            for shards in args.shards:
                figures = {}
                for capped in (False, True):
                    layout = "capped" if capped else "uncapped"
                    url = f"{folder}/b{bits}-n{shards}-{layout}"
                    limits = (bits, args.max_occurrences, capped)
                    if args.quick:  # the smoke test: one process (the figures are not compared)
                        figures[layout] = {}
                        _build_and_measure(url, shards, args.utterances, *limits, figures[layout])
                    else:
                        figures[layout] = in_fresh_process(_build_and_measure, url, shards, args.utterances, *limits)
                    progress(f"2^{bits} values, {shards} shards, {layout}: {figures[layout]['blocks_read']} blocks")
                decisions = [figures[layout].pop("decisions") for layout in ("uncapped", "capped")]
                # per indexed posting: the audio share (frames 200-400, 85 % active, half sampled; the rest 309)
                audio_share = 0.85 * 300 / AUDIO_KEY_SAMPLING / (0.85 * 300 / AUDIO_KEY_SAMPLING + 309)
                pool_keys = 2**bits // AUDIO_KEY_SAMPLING
                new_keys = args.utterances * 0.85 * 300 / AUDIO_KEY_SAMPLING
                uncapped_live = figures["uncapped"]["live_segments"]
                figures["same_decisions"] = decisions[0] == decisions[1]
                figures["capped_over_uncapped"] = {
                    name: ratio(figures["capped"][name], figures["uncapped"][name])
                    for name in ("blocks_read", "postings_read", "decide_cpu_s", "decide_wall_s")
                }
                figures["capped_over_uncapped"]["index_postings"] = ratio(
                    sum(s["records"] for s in figures["capped"]["live_segments"].values()),
                    sum(s["records"] for s in uncapped_live.values()),
                )
                records = [segment["records"] for segment in uncapped_live.values()]
                keys = (new_keys, args.utterances * 309)
                figures["modelled_blocks"] = {
                    "uncapped": modelled_blocks(records, audio_share, pool_keys, keys, None),
                    "capped": modelled_blocks(records, audio_share, pool_keys, keys, cap + 1),
                }
                for layout in ("uncapped", "capped"):
                    figures[layout]["live_segments"] = len(figures[layout]["live_segments"])
                per_pool.setdefault(f"2^{bits}", {})[shards] = figures
    emit(
        "near_dup_capped_keys",
        {
            "quick": args.quick,
            "shards": list(args.shards),
            "utterances": args.utterances,
            "pool_bits": args.pool_bits,
            "max_occurrences": cap,
        },
        per_pool,
    )


if __name__ == "__main__":
    main()
