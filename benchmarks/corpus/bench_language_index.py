"""One more shard on a language's shard index: the incremental update against the from-scratch build.

Why: ``language_shard_index`` used to read every shard's VAD table (DuckDB over the corpus) and check
every shard's ``vad`` ledger for each language on every run, so a new shard cost the corpus.
:func:`speechdata.vad.language_index.update_language_shard_index` reads and gates only the shards
whose inputs changed. This writes corpora of each of ``--corpus-shards`` shards of ``--shard-files``
files (stored inputs: landed metadata, utterance index and ``vad_segments.parquet`` per shard, with
the project's writer and the stage's schema; three languages), updates the index once (untimed),
adds one shard and times, each in a fresh process (wall inside it, peak RSS from ``VmHWM``):

* ``incremental``: ``update_language_shard_index`` plus the tar collection of the changed shards,
  as the asset runs them;
* ``from_scratch_baseline``: ``build_language_shard_index`` over every shard and its write, plus the
  every-shard tar collection, as the asset ran before.

``growth``: each figure at the largest corpus over the smallest.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.report import emit, leave_measured, peak_rss_mb, progress, ratio, stdout_to_stderr

LANGUAGES = ("en", "fr", "hi")


def write_segmented_shard(root: str, shard_id: str, files: int) -> None:
    import pyarrow as pa

    from speechdata.io import layout
    from speechdata.io.storage import DataRoot
    from speechdata.vad.stage import VAD_SEGMENTS_SCHEMA

    data_root = DataRoot(root)
    utt_ids = [f"{shard_id}-{n:06d}" for n in range(files)]
    data_root.write_parquet(layout.landing_metadata(shard_id), pa.table({"utt_id": utt_ids}))
    data_root.write_parquet(layout.utterance_index(shard_id), pa.table({"utt_id": utt_ids}))
    tar = f"{layout.shard_dir(shard_id)}/audio-{'0' * 16}.tar"
    rows = [
        {
            "shard": shard_id,
            "audio_path": f"{utt}.wav",
            "tar_path": tar,
            "tar_key": utt,
            "language": LANGUAGES[n % len(LANGUAGES)],
            "utt_ids": [utt],
            "duration_s": 12.0 + n % 7,
            "speech_s": 9.0,
            "n_segments": 2,
            "start_s": [0.5, 6.0],
            "end_s": [5.5, 11.0],
            "segments_source": "import",
            "audio_sha1": None,
        }
        for n, utt in enumerate(utt_ids)
    ]
    data_root.write_parquet(layout.vad_segments(shard_id), pa.Table.from_pylist(rows, schema=VAD_SEGMENTS_SCHEMA))
    data_root.write_bytes(layout.landing_success_marker(shard_id), b"")


def measure_child(mode: str, root: str) -> None:
    # pyarrow imports pandas on its first from_pylist or compute call: a one-time cost, outside the figure.
    import pandas  # noqa: F401
    import pyarrow  # noqa: F401  imports outside the figure

    from speechdata.io import layout
    from speechdata.io.storage import DataRoot
    from speechdata.vad.language_index import build_language_shard_index, update_language_shard_index
    from speechdata.vad.tar_retention import remove_unreferenced_packed_tars

    data_root = DataRoot(root)
    started = time.perf_counter()
    if mode == "incremental":
        update = update_language_shard_index(data_root, "en")
        remove_unreferenced_packed_tars(data_root, update.shards_changed)
        checked = len(update.shards_checked)
    else:
        table = build_language_shard_index(data_root, "en")
        data_root.write_parquet(f"baseline/{layout.language_shard_index('en')}", table)
        remove_unreferenced_packed_tars(data_root)
        checked = None
    wall = time.perf_counter() - started
    print(json.dumps({"wall_s": round(wall, 3), "peak_rss_mb": round(peak_rss_mb(), 1), "shards_checked": checked}))


def _in_child(mode: str, root: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.corpus.bench_language_index", "--measure", mode, root],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def per_new_shard(corpus_shards: list[int], shard_files: int) -> dict:
    figures: dict[str, dict] = {}
    for shards in corpus_shards:
        root = tempfile.mkdtemp(prefix=f"bench-language-index-{shards}-")
        try:
            for number in range(shards):
                write_segmented_shard(root, f"shard-{number:05d}", shard_files)
            _in_child("incremental", root)  # the index as it stands, untimed
            write_segmented_shard(root, f"shard-{shards:05d}", shard_files)
            size = {"incremental": _in_child("incremental", root)}
            size["from_scratch_baseline"] = _in_child("from_scratch_baseline", root)
            progress(f"{shards} shards + 1: {size}")
            figures[str(shards)] = size
        finally:
            shutil.rmtree(root, ignore_errors=True)
    smallest, largest = str(corpus_shards[0]), str(corpus_shards[-1])
    growth = {
        mode: {
            "wall": ratio(figures[largest][mode]["wall_s"], figures[smallest][mode]["wall_s"]),
            "peak_rss": ratio(figures[largest][mode]["peak_rss_mb"], figures[smallest][mode]["peak_rss_mb"]),
        }
        for mode in figures[smallest]
    }
    return {"by_corpus_shards": figures, "growth": growth}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 and 8 shards of 100 files, for smoke runs")
    parser.add_argument("--corpus-shards", type=int, nargs="+", default=[10, 200])
    parser.add_argument("--shard-files", type=int, default=1000)
    parser.add_argument("--measure", nargs=2, metavar=("MODE", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        measure_child(*args.measure)
        leave_measured()
    if args.quick:
        args.corpus_shards, args.shard_files = [2, 8], 100
    with stdout_to_stderr():
        figures = per_new_shard(args.corpus_shards, args.shard_files)
    emit(
        "language_index",
        {"quick": args.quick, "corpus_shards": args.corpus_shards, "shard_files": args.shard_files},
        {"per_new_shard": figures["by_corpus_shards"], "growth": figures["growth"]},
    )


if __name__ == "__main__":
    main()
