"""Silero VAD speed and VAD-chunked streaming throughput, each next to its baseline from the same run.

Why: the original pipeline ran silero one file and one 32 ms window at a time, and its loader is only as
fast as its decoding. This measures, on one process and one torch thread, in CPU seconds
(``time.process_time``; the machine is shared, so wall time would measure the neighbours):

* VAD, audio seconds per CPU second: :func:`speechdata.vad.silero.detect_speech` (files batched through
  the model) against silero's own ``get_speech_timestamps`` called per file, on the same 16 kHz
  signals (the sample speech with silences, concatenated into files), and how many files' segments
  differ between the two (expected: 0);
* streaming, chunk-seconds of audio per CPU second: :class:`speechdata.vad.loader.VadChunkDataset`
  (seek, decode only each chunk, resample, normalize) over landed tars of 44.1 kHz MP3 files, against
  the naive loop over the same tars that decodes each whole file, resamples it to 16 kHz and slices
  the very same chunks. Both yield identical chunk positions; the segments are landed (imported), so
  no VAD runs here.

Every figure is the median of ``--repeats`` passes after one untimed warm-up pass.
"""

from __future__ import annotations

import argparse
import io
import tempfile
import time

import numpy as np
import pyarrow as pa
import soundfile as sf
import torch

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed
from speechdata.audio.codec import downmix_to_mono, resample
from speechdata.io import layout
from speechdata.io.audio_tars import audio_extension, write_deterministic_tar
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_raw_shards
from speechdata.landing.mark import mark_landed
from speechdata.testing.shards import load_clips
from speechdata.vad.loader import VadChunkDataset, normalize_chunk, shard_of_tar_url
from speechdata.vad.silero import detect_speech, load_silero_model
from speechdata.vad.stage import run_vad_segments

SOURCE_RATE = 44_100
TARGET_RATE = 16_000


def speech_file(seconds: float, rng: np.random.Generator, rate: int) -> np.ndarray:
    """Sample clips back to back with short pauses (0.05-0.3 s) until ``seconds`` are filled."""
    clips = [resample(c.samples, c.sample_rate, rate) for c in load_clips()]
    parts, total = [], 0
    while total < seconds * rate:
        clip = clips[rng.integers(len(clips))]
        pause = np.zeros(int(rng.uniform(0.05, 0.3) * rate), np.float32)
        parts += [clip, pause]
        total += len(clip) + len(pause)
    return np.concatenate(parts)[: int(seconds * rate)]


def median_cpu(fn, repeats: int) -> float:
    """CPU seconds, median of ``repeats`` calls after a warm-up."""
    return timed(fn, repeats, warm_up=True, clock=time.process_time).median_s


def measure_vad(files: int, file_s: float, repeats: int, seed: int) -> dict:
    from silero_vad import get_speech_timestamps

    rng = np.random.default_rng(seed)
    signals = [speech_file(file_s, rng, TARGET_RATE) for _ in range(files)]
    audio_s = sum(len(s) for s in signals) / TARGET_RATE
    model = load_silero_model()

    def per_file():
        with torch.inference_mode():
            return [get_speech_timestamps(torch.from_numpy(s), model) for s in signals]

    batched_cpu = median_cpu(lambda: detect_speech(model, signals), repeats)
    per_file_cpu = median_cpu(per_file, repeats)
    ours, reference = detect_speech(model, signals), per_file()
    differing = sum(
        [round(s * TARGET_RATE) for s in seg.start_s] != [r["start"] for r in ref]
        or [round(e * TARGET_RATE) for e in seg.end_s] != [r["end"] for r in ref]
        for seg, ref in zip(ours, reference, strict=True)
    )
    progress(f"vad: batched {batched_cpu:.2f} cpu s, per file {per_file_cpu:.2f} cpu s for {audio_s:.0f} s")
    return {
        "files": files,
        "audio_seconds": round(audio_s, 1),
        "batched_x_realtime_per_cpu": round(audio_s / batched_cpu, 1),
        "silero_per_file_x_realtime_per_cpu": round(audio_s / per_file_cpu, 1),
        "speedup": ratio(per_file_cpu, batched_cpu),
        "files_with_different_segments": differing,
    }


