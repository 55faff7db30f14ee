"""Building a country's Hugging Face dataset: streamed per recording, against building the split in memory.

Why: the original publishing script loads a whole split's segments into Python
(``Dataset.from_list``) and lets ``push_to_hub`` write parquet, so memory grows with the split and a
large country needs the baseline's RAM-percentage juggling. ``build_country_dataset`` streams one
recording at a time into parquet writers. This lands a synthetic aligned-JSON corpus
(``--recordings`` FLAC recordings at 16 kHz, six segments each) and, for the same segments, times in
one process, wall-clock:

* ours: ``build_country_dataset`` (cut, downmix, FLAC-encode, WER, write parquet shards, state);
* baseline: for each recording, decode the whole file (``soundfile.read``, as pydub does), slice and
  FLAC-encode each segment, WER with jiwer, collect every row, then ``datasets.Dataset.from_list``
  with the same features and ``to_parquet`` (what ``push_to_hub`` writes before uploading).

Peak Python heap (``tracemalloc``, which numpy buffers report to) is measured for both, at the full
corpus and at a quarter of it, so the figure shows how memory scales with the split. Both sides
write the same number of rows (checked).

``per_new_shard``: what adding one shard costs a country that is already published, at two corpus
sizes (``--shards`` small and large, ``--shard-recordings`` recordings each, 12.5 % test and 12.5 %
validation, so that each small shard, like a real one at 1 %, brings recordings to both). The corpus is landed and built, one more shard is landed, and a fresh interpreter runs
the country's whole refresh (``hf_split_assignments`` then ``hf_dataset``: assignment, ledger gate,
build, card, published indexes) through the functions both assets call, so the same script measures
the code on the path (run it from an older checkout for the old figures). Wall time, peak RSS of that
process, audio hours cut and files written; ``growth`` is large over small: 1.0 means a new shard
costs the same whatever the corpus holds.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
import tracemalloc

import numpy as np
import soundfile as sf

from benchmarks.report import emit, leave_measured, peak_rss_mb, process_cpu_seconds, progress, ratio, stdout_to_stderr


def land_corpus(workdir: str, recordings: int):
    from speechdata.importers.aligned_json import import_aligned_countries
    from speechdata.io.storage import DataRoot
    from speechdata.landing.ingest import run_raw_shards
    from speechdata.testing.aligned_json import build_aligned_json_corpus

    build_aligned_json_corpus(f"{workdir}/countries", {"de": recordings}, audio_format="flac", segments_per_recording=6)
    root = DataRoot(f"{workdir}/data")
    for report in import_aligned_countries(f"{workdir}/countries", root, recordings_per_shard=16):
        for shard in report.shards:
            run_raw_shards(root, shard)
    return root


def ours(root) -> tuple[float, int, int]:
    from speechdata.hf.assignment import refresh_split_assignments
    from speechdata.hf.dataset import DatasetOptions, build_country_dataset
    from speechdata.hf.splits import SplitTargets

    refresh_split_assignments(root, "bench", "de", targets=SplitTargets(0.0, 0.0))
    tracemalloc.start()
    started = time.perf_counter()
    summary = build_country_dataset(root, "de", DatasetOptions(dataset="bench", max_split_size_gb=1.0))
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak, sum(s.rows for s in summary.written)


def baseline_approach(root, out_path: str) -> tuple[float, int, int]:
    import datasets

    from speechdata.audio.codec import downmix_to_mono, encode_flac
    from speechdata.hf.dataset import hf_features
    from speechdata.hf.segments import SegmentLimits, country_segments, filter_reasons, word_error_rate
    from speechdata.landing.landed_audio import LandedAudio

    segments = country_segments(root, "de")
    keep = [r is None for r in filter_reasons(segments, SegmentLimits())]
    tracemalloc.start()
    started = time.perf_counter()
    rows, by_recording = [], {}
    for i, row in enumerate(segments.to_pylist()):
        if keep[i]:
            by_recording.setdefault((row["shard_id"], row["audio_path"]), []).append(row)
    for (shard_id, audio_path), segs in sorted(by_recording.items()):
        with LandedAudio(root, shard_id) as audio, audio.open(audio_path) as handle:
            whole, rate = sf.read(handle, dtype="float32", always_2d=True)
        for seg in segs:
            cut = downmix_to_mono(whole[int(round(seg["start_s"] * rate)) : int(round(seg["end_s"] * rate))])
            rows.append(
                {
                    "audio": {"bytes": encode_flac(np.asarray(cut), rate), "path": f"{seg['key']}.flac"},
                    "key": seg["key"],
                    "shard_id": seg["shard_id"],
                    "country": "de",
                    "language": seg["language"],
                    "video_id": seg["video_id"],
                    "transcript_id": seg["transcript_id"],
                    "start_seconds": seg["start_s"],
                    "end_seconds": seg["end_s"],
                    "duration_seconds": seg["duration_s"],
                    "asr_transcript": seg["asr_text"],
                    "human_transcript": seg["human_text"],
                    "cer": seg["cer"],
                    "wer": word_error_rate(seg["human_text"], seg["asr_text"]),
                    "original_transcript_start_idx": seg["transcript_start_idx"],
                    "original_transcript_end_idx": seg["transcript_end_idx"],
                    "text": seg["human_text"],  # the baseline publishes landed human transcripts only
                    "text_source": "landed",
                    "asr_confidence": None,
                }
            )
    # from_list would encode Audio values through torchcodec (needs FFmpeg); the same bytes go in as
    # a struct and become Audio by a storage cast, which is what the baseline's files hold.
    features = hf_features(16_000)
    plain = datasets.Features(
        {**features, "audio": {"bytes": datasets.Value("binary"), "path": datasets.Value("string")}}
    )
    dataset = datasets.Dataset.from_list(rows, features=plain).cast_column("audio", features["audio"])
    dataset.to_parquet(out_path)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak, len(rows)


EVALUATION_SHARE = 0.125
"""Test and validation shares of the per-new-shard corpus: a shard of 8 recordings then holds about
one of each, as a real shard of a thousand utterances does at the default 1 %."""


def refresh_country_step(data_root_url: str, dataset: str, country: str) -> dict:
    """One country refresh as the two assets run it; the figures of this process."""

    import datasets  # noqa: F401  (loaded by the build either way: its import is not the refresh's cost)
    import jiwer  # noqa: F401

    from speechdata.hf.accounting import require_balanced_country
    from speechdata.hf.assignment import refresh_split_assignments
    from speechdata.hf.card import write_dataset_card
    from speechdata.hf.dataset import DatasetOptions, build_country_dataset
    from speechdata.hf.publish import register_card
    from speechdata.hf.published_index import write_published_indexes
    from speechdata.hf.splits import SplitTargets
    from speechdata.io.storage import DataRoot

    root = DataRoot(data_root_url)
    cpu_before = process_cpu_seconds()
    started = time.perf_counter()
    refresh_split_assignments(root, dataset, country, targets=SplitTargets(EVALUATION_SHARE, EVALUATION_SHARE))
    require_balanced_country(root, dataset, country)
    summary = build_country_dataset(root, country, DatasetOptions(dataset=dataset))
    write_dataset_card(root, dataset)
    register_card(root, dataset, country)
    write_published_indexes(root, dataset, country)
    return {
        "wall_s": round(time.perf_counter() - started, 3),
        "cpu_s": round(process_cpu_seconds() - cpu_before, 3),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "audio_hours_cut": round(summary.audio_seconds / 3600, 4),
        "files_written": sum(len(s.files) for s in summary.written),
    }


def _step_in_fresh_interpreter(root) -> dict:
    import json
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.corpus.bench_hf_dataset", "--step", root.url],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode:
        raise SystemExit(f"the refresh step failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def per_new_shard(workdir: str, shards: int, shard_recordings: int) -> dict:
    """Land ``shards`` shards, build the country, land one more and measure its refresh."""
    from speechdata.importers.aligned_json import import_aligned_countries
    from speechdata.io.storage import DataRoot
    from speechdata.landing.ingest import run_raw_shards
    from speechdata.testing.aligned_json import build_aligned_json_corpus

    root = DataRoot(f"{workdir}/data")

    def land(first: int, count: int) -> None:
        build_aligned_json_corpus(
            f"{workdir}/countries", {"de": count}, audio_format="flac", segments_per_recording=6, first_recording=first
        )
        for report in import_aligned_countries(f"{workdir}/countries", root, recordings_per_shard=shard_recordings):
            for shard in report.shards:
                run_raw_shards(root, shard)

    progress(f"per new shard: landing {shards} shards of {shard_recordings} recordings")
    land(0, shards * shard_recordings)
    # The country as it stands, untimed: in this process (a fresh interpreter is for the figure alone).
    refresh_country_step(root.url, "bench", "de")
    land(100_000, shard_recordings)
    figures = _step_in_fresh_interpreter(root)
    return {"shards_before": shards, **figures}


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recordings", type=int, default=64)
    parser.add_argument("--shards", type=int, nargs=2, default=(4, 16), metavar=("SMALL", "LARGE"))
    parser.add_argument("--shard-recordings", type=int, default=8)
    parser.add_argument("--step", metavar="DATA_ROOT", help=argparse.SUPPRESS)
    parser.add_argument("--per-new-shard-only", action="store_true", help="measure only the cost of one new shard")
    parser.add_argument("--quick", action="store_true", help="8 recordings: a smoke run, not a measurement")
    args = parser.parse_args()
    if args.quick:
        args.recordings, args.shards, args.shard_recordings = 8, (1, 3), 4
    args.shards = tuple(args.shards)
    return args


def compare_with_baseline(label: str, count: int) -> dict:
    """Ours against the baseline approach on a country of ``count`` landed recordings."""
    with tempfile.TemporaryDirectory() as workdir:
        progress(f"landing {count} recordings")
        root = land_corpus(workdir, count)
        ours_s, ours_peak, ours_rows = ours(root)
        baseline_s, baseline_peak, baseline_rows = baseline_approach(root, f"{workdir}/baseline.parquet")
        if ours_rows != baseline_rows:
            raise SystemExit(f"row counts differ: ours {ours_rows}, baseline {baseline_rows}")
        audio_s = sum(sf.info(io.BytesIO(b)).duration for b in _audio_bytes(root)) if label == "full" else None
    figures = {
        "recordings": count,
        "rows": ours_rows,
        "segments_per_s": round(ours_rows / ours_s, 1),
        "baseline_segments_per_s": round(baseline_rows / baseline_s, 1),
        "ratio_speed_over_baseline": ratio(baseline_s, ours_s),
        "peak_python_mb": round(ours_peak / 1e6, 2),
        "baseline_peak_python_mb": round(baseline_peak / 1e6, 2),
        "ratio_peak_memory_baseline_over_ours": ratio(baseline_peak, ours_peak),
    }
    if audio_s is not None:
        figures["audio_seconds_per_second"] = round(audio_s / ours_s, 1)
    return figures


def per_new_shard_growth(shard_sizes: tuple[int, int], shard_recordings: int) -> dict:
    """One new shard's cost on a small and a large corpus, and how much it grew."""
    by_size = {}
    for shards in shard_sizes:
        with tempfile.TemporaryDirectory() as workdir:
            by_size[f"{shards}_shards"] = per_new_shard(workdir, shards, shard_recordings)
    small, large = (by_size[f"{n}_shards"] for n in shard_sizes)
    return {
        "shard_recordings": shard_recordings,
        **by_size,
        "growth": {
            "corpus": ratio(shard_sizes[1], shard_sizes[0]),
            "wall": ratio(large["wall_s"], small["wall_s"]),
            "cpu": ratio(large["cpu_s"], small["cpu_s"]),
            "peak_rss": ratio(large["peak_rss_mb"], small["peak_rss_mb"]),
            "audio_hours_cut": ratio(large["audio_hours_cut"], small["audio_hours_cut"]),
        },
    }


def main() -> None:
    args = parse_arguments()
    if args.step:
        with stdout_to_stderr():
            step_figures = refresh_country_step(args.step, "bench", "de")
        print(json.dumps(step_figures), flush=True)
        leave_measured()
    sizes = () if args.per_new_shard_only else (("quarter", max(args.recordings // 4, 2)), ("full", args.recordings))
    with stdout_to_stderr():
        import datasets  # noqa: F401  (imported before timing: its import is not part of either side)

        datasets.disable_progress_bars()
        figures = {label: compare_with_baseline(label, count) for label, count in sizes}
        figures["per_new_shard"] = per_new_shard_growth(args.shards, args.shard_recordings)
    emit("hf_dataset", {"recordings": args.recordings, "segments_per_recording": 6, "source": "FLAC 16 kHz"}, figures)


def _audio_bytes(root):
    import pyarrow.parquet as pq

    for path in root.fs.glob(root.path("hf/bench/de/*.parquet")):
        with root.fs.open(path, "rb") as handle:
            for item in pq.ParquetFile(handle).read(columns=["audio"])["audio"].to_pylist():
                yield item["bytes"]


if __name__ == "__main__":
    main()
