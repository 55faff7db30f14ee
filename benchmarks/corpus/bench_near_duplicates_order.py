"""A shard's reservation and commit in the near-duplicate index's shard list, at N shards listed:
the partitioned snapshot against the single-file snapshot it replaced, in one run.

Why: each reservation and commit appends one small checksummed record (``order/<seq>.json``), but
with one ``shards.parquet`` snapshot every reservation still read the whole snapshot (Arrow columns,
O(N)) and every 64th record rewrote it whole (O(N/64) amortized): 2.9-3.0x per shard from 100 to
10 000 shards. Now the snapshot is parts of 2 048 positions under a small head (``shard_list/``): a
reservation or commit reads the head (which lists the reserved rows) and the records, a re-run also
the one part holding its position; a fold rewrites the parts its records touch, the last one mostly
(speechdata.quality.near_dup_order_fold).

Both paths run on an order of N committed shards on a local data root, each path in a fresh
interpreter with its sizes in turns (``--rounds``: the load of a shared machine falls on all alike), timing only the order's part
of a shard's run (its entries file and segment cost the same in both): ``reserve`` (index lock, read
what a reservation reads, append the reserved row) then ``commit`` (index lock, read, the committed
row). The baseline is the earlier code path, kept here: the snapshot's columns read whole, the
record appended, the whole snapshot rewritten by every 64th record. Each figure is the mean over
``--shards`` consecutive shards (the commit record each commit writes included), so the folds are
counted in it (``max_ms``: the slowest shard, one that folded); ``lock_held_ms``: the time inside
the index lock per shard. ``whole_read_ms``: one ``read_state`` of every row, for comparison.

``reader_wait`` (partitioned layout): what a new shard's ``IndexReader`` and ``wait_for_earlier``
read of the shard list outside the lock, per shard, at the order's new end: ``whole_ms`` the earlier
code (``read_state`` of every row, twice, each row an object), ``directory_ms`` now (the head, the
records and the part holding the position, twice; every other part from the head's summary of it).
The listed shards map to segments as tiered compaction leaves them. ``segment_headers``: every live
segment's header read, as by a lookup whose keys hit each one (the headers list their shards: 32 768
in a level-5 segment): ``objects_ms`` the earlier code (a row object per shard listed),
``positions_ms`` now (the positions parsed as one array; a shard's id and version only for the
shards a posting names). ``entries_cleanup``: a commit's removal of its shard's other entries files
with one entries file per listed shard in the folder: ``listing_ms`` the earlier code (the folder
listed), ``noted_ms`` now (the shard's own list of the versions it wrote).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.report import emit, leave_measured, progress, ratio, stdout_to_stderr

EARLIER_FOLD_EVERY = 64


def _tiered_segments(shards: int) -> list[str]:
    """Each position's segment as tiered compaction (``FANOUT`` 8) leaves them: blocks of 8**k
    positions, the largest first (a few dozen segments at 100 000 shards)."""
    names, start = [], 0
    for level in range(8, -1, -1):
        while start + 8**level <= shards:
            names += [f"L{level}-{start:016x}.seg"] * 8**level
            start += 8**level
    return names


def _listed(shards: int) -> list:
    from speechdata.quality import near_dup_index_order as order

    return [
        order.IndexedShard(p, f"shard-{p:07d}", f"{p:016x}", 1_000, order.COMMITTED, segment)
        for p, segment in enumerate(_tiered_segments(shards))
    ]


def _reader_part(root, position: int, whole: bool) -> float:
    """What a new shard's reader and wait read of the shard list (outside the lock): the reader's
    state when it is built, the state ``wait_for_earlier`` returns, each taken as the reader's
    settle takes it, and the utterances before ``position``; seconds. ``whole``: the earlier code
    (``read_state`` of every row, each time)."""
    from speechdata.quality import near_dup_index_order as order
    from speechdata.quality.near_dup_order_directory import read_directory

    started = time.perf_counter()
    for _ in ("reader", "wait"):
        if whole:
            state = order.read_state(root)
            shards = {s.position: s for s in state if s.state == order.COMMITTED and s.position < position}
            segments = {s.segment for s in shards.values()}
            utterances = sum(s.utterances for s in shards.values())
        else:
            directory = read_directory(root, position)
            segments = set(directory.segments(position))
            utterances = directory.utterances(position)
    assert segments and utterances > 0
    return time.perf_counter() - started


def _earlier_snapshot(root, shards, through: int) -> None:
    """The earlier layout: one ``shards.parquet`` of every row, through record ``through``."""
    import pyarrow as pa

    from speechdata.io import layout
    from speechdata.quality import near_dup_index_order as order

    rows = [order._row_of(shard) for shard in sorted(shards, key=lambda s: s.position)]
    schema = order.ORDER_SCHEMA.with_metadata({order.THROUGH_KEY: str(through).encode()})
    root.write_parquet(layout.near_duplicates_index_order(), pa.Table.from_pylist(rows, schema=schema))


def _earlier_read(root, shard_id: str):
    """What the earlier code read for a reservation or a commit: the whole snapshot's columns (Arrow),
    then the records after it; (through, last, next position, the shard's row)."""
    import pyarrow.compute as pc

    from speechdata.io import layout
    from speechdata.quality import near_dup_index_order as order

    table = root.read_parquet(layout.near_duplicates_index_order())
    through = int(table.schema.metadata[order.THROUGH_KEY])
    later = sorted(seq for seq in order._listed_records(root) if seq > through)
    upserted = {}
    for seq in later:
        body = order._unsealed(root.fs.cat_file(root.path(order._record_relative(seq))))
        for row in body["upsert"]:
            upserted[row["shard_id"]] = order._shard_of(row)
    ids = table.column("shard_id")
    highest = max([pc.max(table.column("position")).as_py(), *(s.position for s in upserted.values())])
    mine = upserted.get(shard_id)
    if mine is None:
        rows = table.filter(pc.equal(ids, shard_id)).to_pylist()
        mine = order._shard_of(rows[0]) if rows else None
    return through, through + len(later), highest + 1, mine


def _earlier_append(root, through: int, last: int, row) -> None:
    from speechdata.quality import near_dup_index_order as order

    seq = last + 1
    root.write_bytes(
        order._record_relative(seq), order._sealed({"seq": seq, "upsert": [order._row_of(row)], "remove": []})
    )
    if seq - through >= EARLIER_FOLD_EVERY:
        shards = [order._shard_of(r) for r in root.read_parquet("index/near_duplicates/shards.parquet").to_pylist()]
        for later in range(through + 1, seq + 1):
            body = order._unsealed(root.fs.cat_file(root.path(order._record_relative(later))))
            shards = order._applied(shards, [order._shard_of(r) for r in body["upsert"]], [])
        _earlier_snapshot(root, shards, seq)
        for later in range(through + 1, seq + 1):
            root.fs.rm_file(root.path(order._record_relative(later)))


def _one_shard(root, shard_id: str, earlier: bool) -> tuple[float, float]:
    """Reserve then commit ``shard_id`` (the order's part); (wall seconds, seconds inside the lock)."""
    from speechdata.quality import near_dup_index_order as order

    held = 0.0
    started = time.perf_counter()
    for step in ("reserve", "commit"):
        if step == "reserve" and not earlier:
            order._look_up_membership(root, shard_id)  # the parts' membership filters, before the lock
        with order.corpus_index_lock(root):
            locked = time.perf_counter()
            if earlier:
                through, last, next_position, mine = _earlier_read(root, shard_id)
            else:  # what reserve_position and commit_shard_entries do now
                head = order._read_head(root, shard_id)
                next_position, mine = head.next_position, head.mine
            position = next_position if mine is None else mine.position
            if step == "reserve":
                row = order.IndexedShard(position, shard_id, None, 0, order.RESERVED, None, "token")
            else:
                row = order.IndexedShard(position, shard_id, "0" * 16, 1_000, order.COMMITTED, "L0-x.seg")
                order._write_commit_record(root, row)  # both paths write it (the new one first)
            if earlier:
                _earlier_append(root, through, last, row)
            else:
                order._append(root, head, [row])
            held += time.perf_counter() - locked
    return time.perf_counter() - started, held


def _segment_headers(listed: int) -> list[bytes]:
    """The live segments of an order of ``listed`` shards (tiered), each holding one block of postings
    and listing its shards as a merged segment's header does."""
    import numpy as np

    from speechdata.quality.near_dup_postings import POSTING_DTYPE, SegmentShard, segment_bytes

    by_segment: dict[str, list] = {}
    for shard in _listed(listed):
        by_segment.setdefault(shard.segment, []).append(
            SegmentShard(shard.position, shard.shard_id, shard.entries_version)
        )
    postings = np.zeros(256, POSTING_DTYPE)
    postings["key"] = np.arange(256)
    return [segment_bytes(postings, int(name[1]), shards) for name, shards in sorted(by_segment.items())]


def _headers_read(headers: list[bytes], whole: bool) -> float:
    """Every live segment's header read as a lookup whose keys hit each one: its shards' positions
    (now), or a row object per shard (``whole``: the earlier code); seconds."""
    import io

    from speechdata.quality.near_dup_postings import read_segment_header

    started = time.perf_counter()
    for content in headers:
        shards = read_segment_header(io.BytesIO(content), "segment").shards
        held = len(tuple(shards)) if whole else len(shards.positions)
        assert held
    return time.perf_counter() - started


CLEANUP_REPEATS = 5


def _entries_cleanup(root, listed: int) -> dict:
    """A commit's removal of its shard's other entries files with ``listed`` entries files in the
    folder (empty files: only their names are read): ``listing_ms`` the earlier code (the folder
    listed, every name parsed), ``noted_ms`` now (its version noted before its file is written, then
    the files its list names removed and the list). Medians over :data:`CLEANUP_REPEATS` commits,
    each leaving a killed run's file to remove."""
    from pathlib import Path

    from speechdata.io import layout
    from speechdata.quality.near_dup_index_entries import (
        ENTRIES_VERSION_CHARS,
        note_entries_written,
        remove_unlisted_entries,
        remove_written_entries,
    )

    folder = Path(root.path(layout.near_duplicates_index_entries_dir()))
    folder.mkdir(parents=True, exist_ok=True)
    for p in range(listed):
        (folder / f"shard-{p:07d}-{p:0{ENTRIES_VERSION_CHARS}x}.parquet").touch()
    timings: dict[bool, list[float]] = {True: [], False: []}
    for repeat in range(CLEANUP_REPEATS):
        for earlier in (True, False):
            shard_id = f"cleanup-{repeat}-{int(earlier)}"
            killed, committed = (f"{v:0{ENTRIES_VERSION_CHARS}x}" for v in (1, 2))
            if not earlier:
                note_entries_written(root, shard_id, killed)  # the killed run noted its file
            root.write_bytes(layout.near_duplicates_index_entries(shard_id, killed), b"")
            started = time.perf_counter()
            if earlier:
                removed = remove_unlisted_entries(root, shard_id, committed)
            else:
                note_entries_written(root, shard_id, committed)
                removed = remove_written_entries(root, shard_id, committed)
            timings[earlier].append(time.perf_counter() - started)
            assert removed == 1
    listing, noted = statistics.median(timings[True]), statistics.median(timings[False])
    return {
        "files": listed,
        "listing_ms": round(1_000 * listing, 3),
        "noted_ms": round(1_000 * noted, 3),
        "noted_over_listing": ratio(noted, listing),
    }


PATHS = {"single_file": True, "partitioned": False}
"""Each path's name and whether it is the earlier code."""


def measure_path(name: str, sizes: list[int], shards: int, rounds: int) -> dict:
    """One path at every size, each size on its own index, in turns (``rounds`` turns of
    ``shards / rounds`` shards each), so the load of a shared machine falls on every size alike."""
    from speechdata.io.storage import DataRoot
    from speechdata.quality import near_dup_index_order as order

    earlier = PATHS[name]
    per_turn = max(shards // rounds, 1)
    figures = {}
    with contextlib.ExitStack() as stack:
        roots, timings = {}, {}
        for listed in sizes:
            root = DataRoot(stack.enter_context(tempfile.TemporaryDirectory()))
            if earlier:
                _earlier_snapshot(root, _listed(listed), -1)
            else:
                order._write_state(root, _listed(listed))
            roots[listed], timings[listed] = root, []
        readers: dict[int, dict[bool, list[float]]] = {listed: {True: [], False: []} for listed in sizes}
        headers = {listed: {True: [], False: []} for listed in sizes}
        segment_headers = {} if earlier else {listed: _segment_headers(listed) for listed in sizes}
        for _ in range(rounds):
            for listed, root in roots.items():
                done = len(timings[listed])
                timings[listed] += [_one_shard(root, f"new-{done + n}", earlier) for n in range(per_turn)]
                if not earlier:  # the reader's part at the new end of the order, both ways in turn
                    position = order._read_head(root, "none").next_position
                    for whole in (True, False):
                        readers[listed][whole] += [_reader_part(root, position, whole) for _ in range(per_turn)]
                        headers[listed][whole] += [_headers_read(segment_headers[listed], whole) for _ in range(2)]
        for listed, root in roots.items():
            started = time.perf_counter()
            state = order.read_state(root)  # the earlier layout read as it is (the new reader reads it)
            whole_read = time.perf_counter() - started
            assert len(state) == listed + per_turn * rounds and state[-1].state == order.COMMITTED
            walls = [wall for wall, _ in timings[listed]]
            figures[str(listed)] = {
                "shards": len(walls),
                "mean_ms": round(1_000 * statistics.fmean(walls), 2),
                "median_ms": round(1_000 * statistics.median(walls), 2),
                "max_ms": round(1_000 * max(walls), 2),
                "lock_held_ms": round(1_000 * statistics.fmean(held for _, held in timings[listed]), 2),
                "whole_read_ms": round(1_000 * whole_read, 1),
            }
            if not earlier:
                figures[str(listed)]["reader_wait"] = {
                    "whole_ms": round(1_000 * statistics.fmean(readers[listed][True]), 2),
                    "directory_ms": round(1_000 * statistics.fmean(readers[listed][False]), 2),
                    "whole_median_ms": round(1_000 * statistics.median(readers[listed][True]), 2),
                    "directory_median_ms": round(1_000 * statistics.median(readers[listed][False]), 2),
                    "directory_max_ms": round(1_000 * max(readers[listed][False]), 2),
                    "directory_over_whole": ratio(
                        statistics.fmean(readers[listed][False]), statistics.fmean(readers[listed][True])
                    ),
                }
                figures[str(listed)]["entries_cleanup"] = _entries_cleanup(root, listed)
                figures[str(listed)]["segment_headers"] = {
                    "segments": len(segment_headers[listed]),
                    "objects_ms": round(1_000 * statistics.fmean(headers[listed][True]), 2),
                    "positions_ms": round(1_000 * statistics.fmean(headers[listed][False]), 2),
                    "positions_over_objects": ratio(
                        statistics.fmean(headers[listed][False]), statistics.fmean(headers[listed][True])
                    ),
                }
    return figures


def _in_child(name: str, sizes: list[int], shards: int, rounds: int) -> dict:
    """``measure_path`` in a fresh interpreter: one path's garbage (the earlier path's 100 000-row
    rewrites) never slows the other's allocations."""
    command = [sys.executable, "-m", "benchmarks.corpus.bench_near_duplicates_order", "--measure", name]
    command += ["--sizes", ",".join(map(str, sizes)), "--shards", str(shards), "--rounds", str(rounds)]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


GROWTH_FIGURES = {
    "partitioned_mean": ("partitioned", "mean_ms"),
    "partitioned_median": ("partitioned", "median_ms"),
    "single_file_mean": ("single_file", "mean_ms"),
    "reader_wait_whole": ("partitioned", "reader_wait", "whole_ms"),
    "reader_wait_directory": ("partitioned", "reader_wait", "directory_ms"),
    "reader_wait_directory_median": ("partitioned", "reader_wait", "directory_median_ms"),
    "segment_headers_objects": ("partitioned", "segment_headers", "objects_ms"),
    "entries_cleanup_listing": ("partitioned", "entries_cleanup", "listing_ms"),
    "entries_cleanup_noted": ("partitioned", "entries_cleanup", "noted_ms"),
    "segment_headers_positions": ("partitioned", "segment_headers", "positions_ms"),
}
"""Each growth figure (largest size over smallest) and where it sits in a size's record."""


def growth(largest: dict, smallest: dict, *path: str) -> float | None:
    for key in path:
        largest, smallest = largest[key], smallest[key]
    return ratio(largest, smallest)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,10000,100000", help="shards listed in the order")
    parser.add_argument("--shards", type=int, default=128, help="new shards per size and path")
    parser.add_argument("--rounds", type=int, default=8, help="turns taken over the sizes")
    parser.add_argument("--quick", action="store_true", help="100 and 1 000 listed, a few shards")
    parser.add_argument("--measure", choices=sorted(PATHS), help=argparse.SUPPRESS)  # a measurement child
    args = parser.parse_args(argv)
    from speechdata.quality.near_dup_order_fold import FOLD_EVERY, PART_ROWS

    if args.quick:
        args.sizes, args.shards, args.rounds = "100,1000", 8, 2
    sizes = [int(size) for size in args.sizes.split(",")]
    if args.measure:
        with stdout_to_stderr():
            figures = measure_path(args.measure, sizes, args.shards, args.rounds)
        print(json.dumps(figures), flush=True)
        leave_measured()
    by_path = {}
    for name in PATHS:
        by_path[name] = _in_child(name, sizes, args.shards, args.rounds)
        progress(f"{name}: {by_path[name]}")
    per_size = {
        str(size): {
            **{name: by_path[name][str(size)] for name in PATHS},
            "partitioned_over_single_file_mean": ratio(
                by_path["partitioned"][str(size)]["mean_ms"], by_path["single_file"][str(size)]["mean_ms"]
            ),
        }
        for size in sizes
    }
    largest, smallest = per_size[str(sizes[-1])], per_size[str(sizes[0])]
    emit(
        "near_duplicates_order",
        {
            "sizes": sizes,
            "shards": args.shards,
            "rounds": args.rounds,
            "fold_every": FOLD_EVERY,
            "part_rows": PART_ROWS,
        },
        {
            "per_size": per_size,
            "growth": {name: growth(largest, smallest, *path) for name, path in GROWTH_FIGURES.items()},
            "partitioned_over_single_file_mean_at_largest": largest["partitioned_over_single_file_mean"],
        },
    )


if __name__ == "__main__":
    main()
