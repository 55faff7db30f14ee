"""Ingest throughput against the cost of decoding alone, on one shard of mixed formats.

Why: ingest (``run_raw_shards`` then ``run_normalized_audio``) should cost little more than
decoding the landed audio, which no ingest can avoid. This builds a shard of WAV / FLAC / MP3 /
Ogg-Opus utterances (plus long recordings cut into segments) in a temporary data root and measures,
on one process, in CPU seconds (``time.process_time``):

* ingest: ``run_raw_shards`` + ``run_normalized_audio(workers=1)`` (validation, header
  probing, decode, downmix, resample, quantize (pcm16) or FLAC encode, parquet writes);
* decode only, the baseline: every file the utterance index lists, opened through
  ``LandedAudio`` and its segments read with ``soundfile``, nothing else, also per format;

and reports audio seconds per CPU second for both and ``overhead_share = (ingest - decode) / ingest``
(target < 0.25), per stored codec (pcm16, the default, and flac16) and for two landings: "mixed" (all four formats)
and "compressed" (MP3 + Opus, what large corpora land as). It also times ``run_normalized_audio``
wall-clock with ``workers=2`` against ``workers=1`` (``time.perf_counter``) on a larger compressed
shard: the speedup a second core buys including process start-up.
Every figure is the median of ``--repeats`` passes after one untimed warm-up pass.
Disk: ``stored_mb_per_audio_hour_by_codec``, the audio column of ``audio_24k.parquet`` per hour of
stored audio, on the sample shards' speech clips (with the digital silence the shard builder puts
between clips: FLAC compresses it to almost nothing, so FLAC's figure here is a lower bound), and
``speech_only``: the fixture clips alone at 24 kHz, no silence added.
"""

from __future__ import annotations

import argparse
import posixpath
import tempfile
import time
from collections import defaultdict

import soundfile as sf

from benchmarks.report import alternating_medians, emit, median_by_key, progress, ratio, stdout_to_stderr
from speechdata.audio.codec import DEFAULT_AUDIO_CODEC
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.landing.landed_audio import LandedAudio
from speechdata.landing.normalize import FILES_PER_TASK
from speechdata.testing.shards import build_sample_shard

SHARD_ID = "bench-ingest"
FORMATS = ("wav", "flac", "mp3", "opus")
OVERHEAD_TARGET = 0.25


CODECS = ("pcm16", "flac16")


def ingest_cpu(root: DataRoot, codec: str = "flac16") -> dict[str, float]:
    """CPU seconds of the two ingest steps on one process."""
    started = time.process_time()
    run_raw_shards(root, SHARD_ID)
    validated = time.process_time()
    run_normalized_audio(root, SHARD_ID, workers=1, codec=codec)
    done = time.process_time()
    return {"raw_shard": validated - started, "normalized_audio": done - validated, "total": done - started}


def stored_mb_per_audio_hour(root: DataRoot) -> float:
    table = root.read_parquet(layout.normalized_audio(SHARD_ID), columns=["duration_s", "audio"])
    stored_bytes = sum(len(a) for a in table["audio"].to_pylist())
    return stored_bytes / 1e6 / (sum(table["duration_s"].to_pylist()) / 3600)


def speech_only_mb_per_audio_hour() -> dict[str, float]:
    """The fixture speech clips alone, resampled to 24 kHz and encoded with each codec."""
    from speechdata.audio.codec import TARGET_SAMPLE_RATE, encode_audio, resample
    from speechdata.testing.shards import load_clips

    clips = [resample(c.samples, c.sample_rate) for c in load_clips()]
    hours = sum(len(c) for c in clips) / TARGET_SAMPLE_RATE / 3600
    return {
        codec: round(sum(len(encode_audio(c, TARGET_SAMPLE_RATE, codec)) for c in clips) / 1e6 / hours, 1)
        for codec in CODECS
    }


def decode_cpu(root: DataRoot, segments: dict[str, list[tuple[int, int]]]) -> dict[str, float]:
    """CPU seconds of decoding every indexed segment, by file extension and in total.

    Each file is opened once and its segments read in order, as ingest does.
    """
    cpu: dict[str, float] = defaultdict(float)
    with LandedAudio(root, SHARD_ID) as audio:
        for path, spans in segments.items():
            started = time.process_time()
            with audio.open(path) as handle, sf.SoundFile(handle) as sound:
                for first, last in spans:
                    sound.seek(first)
                    sound.read(last - first, dtype="float32", always_2d=True)
            cpu[extension(path)] += time.process_time() - started
    cpu["total"] = sum(cpu.values())
    return dict(cpu)


def extension(path: str) -> str:
    return posixpath.splitext(path)[1].lstrip(".").lower()


def indexed_segments(root: DataRoot) -> tuple[dict[str, list[tuple[int, int]]], dict[str, float]]:
    """The frames to decode per file (sorted by file and start), and audio seconds per extension."""
    index = root.read_parquet(layout.utterance_index(SHARD_ID)).sort_by(
        [("audio_path", "ascending"), ("segment_start_s", "ascending")]
    )
    segments: dict[str, list[tuple[int, int]]] = defaultdict(list)
    seconds: dict[str, float] = defaultdict(float)
    for row in index.select(
        ["audio_path", "segment_start_s", "segment_end_s", "source_sample_rate", "source_frames", "duration_s"]
    ).to_pylist():
        rate = row["source_sample_rate"]
        first = int(round(row["segment_start_s"] * rate))
        last = min(int(round(row["segment_end_s"] * rate)), row["source_frames"])
        segments[row["audio_path"]].append((first, last))
        seconds[extension(row["audio_path"])] += row["duration_s"]
    return dict(segments), dict(seconds)


