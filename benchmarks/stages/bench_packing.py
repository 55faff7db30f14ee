"""Packing a shard end to end (``iter_bridge_samples`` + ``pack_samples``) at several shard sizes.

Why: packing joins the shard's audio container, both feature stores, the frame grids and the
utterance index by key and writes WebDataset tars. It must cost the same per utterance at any
shard size (no re-reading inputs per batch of keys) and hold bounded memory, and it should stay
near the floor of moving the same bytes.

Input, per size (``--sizes``): a synthetic shard at production sizes, built before any timing by
:func:`speechdata.testing.packing_inputs.write_packing_inputs`: ``--seconds`` s utterances of
24 kHz audio stored as ``--codec`` (pcm16, the default storage codec), float16 Qwen states
``[3 tokens/s, --qwen-dim]``, float16 WavLM ``[12.5 frames/s, 1024]``, grids and index rows. The
audio container is written out of key order (reversed within blocks of 50), as ingest orders it
by source file, so the reorder buffer is exercised.

Cache conditions, the same for both timed phases at every size: before each phase, untimed,
``os.sync()`` then ``posix_fadvise(POSIX_FADV_DONTNEED)`` on every file under the shard's root (the
inputs, and the tars of an earlier phase), so every phase reads its inputs from disk and starts with
no dirty pages of another phase. Without it, small shards read from the page cache and the largest
(25 GB of inputs and tars) from disk, and the copy baseline read the tars packing had just written:
cost per utterance then measured the cache, not the code.

Timed (wall-clock), each in a fresh process so its peak RSS (``ru_maxrss``) is the packing's own,
each until its outputs are on disk (``fsync`` of every output file inside the timing): a 1 000-utterance
shard's 0.7 GB of writes otherwise end in the page cache and a 20 000-utterance shard's 14 GB are
throttled to the disk's write-back speed half-way, so cost per utterance measured the dirty-page
limit, not the code. The time until the last write returned is reported beside it (``returned_*``);
packing's own tar writer paces its write-back and syncs each tar before it returns
(:mod:`speechdata.io.write_back`), so for packing the two are the same and the copy's fsync is its
own. The packing process's CPU seconds (user + system, all its threads; and system alone) are reported per
utterance too: less at the mercy of other processes on a shared machine than wall-clock.
``--write-back-mib`` sets packing's write-back window (0: writes not paced, one sync at the end) and
``--drop-written`` drops written ranges from the page cache, to compare.

* pack: ``pack_samples(root, shard, iter_bridge_samples(root, shard))``, audio decoding (FLAC only)
  and member encoding included, tars of at most 1 GB (the stage's default);
* copy, the baseline: the same reads and writes without the work in between: every byte of the
  files packing reads (the five inputs and the alignments) read in 1 MiB pieces, and written out
  as files of exactly the tars' sizes (the read stream wraps around if the inputs are smaller),
  each deleted after timing.

Reported per size: ms per utterance of both, MB/s (1e6 bytes of tar per second), ``pack_over_copy``
(throughput of packing / throughput of the copy), packing's CPU ms per utterance and peak RSS in MB;
across sizes, ``ms_per_utt_spread`` (largest / smallest ms per utterance, 1 = flat), the copy's
spread (what the disk alone varies), ``cpu_ms_per_utt_spread`` and ``rss_spread``; the same for
the ``returned`` times.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from benchmarks.report import emit, leave_measured, peak_rss_mb, progress, ratio, stdout_to_stderr

MB = 1e6
COPY_BUFFER = 1 << 20


def _child_build(root: str, count: int, args) -> None:
    from speechdata.io.storage import DataRoot
    from speechdata.testing.packing_inputs import write_packing_inputs

    write_packing_inputs(
        DataRoot(root), "bench", count, seconds=args.seconds, qwen_dim=args.qwen_dim, codec=args.codec,
        audio_order="blocks",
    )  # fmt: skip


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _child_pack(root: str, write_back_mib: float | None, drop_written: bool) -> dict:
    import pandas  # noqa: F401  pyarrow imports it lazily on first read: process start-up, not packing

    from speechdata.bridge.tars import iter_bridge_samples, pack_samples
    from speechdata.io import write_back
    from speechdata.io.storage import DataRoot

    if write_back_mib == 0:
        write_back.SYNC_FILE_RANGE = None  # unpaced writes, the fsync at the end only
    elif write_back_mib is not None:
        write_back.WRITE_BACK_WINDOW_BYTES = int(write_back_mib * (1 << 20))
    write_back.DROP_WRITTEN = drop_written

    data_root = DataRoot(root)
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    tars, index = pack_samples(data_root, "bench", iter_bridge_samples(data_root, "bench"))
    returned = time.perf_counter() - started
    for tar in tars:
        _fsync(data_root.path(tar.relative))
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "returned_seconds": returned,
        "samples": index.num_rows,
        "tars": [data_root.path(t.relative) for t in tars],
        "bytes": sum(t.bytes for t in tars),
        "tar_sizes": [t.bytes for t in tars],
        "max_rss_mb": peak_rss_mb(),
        "user_seconds": usage.ru_utime - before.ru_utime,
        "system_seconds": usage.ru_stime - before.ru_stime,
    }


def _run_child(*argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.stages.bench_packing", *argv], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise RuntimeError(f"child {argv} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def evict_from_page_cache(root: Path) -> None:
    """Write back, then drop from the page cache, every file under ``root`` (Linux; elsewhere a no-op)."""
    os.sync()
    if not hasattr(os, "posix_fadvise"):
        return
    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def packing_inputs(root: Path) -> list[Path]:
    """The files ``iter_bridge_samples`` reads: everything of the shard but what packing wrote."""
    return sorted(p for p in (root / "shards").rglob("*.parquet") if "bridge" not in p.name)


def _input_pieces(inputs: list[Path]) -> Iterator[bytes]:
    """Every input byte in 1 MiB pieces, file after file, then again from the start if more are asked."""
    while True:
        for path in inputs:
            with open(path, "rb") as handle:
                while piece := handle.read(COPY_BUFFER):
                    yield piece


def _copy(inputs: list[Path], output_sizes: list[int], out_dir: Path) -> tuple[float, float]:
    """Read every input byte once and write files of ``output_sizes`` from that stream.

    Seconds until the outputs are on disk, and until the writes returned (into the page cache)."""
    input_bytes = sum(p.stat().st_size for p in inputs)
    started = time.perf_counter()
    pieces = _input_pieces(inputs)
    read, carry = 0, memoryview(b"")
    for number, size in enumerate(output_sizes):
        with open(out_dir / f"copy-{number}.bin", "wb") as dst:
            left = size
            while left:
                if not carry:
                    carry = memoryview(next(pieces))
                    read += len(carry)
                n = min(len(carry), left)
                dst.write(carry[:n])
                carry, left = carry[n:], left - n
    while read < input_bytes:  # inputs not needed for the outputs' size are read all the same
        read += len(next(pieces))
    returned = time.perf_counter() - started
    for number in range(len(output_sizes)):
        _fsync(str(out_dir / f"copy-{number}.bin"))
    seconds = time.perf_counter() - started
    for number in range(len(output_sizes)):
        os.remove(out_dir / f"copy-{number}.bin")
    return seconds, returned


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shards and small features, for smoke runs")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000], help="utterances per shard")
    parser.add_argument("--seconds", type=float, default=8.0, help="utterance length")
    parser.add_argument("--qwen-dim", type=int, default=2048)
    parser.add_argument("--codec", default="pcm16", help="audio container codec (pcm16 is the default)")
    parser.add_argument(
        "--write-back-mib", type=float, default=None,
        help="packing's write-back window in MiB (0: writes not paced; default: the code's own)",
    )  # fmt: skip
    parser.add_argument("--drop-written", action="store_true", help="packing drops written ranges from the cache")
    parser.add_argument("--child", nargs=2, metavar=("ACTION", "ROOT"), help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick and not args.child:
        args.sizes, args.seconds, args.qwen_dim = [40, 120], 2.0, 64
    return args


def run_child_action(args: argparse.Namespace) -> None:
    """A child's work: build a shard's inputs, or pack them and print the figures."""
    action, root = args.child
    if action == "build":
        _child_build(root, args.count, args)
        print(json.dumps({}))
    else:
        print(json.dumps(_child_pack(root, args.write_back_mib, args.drop_written)))
    leave_measured()


def measure_size(args: argparse.Namespace, count: int) -> dict:
    """One shard of ``count`` utterances built, packed and copied, each from a cold page cache."""
    with tempfile.TemporaryDirectory(prefix="bench-packing-", dir=os.environ.get("BENCH_TMP")) as tmp:
        common = ["--seconds", str(args.seconds), "--qwen-dim", str(args.qwen_dim), "--codec", args.codec]
        _run_child("--child", "build", tmp, "--count", str(count), *common)
        evict_from_page_cache(Path(tmp))
        window = [] if args.write_back_mib is None else ["--write-back-mib", str(args.write_back_mib)]
        window += ["--drop-written"] if args.drop_written else []
        packed = _run_child("--child", "pack", tmp, *window)
        evict_from_page_cache(Path(tmp))
        copy_s, copy_returned_s = _copy(packing_inputs(Path(tmp)), packed["tar_sizes"], Path(tmp))
        input_mb = sum(p.stat().st_size for p in packing_inputs(Path(tmp))) / MB
        shutil.rmtree(Path(tmp), ignore_errors=True)
    samples = packed["samples"]
    pack_mb_s = packed["bytes"] / MB / packed["seconds"]
    copy_mb_s = packed["bytes"] / MB / copy_s
    return {
        "tar_mb": round(packed["bytes"] / MB, 1),
        "input_mb": round(input_mb, 1),
        "tars": len(packed["tars"]),
        "pack_seconds": round(packed["seconds"], 2),
        "ms_per_utt": round(1000 * packed["seconds"] / samples, 3),
        "copy_ms_per_utt": round(1000 * copy_s / samples, 3),
        "pack_mb_per_s": round(pack_mb_s, 1),
        "copy_mb_per_s": round(copy_mb_s, 1),
        "pack_over_copy": ratio(pack_mb_s, copy_mb_s),
        "returned_ms_per_utt": round(1000 * packed["returned_seconds"] / samples, 3),
        "copy_returned_ms_per_utt": round(1000 * copy_returned_s / samples, 3),
        "returned_pack_over_copy": ratio(copy_returned_s, packed["returned_seconds"]),
        "cpu_ms_per_utt": round(1000 * (packed["user_seconds"] + packed["system_seconds"]) / samples, 3),
        "system_ms_per_utt": round(1000 * packed["system_seconds"] / samples, 3),
        "max_rss_mb": round(packed["max_rss_mb"], 1),
    }


def spreads(per_size: dict) -> dict:
    """How flat each figure stays across the sizes (largest over smallest), and the worst pack/copy."""

    def spread(key: str) -> float | None:
        values = [v[key] for v in per_size.values()]
        return ratio(max(values), min(values))

    return {
        "ms_per_utt_spread": spread("ms_per_utt"),
        "copy_ms_per_utt_spread": spread("copy_ms_per_utt"),
        "rss_spread": spread("max_rss_mb"),
        "cpu_ms_per_utt_spread": spread("cpu_ms_per_utt"),
        "pack_over_copy_min": min(v["pack_over_copy"] for v in per_size.values()),
        "returned_ms_per_utt_spread": spread("returned_ms_per_utt"),
        "returned_pack_over_copy_min": min(v["returned_pack_over_copy"] for v in per_size.values()),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    if args.child:
        run_child_action(args)
        return
    per_size = {}
    with stdout_to_stderr():
        for count in args.sizes:
            per_size[str(count)] = measure_size(args, count)
            progress(f"{count} utterances: {per_size[str(count)]}")
    emit(
        "packing",
        {
            "quick": args.quick,
            "sizes": args.sizes,
            "seconds": args.seconds,
            "qwen_dim": args.qwen_dim,
            "wavlm_dim": 1024,
            "codec": args.codec,
            "audio_order": "blocks of 50 reversed",
            "cache": "inputs and tars evicted before each phase",
            "write_back_mib": args.write_back_mib,
            "drop_written": args.drop_written,
        },
        {"per_size": per_size, **spreads(per_size)},
    )


if __name__ == "__main__":
    main()
