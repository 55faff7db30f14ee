"""Bridge tar packing throughput against a plain copy of the same bytes on the same disk.

Why: ``pack_samples`` is the last stage before training reads the data, and a shard's tars are
hundreds of MB to GB. Besides writing, it encodes every member (WAV, ``.npy``, JSON), builds tar
headers and hashes the stream with SHA-256. This measures how far that stays from the floor, which
is moving the same number of bytes onto the same disk.

Input: ``--samples`` :class:`BridgeSample` objects with random contents of realistic size, built
before any timing: utterances of ``--min-s`` .. ``--max-s`` seconds of float32 24 kHz audio,
float16 ``qwen`` ``[T, --qwen-dim]`` (T = ~3 tokens per second), float16 ``wavlm`` ``[F, 1024]``
(F = Mimi frames at 12.5 Hz), int32 tokens / grid / dur and the JSON info the stage writes.
For 2-15 s utterances and the production width (2048) that is ~0.75 MB of tar per sample.

Timed (wall-clock, ``time.perf_counter``), in a temporary directory on one disk:

* pack: ``pack_samples`` into a temporary ``DataRoot``, member encoding included (the samples hold
  arrays; the npy / wav / json bytes are made inside ``pack_samples``);
* copy, the baseline: ``shutil.copyfileobj`` of a tar of the same bytes (written beforehand, so
  read from the page cache) to a new file beside it;
* write, a second baseline: the same bytes, already in memory, written to one new file;
* encode only: ``BridgeSample.members()`` for every sample, no I/O (the encoding part of pack).

Reported: MB/s (1e6 bytes of tar per second) of each and ``pack_over_copy`` (1 = packing costs no
more than copying). Nothing is fsynced (``pack_samples`` does not either); ``os.sync()`` runs before
each pass, untimed, so one pass's dirty pages do not throttle the next. Each figure is the median of
``--repeats`` passes after an untimed warm-up pass; the order of the methods rotates each repeat.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed_call
from speechdata.bridge.tars import FRAME_RATE_HZ, SAMPLE_RATE, BridgeSample, pack_samples
from speechdata.io.storage import DataRoot

SHARD_ID = "bench-tar"
WAVLM_DIM = 1024
TOKENS_PER_S = 3.0
MB = 1e6
COPY_BUFFER = 1 << 20


def build_samples(count: int, min_s: float, max_s: float, qwen_dim: int, seed: int) -> list[BridgeSample]:
    rng = np.random.default_rng(seed)
    samples = []
    for n in range(count):
        seconds = float(rng.uniform(min_s, max_s))
        n_samples = int(seconds * SAMPLE_RATE)
        n_frames = -(-n_samples // int(SAMPLE_RATE / FRAME_RATE_HZ))
        n_tokens = max(1, round(seconds * TOKENS_PER_S))
        samples.append(
            BridgeSample(
                key=f"{SHARD_ID}-{n:06d}",
                wav=(0.1 * rng.standard_normal(n_samples)).astype(np.float32),
                qwen=rng.standard_normal((n_tokens, qwen_dim), dtype=np.float32).astype(np.float16),
                wavlm=rng.standard_normal((n_frames, WAVLM_DIM), dtype=np.float32).astype(np.float16),
                tokens=rng.integers(0, 151_936, n_tokens, dtype=np.int32),
                grid=np.sort(rng.integers(-1, n_tokens, n_frames, dtype=np.int32)),
                dur=rng.integers(0, 8, n_tokens, dtype=np.int32),
                info={
                    "text": "synthetic " * n_tokens,
                    "language": "en",
                    "country": "us",
                    "source": "bench",
                    "shard": SHARD_ID,
                    "sample_rate": SAMPLE_RATE,
                    "frame_rate": FRAME_RATE_HZ,
                    "n_frames": n_frames,
                    "n_tokens": n_tokens,
                },
            )
        )
    return samples


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 samples and one pass, for smoke runs")
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--min-s", type=float, default=2.0, help="shortest utterance, seconds")
    parser.add_argument("--max-s", type=float, default=15.0, help="longest utterance, seconds")
    parser.add_argument("--qwen-dim", type=int, default=2048, help="Qwen hidden size (2048 full, 64 tiny)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes of each method")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.samples, args.repeats = 30, 1
    return args


def write_methods(root: DataRoot, tmp: str, samples: list, source_copy: Path, tar_bytes: bytes) -> dict:
    """The four ways of putting the tar's bytes on disk that are compared, by name."""

    def pack() -> None:
        pack_samples(root, SHARD_ID, iter(samples))

    def copy() -> None:
        with open(source_copy, "rb") as src, open(Path(tmp) / "copy.tar", "wb") as dst:
            shutil.copyfileobj(src, dst, COPY_BUFFER)

    def write() -> None:
        with open(Path(tmp) / "write.tar", "wb") as dst:
            dst.write(tar_bytes)

    def encode() -> None:
        for sample in samples:
            sample.members()

    return {"pack": pack, "copy": copy, "write": write, "encode_only": encode}


