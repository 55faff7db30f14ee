"""Packing a shard end to end (``iter_bridge_samples`` + ``pack_samples``) at several shard sizes.

Why: packing joins the shard's audio container, both feature stores, the frame grids and the
utterance index by key and writes WebDataset tars. It must cost the same per utterance at any
shard size (no re-reading inputs per batch of keys) and hold bounded memory, and it should stay
near the floor of moving the same bytes.

Input, per size (``--sizes``): a synthetic shard at production sizes, built before any timing by
:func:`speechdata.testing.packing_inputs.write_packing_inputs`: ``--seconds`` s utterances of
24 kHz audio stored as ``--codec`` (FLAC, the default storage codec), float16 Qwen states
``[3 tokens/s, --qwen-dim]``, float16 WavLM ``[12.5 frames/s, 1024]``, grids and index rows. The
audio container is written out of key order (reversed within blocks of 50), as ingest orders it
by source file, so the reorder buffer is exercised.

Timed (wall-clock), each in a fresh process so its peak RSS (``ru_maxrss``) is the packing's own:

* pack: ``pack_samples(root, shard, iter_bridge_samples(root, shard))``, audio decoding and member
  encoding included, tars of at most 1 GB (the stage's default);
* copy, the baseline: ``shutil.copyfileobj`` of the very tars packing wrote, to new files beside
  them (the bytes just written, so mostly read from the page cache), each deleted after timing.

Reported per size: ms per utterance, MB/s (1e6 bytes of tar per second), ``pack_over_copy``
(throughput of packing / throughput of the copy) and peak RSS in MB; across sizes,
``ms_per_utt_spread`` (largest / smallest ms per utterance, 1 = flat) and ``rss_spread``.
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
from pathlib import Path

from benchmarks.report import emit, progress, ratio, stdout_to_stderr

MB = 1e6
COPY_BUFFER = 1 << 20


def _child_build(root: str, count: int, args) -> None:
    from speechdata.io.storage import DataRoot
    from speechdata.testing.packing_inputs import write_packing_inputs

    write_packing_inputs(
        DataRoot(root), "bench", count, seconds=args.seconds, qwen_dim=args.qwen_dim, codec=args.codec,
        audio_order="blocks",
    )  # fmt: skip


def _child_pack(root: str) -> dict:
    import pandas  # noqa: F401  pyarrow imports it lazily on first read: process start-up, not packing

    from speechdata.bridge.tars import iter_bridge_samples, pack_samples
    from speechdata.io.storage import DataRoot

    data_root = DataRoot(root)
    started = time.perf_counter()
    tars, index = pack_samples(data_root, "bench", iter_bridge_samples(data_root, "bench"))
    seconds = time.perf_counter() - started
    return {
        "seconds": seconds,
        "samples": index.num_rows,
        "tars": [data_root.path(t.relative) for t in tars],
        "bytes": sum(t.bytes for t in tars),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _run_child(*argv: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_packing", *argv], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise RuntimeError(f"child {argv} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _copy(tars: list[str]) -> float:
    total = 0.0
    for path in tars:
        os.sync()
        started = time.perf_counter()
        with open(path, "rb") as src, open(path + ".copy", "wb") as dst:
            shutil.copyfileobj(src, dst, COPY_BUFFER)
        total += time.perf_counter() - started
        os.remove(path + ".copy")
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shards and small features, for smoke runs")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000, 20000], help="utterances per shard")
    parser.add_argument("--seconds", type=float, default=8.0, help="utterance length")
    parser.add_argument("--qwen-dim", type=int, default=2048)
    parser.add_argument("--codec", default="flac16", help="audio container codec (flac16 is the default)")
    parser.add_argument("--child", nargs=2, metavar=("ACTION", "ROOT"), help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        action, root = args.child
        if action == "build":
            _child_build(root, args.count, args)
            print(json.dumps({}))
        else:
            print(json.dumps(_child_pack(root)))
        return
    if args.quick:
        args.sizes, args.seconds, args.qwen_dim = [40, 120], 2.0, 64

    per_size = {}
    with stdout_to_stderr():
        for count in args.sizes:
            with tempfile.TemporaryDirectory(prefix="bench-packing-", dir=os.environ.get("BENCH_TMP")) as tmp:
                common = ["--seconds", str(args.seconds), "--qwen-dim", str(args.qwen_dim), "--codec", args.codec]
                _run_child("--child", "build", tmp, "--count", str(count), *common)
                os.sync()
                packed = _run_child("--child", "pack", tmp)
                copy_s = _copy(packed["tars"])
                pack_mb_s = packed["bytes"] / MB / packed["seconds"]
                copy_mb_s = packed["bytes"] / MB / copy_s
                per_size[str(count)] = {
                    "tar_mb": round(packed["bytes"] / MB, 1),
                    "tars": len(packed["tars"]),
                    "pack_seconds": round(packed["seconds"], 2),
                    "ms_per_utt": round(1000 * packed["seconds"] / packed["samples"], 3),
                    "pack_mb_per_s": round(pack_mb_s, 1),
                    "copy_mb_per_s": round(copy_mb_s, 1),
                    "pack_over_copy": ratio(pack_mb_s, copy_mb_s),
                    "max_rss_mb": round(packed["max_rss_mb"], 1),
                }
                progress(f"{count} utterances: {per_size[str(count)]}")
                shutil.rmtree(Path(tmp), ignore_errors=True)

    ms = [v["ms_per_utt"] for v in per_size.values()]
    rss = [v["max_rss_mb"] for v in per_size.values()]
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
        },
        {
            "per_size": per_size,
            "ms_per_utt_spread": ratio(max(ms), min(ms)),
            "rss_spread": ratio(max(rss), min(rss)),
            "pack_over_copy_min": min(v["pack_over_copy"] for v in per_size.values()),
        },
    )


if __name__ == "__main__":
    main()
