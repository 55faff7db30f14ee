"""Ingest's peak memory against the size of its input: it must stay flat.

Why: a shard of 200 000 short rows cut from 32 long landed files grew ingest to 6 GB (every task's
results held at once) until a worker died. Ingest now streams (speechdata.landing.normalize): a
bounded window of tasks, each bounded in rows and source seconds. This lands shards of ``--files``
long WAV files (24 kHz mono 16-bit, so no resampling hides the I/O) cut into 0.5 s rows, at
``--rows-per-file`` sizes, runs ``run_raw_shards`` + ``run_normalized_audio(workers=2)`` in a
fresh subprocess per size, and reports its peak resident memory (``VmHWM`` of the process and
``ru_maxrss`` of its largest decoding worker) beside the baseline: the size of the landed audio, what
memory would track if ingest held its input.

Why ``VmHWM`` and not the process's own ``ru_maxrss``: Linux carries a parent's peak RSS across
fork and exec into the child's ``ru_maxrss``, so a subprocess started by a process that has just
built a large shard reports that process's peak. ``VmHWM`` belongs to the new address space. The
workers' ``ru_maxrss`` has the same floor (the ingesting process's RSS when the pool starts), which
is the same at every size.

``python -m benchmarks.stages.bench_ingest_memory --measure ROOT SHARD --workers N`` is the subprocess: it
ingests one landed shard and prints its peak RSS as JSON (the test in
tests/integration/test_ingest_memory.py uses it too).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import soundfile as sf

from benchmarks.report import children_peak_rss_mb, emit, leave_measured, peak_rss_mb, progress, ratio, stdout_to_stderr
from speechdata.io import layout
from speechdata.io.storage import DataRoot

SHARD_ID = "bench-memory"
SAMPLE_RATE = 24_000
ROW_S = 0.5
ROOT = Path(__file__).resolve().parents[2]


def land_long_files_shard(root: DataRoot, shard_id: str, files: int, rows_per_file: int, row_s: float = ROW_S) -> int:
    """Land ``files`` WAVs of ``rows_per_file * row_s`` seconds, each cut into rows; the landed bytes."""
    seconds = rows_per_file * row_s
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    samples = (0.3 * np.sin(2 * np.pi * 220 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)
    with tempfile.SpooledTemporaryFile() as buffer:
        sf.write(buffer, samples, SAMPLE_RATE, format="WAV", subtype="PCM_16")
        buffer.seek(0)
        wav = buffer.read()
    rows: dict[str, list] = {"utt_id": [], "audio_path": [], "text": [], "start_s": [], "end_s": []}
    for f in range(files):
        name = f"long-{f:03d}.wav"
        root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{name}", wav)
        for r in range(rows_per_file):
            rows["utt_id"].append(f"f{f:03d}-r{r:06d}")
            rows["audio_path"].append(name)
            rows["text"].append("a short row")
            rows["start_s"].append(r * row_s)
            rows["end_s"].append((r + 1) * row_s)
    root.write_parquet(layout.landing_metadata(shard_id), pa.table(rows))
    root.write_bytes(layout.landing_success_marker(shard_id), b"")
    return len(wav) * files


def measure_in_subprocess(root_dir: str, shard_id: str, workers: int) -> dict:
    """Peak RSS (MB) of ingesting one landed shard in a fresh interpreter: ``self`` and ``workers``."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.stages.bench_ingest_memory",
            "--measure",
            root_dir,
            shard_id,
            "--workers",
            str(workers),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _measure(root_dir: str, shard_id: str, workers: int) -> None:
    from speechdata.landing.ingest import run_normalized_audio, run_raw_shards

    root = DataRoot(root_dir)
    started = time.perf_counter()
    with stdout_to_stderr():
        run_raw_shards(root, shard_id)
        summary = run_normalized_audio(root, shard_id, workers=workers)
    # ru_maxrss is in KiB on Linux; RUSAGE_CHILDREN is the largest reaped worker
    print(
        json.dumps(
            {
                "peak_rss_mb": peak_rss_mb(),
                "peak_worker_rss_mb": children_peak_rss_mb(),
                "rows_out": summary.rows_out,
                "seconds": time.perf_counter() - started,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=32)
    parser.add_argument("--rows-per-file", type=int, nargs="+", default=[20, 200, 600])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="two small sizes (smoke test)")
    parser.add_argument("--measure", nargs=2, metavar=("ROOT", "SHARD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure(args.measure[0], args.measure[1], args.workers)
        leave_measured()
    sizes = [20, 80] if args.quick else args.rows_per_file
    per_size = []
    for rows_per_file in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-ingest-memory-") as tmp:
            root = DataRoot(tmp)
            landed_bytes = land_long_files_shard(root, SHARD_ID, args.files, rows_per_file)
            progress(f"{args.files} files x {rows_per_file} rows: {landed_bytes / 2**20:.0f} MB landed")
            figures = measure_in_subprocess(tmp, SHARD_ID, args.workers)
            per_size.append(
                {
                    "rows": args.files * rows_per_file,
                    "landed_mb": round(landed_bytes / 2**20, 1),
                    "peak_rss_mb": round(figures["peak_rss_mb"], 1),
                    "peak_worker_rss_mb": round(figures["peak_worker_rss_mb"], 1),
                    "seconds": round(figures["seconds"], 2),
                }
            )
    first, last = per_size[0], per_size[-1]
    emit(
        "ingest_memory",
        {"files": args.files, "rows_per_file": sizes, "row_s": ROW_S, "workers": args.workers},
        {
            "per_size": per_size,
            "rows_growth": ratio(last["rows"], first["rows"]),
            "landed_growth": ratio(last["landed_mb"], first["landed_mb"]),
            "peak_rss_growth": ratio(last["peak_rss_mb"], first["peak_rss_mb"]),
            "peak_worker_rss_growth": ratio(last["peak_worker_rss_mb"], first["peak_worker_rss_mb"]),
        },
    )


if __name__ == "__main__":
    main()