SCENARIOS = {
    # name: landed formats. "compressed" is what large corpora land as (the codec is the floor there);
    # "mixed" adds WAV and FLAC, which decode so fast that our own work shows more.
    "mixed": FORMATS,
    "compressed": ("mp3", "opus"),
}


def measure_cpu(root: DataRoot, repeats: int) -> dict:
    """Median CPU seconds of ingest (per codec) and of decoding alone, on the shard at ``root``."""
    stored: dict[str, float] = {}
    for codec in CODECS:
        ingest_cpu(root, codec)  # warm-up: imports, first-call set-up, page cache
        stored[codec] = round(stored_mb_per_audio_hour(root), 1)
    segments, seconds_by_format = indexed_segments(root)
    decode_cpu(root, segments)
    ingest_passes: dict[str, list] = {codec: [] for codec in CODECS}
    decode_passes = []
    for _ in range(repeats):
        for codec in CODECS:
            ingest_passes[codec].append(ingest_cpu(root, codec))
        decode_passes.append(decode_cpu(root, segments))
    by_codec = {codec: median_by_key(passes) for codec, passes in ingest_passes.items()}
    decode = median_by_key(decode_passes)
    audio_s = sum(seconds_by_format.values())
    progress(f"ingest cpu {by_codec}, decode cpu {decode}")
    return {
        "files": len(segments),
        "segments": sum(len(s) for s in segments.values()),
        "audio_seconds": round(audio_s, 2),
        "decode_only_x_realtime": round(audio_s / decode["total"], 1),
        "ingest_x_realtime_by_codec": {codec: round(audio_s / c["total"], 1) for codec, c in by_codec.items()},
        "overhead_share_by_codec": {
            codec: round((c["total"] - decode["total"]) / c["total"], 4) for codec, c in by_codec.items()
        },
        "cpu_seconds": {
            "decode_only": round(decode["total"], 4),
            **{f"ingest_{codec}": round(c["total"], 4) for codec, c in by_codec.items()},
            "ingest_raw_shard": round(by_codec["flac16"]["raw_shard"], 4),
        },
        "stored_mb_per_audio_hour_by_codec": stored,
        "decode_x_realtime_by_format": {
            fmt: round(seconds_by_format[fmt] / decode[fmt], 1) for fmt in sorted(seconds_by_format)
        },
    }


def measure_scenario(args: argparse.Namespace, formats: tuple[str, ...]) -> dict:
    """CPU seconds of ingest and of decoding alone, for a shard landed in ``formats``."""
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root = DataRoot(tmp)
        build_sample_shard(
            root, SHARD_ID, args.utterances, seed=args.seed, formats=formats, long_recordings=args.long_recordings
        )
        return {"formats": list(formats), **measure_cpu(root, args.repeats)}


def measure_parallel_normalize(args: argparse.Namespace) -> tuple[float, float]:
    """Median wall seconds of normalizing one compressed shard with one worker and with two (alternating)."""
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        root = DataRoot(tmp)
        build_sample_shard(root, SHARD_ID, args.parallel_utterances, seed=args.seed, formats=("mp3", "opus"))
        run_raw_shards(root, SHARD_ID)
        run_normalized_audio(root, SHARD_ID, workers=2)  # warm-up of the spawn path
        wall_1, wall_2 = alternating_medians(
            lambda: run_normalized_audio(root, SHARD_ID, workers=1),
            lambda: run_normalized_audio(root, SHARD_ID, workers=2),
            args.repeats,
        )
        progress(f"normalize wall: 1 worker {wall_1:.2f} s, 2 workers {wall_2:.2f} s")
        return wall_1, wall_2


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shards and one pass, for smoke runs")
    parser.add_argument("--utterances", type=int, default=60, help="standalone utterance files per CPU shard")
    parser.add_argument("--long-recordings", type=int, default=1, help="long recordings (3 segments each)")
    parser.add_argument("--parallel-utterances", type=int, default=240, help="files in the workers=1 vs 2 shard")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes of each measurement")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.quick:
        args.utterances, args.parallel_utterances, args.repeats = 8, 40, 1
    with stdout_to_stderr():
        scenarios = {name: measure_scenario(args, formats) for name, formats in SCENARIOS.items()}
        wall_1, wall_2 = measure_parallel_normalize(args)

    flac = scenarios["compressed"]["overhead_share_by_codec"]["flac16"]
    mixed_default = scenarios["mixed"]["overhead_share_by_codec"][DEFAULT_AUDIO_CODEC]
    emit(
        "ingest",
        {
            "quick": args.quick,
            "utterances": args.utterances,
            "long_recordings": args.long_recordings,
            "parallel_utterances": args.parallel_utterances,
            "repeats": args.repeats,
            "seed": args.seed,
            # normalize_shard hands out FILES_PER_TASK files per task, so a small shard may use one worker
            "workers_2_effective": min(2, -(-args.parallel_utterances // FILES_PER_TASK)),
        },
        {
            "scenarios": scenarios,
            "overhead_share_target": OVERHEAD_TARGET,
            "default_codec": DEFAULT_AUDIO_CODEC,
            "mixed_default_codec_meets_target": mixed_default <= OVERHEAD_TARGET,
            "compressed_flac16_meets_target": flac < OVERHEAD_TARGET,
            "speech_only_stored_mb_per_audio_hour_by_codec": speech_only_mb_per_audio_hour(),
            "normalize_wall": {
                "workers_1_s": round(wall_1, 3),
                "workers_2_s": round(wall_2, 3),
                "speedup_workers_2_over_1": ratio(wall_1, wall_2),
            },
        },
    )


if __name__ == "__main__":
    main()
