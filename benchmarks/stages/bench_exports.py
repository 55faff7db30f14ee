"""Export throughput (audio hours per minute) of each trainer export against a plain copy of the same bytes.

Why: an export reads every selected sample's tar and writes the trainer's layout; how far it stays
from moving those bytes once tells whether exporting a corpus is a coffee break or a day.

Input, built before any timing: a data root with one shard of ``--samples`` synthetic bridge
samples (``bench_tar_writing.build_samples``: 2-15 s of 24 kHz audio, float16 qwen ``[T, --qwen-dim]``
and wavlm ``[F, 1024]``, int32 tokens / grid / dur) packed by ``pack_samples``, with word
alignments in each ``.json`` and the shard's manifest, exactly as the pipeline publishes them.

Timed (wall-clock, ``time.perf_counter``), each into a fresh directory on the same disk:

* ``nemo`` (tarred), ``nemo_plain``, ``lhotse`` (Shar with the five arrays), ``moshi``: the export
  function, progress off;
* copy, the baseline: ``shutil.copyfileobj`` of the shard's bridge tar (every byte the exports read)
  to a new file.

Reported per export: audio hours per minute of wall-clock, seconds, and ``over_copy`` (export
seconds / copy seconds: 1 = the export costs what copying its input costs). Median of ``--repeats``
passes after an untimed warm-up; ``os.sync()`` (untimed) before each pass.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from benchmarks.report import emit, progress, ratio, stdout_to_stderr
from benchmarks.stages.bench_tar_writing import SHARD_ID, build_samples
from speechdata.audio.clock import SAMPLE_RATE
from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.bridge.tars import BridgeSample, pack_samples
from speechdata.export.lhotse import export_lhotse
from speechdata.export.moshi import export_moshi
from speechdata.export.nemo import export_nemo
from speechdata.io.storage import DataRoot

COPY_BUFFER = 1 << 20


def with_words(sample: BridgeSample) -> BridgeSample:
    """The sample with one aligned word per token, as the pipeline publishes them."""
    n_tokens = len(sample.tokens)
    span_ms = len(sample.wav) * 1000 // SAMPLE_RATE // max(n_tokens, 1)
    words = [{"word": "synthetic", "start_ms": i * span_ms, "end_ms": (i + 1) * span_ms} for i in range(n_tokens)]
    return BridgeSample(**{**sample.__dict__, "info": {**sample.info, "words": words}})


def build_root(root: DataRoot, samples: list[BridgeSample]) -> Path:
    # Packed and moved into place directly: the synthetic grids are not real ones, which the
    # pipeline's staged verification would refuse, and what is measured here is the export.
    [packed], index = pack_samples(root, SHARD_ID, iter(samples))
    tar_url = index["tar_url"][0].as_py()
    root.replace(packed.relative, tar_url)
    rows = []
    for sample, entry in zip(samples, index.to_pylist(), strict=True):
        rows.append(
            {
                **entry,
                "shard": SHARD_ID,
                "duration_s": len(sample.wav) / SAMPLE_RATE,
                "n_frames": len(sample.grid),
                "n_tokens": len(sample.tokens),
                "language": "en",
                "country": "us",
                "source": "bench",
                "text": sample.info["text"],
                "alignment_score": -1.0,
                "zero_duration_token_share": 0.0,
                "extra": "{}",
            }
        )
    table = pa.Table.from_pylist(rows, schema=MANIFEST_COLUMNS)
    root.write_parquet(manifest_path(SHARD_ID), table)
    return Path(root.path(tar_url))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 samples and one pass, for smoke runs")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--qwen-dim", type=int, default=2048, help="Qwen hidden size (2048 full, 64 tiny)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.repeats = 20, 1

    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-exports-") as tmp:
        root = DataRoot(f"{tmp}/root")
        samples = [with_words(s) for s in build_samples(args.samples, 2.0, 15.0, args.qwen_dim, args.seed)]
        audio_s = sum(len(s.wav) for s in samples) / SAMPLE_RATE
        tar = build_root(root, samples)
        del samples
        tar_bytes = tar.stat().st_size
        progress(f"{args.samples} samples, {audio_s:.0f} s of audio, {tar_bytes / 1e6:.1f} MB of tar")
        out = Path(tmp) / "out"

        def copy(target: Path) -> None:
            target.mkdir()
            with open(tar, "rb") as src, open(target / "copy.tar", "wb") as dst:
                shutil.copyfileobj(src, dst, COPY_BUFFER)

        methods = {
            "copy": copy,
            "nemo": lambda target: export_nemo(root, str(target), progress=False),
            "nemo_plain": lambda target: export_nemo(root, str(target), tarred=False, progress=False),
            "lhotse": lambda target: export_lhotse(root, str(target), progress=False),
            "moshi": lambda target: export_moshi(root, str(target), progress=False),
        }
        seconds: dict[str, list[float]] = {name: [] for name in methods}
        names = list(methods)
        for repeat in range(args.repeats + 1):
            for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
                shutil.rmtree(out, ignore_errors=True)
                os.sync()
                started = time.perf_counter()
                methods[name](out)
                elapsed = time.perf_counter() - started
                if repeat:  # the first pass warms the page cache and imports
                    seconds[name].append(elapsed)
        progress(f"seconds {seconds}")

    median = {name: statistics.median(values) for name, values in seconds.items()}
    hours_per_minute = {name: round(audio_s / 3600 / (s / 60), 3) for name, s in median.items()}
    emit(
        "exports",
        {"quick": args.quick, "samples": args.samples, "qwen_dim": args.qwen_dim, "repeats": args.repeats},
        {
            "audio_hours": round(audio_s / 3600, 4),
            "tar_mb": round(tar_bytes / 1e6, 1),
            "audio_hours_per_minute": hours_per_minute,
            "seconds": {name: round(s, 3) for name, s in median.items()},
            "over_copy": {name: ratio(s, median["copy"]) for name, s in median.items() if name != "copy"},
        },
    )


if __name__ == "__main__":
    main()