def time_methods(methods: dict[str, Callable[[], None]], repeats: int) -> dict[str, list[float]]:
    """Each method warmed up (``pack`` already was), then ``repeats`` rounds, the order rotated each round,
    every dirty page written back before each call."""
    for name, method in methods.items():
        if name != "pack":
            method()
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for repeat in range(repeats):
        for name in names[repeat % len(names) :] + names[: repeat % len(names)]:
            os.sync()
            seconds[name].append(timed_call(methods[name])[0])
    return seconds


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-tar-") as tmp:
        samples = build_samples(args.samples, args.min_s, args.max_s, args.qwen_dim, args.seed)
        audio_s = sum(s.wav.shape[0] for s in samples) / SAMPLE_RATE
        root = DataRoot(tmp)
        [packed], _ = pack_samples(root, SHARD_ID, iter(samples))  # warm-up, and the bytes to copy
        source = Path(root.path(packed.relative))
        source_copy = Path(tmp) / "source.tar"
        shutil.copyfile(source, source_copy)  # the copy's input: a tar of the very same bytes
        tar_bytes = source_copy.read_bytes()
        total = len(tar_bytes)
        progress(f"{len(samples)} samples, {audio_s:.0f} s of audio, {total / MB:.1f} MB of tar")
        seconds = time_methods(write_methods(root, tmp, samples, source_copy, tar_bytes), args.repeats)
        progress(f"seconds {seconds}")
        assert Path(root.path(packed.relative)).read_bytes() == tar_bytes, "pack_samples is not deterministic"

    median = {name: statistics.median(values) for name, values in seconds.items()}
    mb_per_s = {name: round(total / MB / s, 1) for name, s in median.items()}
    emit(
        "tar_writing",
        {
            "quick": args.quick,
            "samples": args.samples,
            "min_s": args.min_s,
            "max_s": args.max_s,
            "qwen_dim": args.qwen_dim,
            "wavlm_dim": WAVLM_DIM,
            "tokens_per_s": TOKENS_PER_S,
            "repeats": args.repeats,
            "seed": args.seed,
            "copy_buffer_bytes": COPY_BUFFER,
        },
        {
            "tar_mb": round(total / MB, 1),
            "audio_seconds": round(audio_s, 1),
            "mb_per_tar_sample": round(total / MB / len(samples), 3),
            "mb_per_s": mb_per_s,
            "seconds": {name: round(s, 3) for name, s in median.items()},
            "pack_over_copy": ratio(mb_per_s["pack"], mb_per_s["copy"]),
            "pack_over_write": ratio(mb_per_s["pack"], mb_per_s["write"]),
            "encode_share_of_pack": round(median["encode_only"] / median["pack"], 4),
        },
    )


if __name__ == "__main__":
    main()
