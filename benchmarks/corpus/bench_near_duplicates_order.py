"""A shard's reservation and commit in the near-duplicate index's order, at N shards listed: the
snapshot plus one record per change against the whole-file rewrite it replaced, in one run.

Why: the order (``index/near_duplicates/shards.parquet``: position, shard id, state, entries
version, segment) was rewritten whole on every reservation and every commit, under the corpus-wide
index lock, so each new shard held that lock for time growing with the corpus (0.3-0.4 s at
10 000 shards). Now each change is one small checksummed record (``order/<seq>.json``) and the
snapshot is rewritten once every ``FOLD_EVERY`` records (speechdata.quality.near_dup_index_order).

Both paths run on the same index of N committed shards, on a local data root, timing only the
order's part of a shard's run (its entries file and segment cost the same in both): ``reserve``
(index lock, read the order, append the reserved row) then ``commit`` (index lock, read the order,
the committed row). The baseline is the earlier code path: read ``shards.parquet`` whole and write
it whole, each time. The new path's figure is the mean over ``--shards`` consecutive shards, so the
snapshot rewrites it does every ``FOLD_EVERY`` records are counted in it (``max_ms``: the slowest
shard, one that folded). ``lock_held_ms``: the time inside the index lock per shard.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from benchmarks.report import emit, progress, ratio, stdout_to_stderr


def _index_of(url: str, shards: int) -> None:
    from speechdata.io.storage import DataRoot
    from speechdata.quality import near_dup_index_order as order

    root = DataRoot(url)
    listed = [
        order.IndexedShard(p, f"shard-{p:07d}", f"{p:016x}", 1_000, order.COMMITTED, f"L1-{p // 8:016x}.seg")
        for p in range(shards)
    ]
    order._write_state(root, listed)


def _earlier_write(root, shards) -> None:
    import pyarrow as pa

    from speechdata.io import layout
    from speechdata.quality import near_dup_index_order as order

    rows = [order._row_of(shard) for shard in sorted(shards, key=lambda s: s.position)]
    root.write_parquet(layout.near_duplicates_index_order(), pa.Table.from_pylist(rows, schema=order.ORDER_SCHEMA))


def _earlier_read(root):
    from speechdata.io import layout
    from speechdata.quality import near_dup_index_order as order

    return [order._shard_of(row) for row in root.read_parquet(layout.near_duplicates_index_order()).to_pylist()]


def _one_shard(root, shard_id: str, earlier: bool) -> tuple[float, float]:
    """Reserve then commit ``shard_id`` (the order's part); (wall seconds, seconds inside the lock)."""
    from speechdata.quality import near_dup_index_order as order

    held = 0.0
    started = time.perf_counter()
    position = None
    for step in ("reserve", "commit"):
        with order.corpus_index_lock(root):
            locked = time.perf_counter()
            if earlier:  # the earlier code: every row read and written
                state = _earlier_read(root)
                position = max(s.position for s in state) + 1 if position is None else position
            else:  # what reserve_position and commit_shard_entries do now
                head = order._read_head(root, shard_id)
                position = head.next_position if head.mine is None else head.mine.position
            if step == "reserve":
                row = order.IndexedShard(position, shard_id, None, 0, order.RESERVED, None, "token")
            else:
                row = order.IndexedShard(position, shard_id, "0" * 16, 1_000, order.COMMITTED, "L0-x.seg")
            if earlier:
                _earlier_write(root, [s for s in state if s.shard_id != shard_id] + [row])
            else:
                order._append(root, head, [row])
            held += time.perf_counter() - locked
    return time.perf_counter() - started, held


def measure(listed: int, shards: int, earlier_shards: int) -> dict:
    from speechdata.io.storage import DataRoot
    from speechdata.quality import near_dup_index_order as order

    figures = {}
    for name, earlier, count in (("earlier", True, earlier_shards), ("records", False, shards)):
        with tempfile.TemporaryDirectory() as folder:
            _index_of(folder, listed)
            root = DataRoot(folder)
            timings = [_one_shard(root, f"new-{n}", earlier) for n in range(count)]
            assert len(order.read_state(root)) == listed + count
        walls = [wall for wall, _ in timings]
        figures[name] = {
            "shards": count,
            "mean_ms": round(1_000 * statistics.fmean(walls), 2),
            "max_ms": round(1_000 * max(walls), 2),
            "lock_held_ms": round(1_000 * statistics.fmean(held for _, held in timings), 2),
        }
        progress(f"{listed} listed, {name}: {figures[name]}")
    figures["records_over_earlier_mean"] = ratio(figures["records"]["mean_ms"], figures["earlier"]["mean_ms"])
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,10000", help="shards listed in the order")
    parser.add_argument("--shards", type=int, default=128, help="new shards per size (new path)")
    parser.add_argument("--earlier-shards", type=int, default=16, help="new shards per size (baseline)")
    parser.add_argument("--quick", action="store_true", help="100 and 1 000 listed, a few shards")
    args = parser.parse_args(argv)
    from speechdata.quality.near_dup_index_order import FOLD_EVERY

    if args.quick:
        args.sizes, args.shards, args.earlier_shards = "100,1000", 40, 4
    sizes = [int(size) for size in args.sizes.split(",")]
    with stdout_to_stderr():
        per_size = {str(size): measure(size, args.shards, args.earlier_shards) for size in sizes}
    largest, smallest = per_size[str(sizes[-1])], per_size[str(sizes[0])]
    emit(
        "near_duplicates_order",
        {"sizes": sizes, "shards": args.shards, "earlier_shards": args.earlier_shards, "fold_every": FOLD_EVERY},
        {
            "per_size": per_size,
            "growth": {
                "records_mean": ratio(largest["records"]["mean_ms"], smallest["records"]["mean_ms"]),
                "earlier_mean": ratio(largest["earlier"]["mean_ms"], smallest["earlier"]["mean_ms"]),
            },
            "records_over_earlier_mean_at_largest": largest["records_over_earlier_mean"],
        },
    )


if __name__ == "__main__":
    main()
