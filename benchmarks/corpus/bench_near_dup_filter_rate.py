"""The near-duplicate key filters' false-positive rate against bits per key and hashes, and what each
sizing costs a new shard's lookup per live segment, computed at 100 to 100 000 hours.

Why: a key a segment's filter lets through by chance reads a 7 KiB block of that segment; the blocks
read for false positives were the largest block term at 1 000 h (29 000 of 49 000 blocks, at 12 bits
per posting and 6 hashes: 0.6 %). More bits per key cut them, but make every filter larger, and a
lookup reads a small segment's filter whole and a large one's wherever its keys land.

Measured: random keys (the index's keys are hashes) set in a filter of ``bits`` bits per key with
``hashes`` bits each (speechdata.quality.near_dup_filter's hashing and 448-bit lines; hashes past the
seven one 64-bit hash gives come from a second mix), then as many absent keys tested. The baseline
is the sizing the index used before (12 bits, 6 hashes).

Computed (``computed``): per new shard of 1 000 utterances (434 000 distinct keys), over the live
segments of an index of N shards of ~438 000 postings (8-way tiered merges: the shard count's
base-8 digits), each sizing's filter bytes touched (a segment's filter pages the keys land on,
4 KiB each: the whole filter when small) and blocks read for false positives (the distinct blocks
those keys fall in), at the rates measured here.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from benchmarks.report import emit, progress, ratio, stdout_to_stderr

LOOKUP_KEYS = 434_000
"""Distinct keys a new shard of 1 000 utterances looks up."""
SHARD_POSTINGS = 438_000
BLOCK_BYTES = 7 * 1024
SIZES_HOURS_SHARDS = ((100, 75), (1_000, 750), (10_000, 5_000), (100_000, 50_000))


def _bits(hashed: np.ndarray, hashes: int) -> np.ndarray:
    from speechdata.quality import near_dup_filter as f

    spread = f._mix(hashed)
    columns = [(spread >> np.uint64(9 * j)) & np.uint64(511) for j in range(min(hashes, 7))]
    if hashes > 7:
        more = f._mix(spread ^ np.uint64(0x9E3779B97F4A7C15))
        columns += [(more >> np.uint64(9 * j)) & np.uint64(511) for j in range(hashes - 7)]
    return (np.stack(columns, axis=1) % np.uint64(f.LINE_BITS)).astype(np.int64)


def false_positive_rate(keys: int, bits: int, hashes: int, rng: np.random.Generator) -> float:
    from speechdata.quality import near_dup_filter as f

    lines = max(1, -(-keys * bits // f.LINE_BITS))
    table = np.zeros((lines, f.BIT_WORDS), np.uint64)
    hashed = f._mix(rng.integers(0, 2**63, keys, dtype=np.uint64) ^ f._FILTER_SALT)
    line, bit = f._line_of_hashed(hashed, lines), _bits(hashed, hashes)
    for j in range(hashes):
        np.bitwise_or.at(
            table.reshape(-1), line * f.BIT_WORDS + bit[:, j] // 64, np.uint64(1) << (bit[:, j] % 64).astype(np.uint64)
        )
    queried = f._mix(rng.integers(0, 2**63, keys, dtype=np.uint64) ^ f._FILTER_SALT)
    line, bit = f._line_of_hashed(queried, lines), _bits(queried, hashes)
    passed = np.ones(keys, bool)
    for j in range(hashes):
        passed &= (table[line, bit[:, j] // 64] >> (bit[:, j] % 64).astype(np.uint64)) & np.uint64(1) == 1
    return float(passed.mean())


def live_segments(shards: int) -> list[int]:
    """The shards each live segment holds after tiered merges of 8."""
    held, level = [], 0
    while shards:
        held += [8**level] * (shards % 8)
        shards //= 8
        level += 1
    return held


def lookup_cost(shards: int, sizing, rates: dict[tuple[int, int], float]) -> dict:
    """Filter bytes touched and blocks read for false positives by one new shard's lookup."""
    filter_bytes = blocks = 0.0
    for held in live_segments(shards):
        records = held * SHARD_POSTINGS
        bits, hashes = sizing(records)
        lines = math.ceil(records * bits / 448)
        pages = lines / 64
        filter_bytes += 4096 * pages * (1 - math.exp(-LOOKUP_KEYS / pages)) if pages > 1 else 64 * lines
        segment_blocks = records / 256
        blocks += segment_blocks * (1 - math.exp(-LOOKUP_KEYS * rates[(bits, hashes)] / segment_blocks))
    return {
        "filter_mb": round(filter_bytes / 1e6),
        "false_positive_blocks": round(blocks),
        "false_positive_block_mb": round(blocks * BLOCK_BYTES / 1e6),
        "both_mb": round((filter_bytes + blocks * BLOCK_BYTES) / 1e6),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 000 keys, fewer sizings")
    parser.add_argument("--keys", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    keys = 200_000 if args.quick else args.keys
    bits_choices = (12, 20) if args.quick else (12, 14, 16, 18, 20, 24)
    hashes_choices = (6, 7) if args.quick else (5, 6, 7, 8, 9, 10)
    rng = np.random.default_rng(7)
    rates = {}
    with stdout_to_stderr():
        for bits in bits_choices:
            for hashes in hashes_choices:
                rates[(bits, hashes)] = false_positive_rate(keys, bits, hashes, rng)
                progress(f"{bits} bits, {hashes} hashes: {100 * rates[(bits, hashes)]:.4f} %")
    from speechdata.quality.near_dup_filter import HASHES, bits_per_key

    sizings = {"before_12_bits_6_hashes": lambda records: (12, 6), "now": lambda r: (bits_per_key(r), HASHES)}
    if not args.quick:
        sizings.update(
            {"20_bits_7_hashes_everywhere": lambda r: (20, 7), "16_bits_7_hashes_everywhere": lambda r: (16, 7)}
        )
    computed = {
        f"{hours}_h": {name: lookup_cost(shards, sizing, rates) for name, sizing in sizings.items()}
        for hours, shards in SIZES_HOURS_SHARDS
    }
    emit(
        "near_dup_filter_rate",
        {"keys": keys, "quick": args.quick},
        {
            "false_positive_percent": {f"{b}_bits_{h}_hashes": round(100 * r, 4) for (b, h), r in rates.items()},
            "now_over_baseline_rate_small_segments": ratio(rates[(bits_per_key(1), HASHES)], rates[(12, 6)]),
            "computed": computed,
        },
    )


if __name__ == "__main__":
    main()