def land_mp3_shards(root: DataRoot, shards: int, files: int, file_s: float, seed: int) -> list[str]:
    """Tar shards of MP3 files with landed segments of 8-40 s of speech separated by pauses."""
    rng = np.random.default_rng(seed)
    urls = []
    for s in range(shards):
        shard_id = f"bench-{s}"
        audio, rows, segments = {}, [], []
        for f in range(files):
            path = f"f{f:03d}.mp3"
            buffer = io.BytesIO()
            sf.write(buffer, speech_file(file_s, rng, SOURCE_RATE), SOURCE_RATE, format="MP3")
            audio[path] = buffer.getvalue()
            rows.append({"utt_id": f"f{f:03d}", "audio_path": path, "language": "en"})
            bounds, t = [], 0.5
            while t < file_s - 1:
                end = min(t + rng.uniform(8, 40), file_s - 0.5)
                bounds.append((t, end))
                t = end + rng.uniform(0.3, 2.0)
            segments.append({"audio_path": path, "start_s": [a for a, _ in bounds], "end_s": [b for _, b in bounds]})
        write_deterministic_tar(root, layout.landing_audio_tar(shard_id), sorted(audio.items()))
        root.write_parquet(layout.landing_metadata(shard_id), pa.Table.from_pylist(rows))
        mark_landed(root, shard_id)
        root.write_parquet(layout.landing_vad_segments(shard_id), pa.Table.from_pylist(segments))
        run_raw_shards(root, shard_id)
        run_vad_segments(root, shard_id, model=None)  # every file's segments are landed
        urls.append(root.uri(layout.landing_audio_tar(shard_id)))
    return urls


def naive_chunks(dataset: VadChunkDataset) -> float:
    """The baseline, as the original loader did it: decode each whole file, resample, slice the same chunks."""
    from speechdata.vad.chunks import chunk_rng, draw_chunk_starts

    seconds, n = 0.0, int(dataset.chunk_s * dataset.sample_rate)
    for sample in dataset._pipeline():
        shard_id = shard_of_tar_url(sample["__url__"])
        info = dataset._vad_table(shard_id)[sample["__key__"]]
        member = next(ext for ext in sample if not ext.startswith("__") and audio_extension(ext))
        rng = chunk_rng(dataset.seed, dataset.epoch, shard_id, sample["__key__"])
        starts = sorted(draw_chunk_starts(info.start_s, info.end_s, dataset.chunk_s, dataset.num_chunks, rng))
        whole, rate = sf.read(io.BytesIO(sample[member]), dtype="float32", always_2d=True)
        mono = resample(downmix_to_mono(whole), rate, dataset.sample_rate)
        for start in starts:
            first = int(round(start * dataset.sample_rate))
            normalize_chunk(mono[first : first + n])
            seconds += dataset.chunk_s
    return seconds


def measure_streaming(root: DataRoot, urls: list[str], chunk_s: float, num_chunks: int, repeats: int) -> dict:
    dataset = VadChunkDataset(urls, root, chunk_s=chunk_s, num_chunks=num_chunks, shardshuffle=False)
    chunk_seconds = {}

    def stream():
        chunk_seconds["loader"] = sum(s["input_values"].shape[0] for s in dataset) * chunk_s

    def naive():
        chunk_seconds["naive"] = naive_chunks(dataset)

    loader_cpu, naive_cpu = median_cpu(stream, repeats), median_cpu(naive, repeats)
    assert chunk_seconds["loader"] == chunk_seconds["naive"], chunk_seconds
    index = [root.read_parquet(layout.vad_segments(shard_of_tar_url(u)), ["duration_s"]) for u in urls]
    audio_s = sum(sum(t["duration_s"].to_pylist()) for t in index)
    progress(f"streaming: loader {loader_cpu:.2f} cpu s, naive {naive_cpu:.2f} cpu s, {chunk_seconds}")
    return {
        "files": sum(t.num_rows for t in index),
        "file_audio_seconds": round(audio_s, 1),
        "chunk_seconds": chunk_seconds["loader"],
        "loader_chunk_s_per_cpu_s": round(chunk_seconds["loader"] / loader_cpu, 1),
        "naive_chunk_s_per_cpu_s": round(chunk_seconds["naive"] / naive_cpu, 1),
        "speedup": ratio(naive_cpu, loader_cpu),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small inputs and one pass, for smoke runs")
    parser.add_argument("--vad-files", type=int, default=32)
    parser.add_argument("--vad-file-s", type=float, default=30.0)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--files-per-shard", type=int, default=3)
    parser.add_argument("--file-s", type=float, default=300.0, help="length of each MP3 file")
    parser.add_argument("--chunk-s", type=float, default=10.0)
    parser.add_argument("--num-chunks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.vad_files, args.vad_file_s, args.shards, args.files_per_shard, args.file_s, args.repeats = (
            4,
            8.0,
            1,
            2,
            40.0,
            1,
        )

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # both sides on one core
    with stdout_to_stderr():
        vad = measure_vad(args.vad_files, args.vad_file_s, args.repeats, args.seed)
        with tempfile.TemporaryDirectory(prefix="bench-vad-") as tmp:
            root = DataRoot(tmp)
            urls = land_mp3_shards(root, args.shards, args.files_per_shard, args.file_s, args.seed)
            streaming = measure_streaming(root, urls, args.chunk_s, args.num_chunks, args.repeats)
    torch.set_num_threads(threads)
    emit(
        "vad",
        {k: v for k, v in vars(args).items()} | {"source_rate": SOURCE_RATE, "target_rate": TARGET_RATE},
        {"vad": vad, "streaming": streaming},
    )


if __name__ == "__main__":
    main()
