"""The benchmarks still run (quick sizes) and each prints one JSON record with its baseline.

The backfill launch benchmark, the longest, has a module of its own (``test_benchmarks_smoke_backfill.py``)
so the other test worker can run it beside these.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run_all import module_of

pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "name, keys",
    [
        ("bench_resample", {"x_realtime_per_cpu_by_source_rate", "tone_13000hz_level_db_by_source_rate"}),
        ("bench_ingest", {"scenarios", "normalize_wall"}),
        ("bench_sensor_tick", {"scan", "tick_none_registered", "tick_mostly_registered"}),
        ("bench_frame_grid", {"grid_utt_per_s", "tokenize_utt_per_s", "grids_breaking_invariants"}),
        ("bench_text_normalization", {"baseline_words_per_s", "spoken_words_per_s", "ratio_spoken_over_baseline_s"}),
        (
            "bench_landing_fingerprint",
            {"folder_fingerprint_ms", "tar_every_byte_ms", "tar_ratio_fingerprint_over_every_byte"},
        ),
        (
            "bench_streaming_segments",
            {"utt_per_s", "baseline_utt_per_s", "ratio_utt_per_s_over_baseline", "misplaced_chunk_share"},
        ),
        (
            "bench_asr_manifest",
            {"polars_seconds", "pandas_baseline_seconds", "ratio_pandas_over_polars", "per_new_shard"},
        ),
        ("bench_language_index", {"per_new_shard", "growth"}),
        ("bench_asr_sampler", {"numpy_epoch_seconds", "reference_seconds", "same_batches_as_reference"}),
        ("bench_vad", {"vad", "streaming"}),
        ("bench_hf_dataset", {"quarter", "full", "per_new_shard"}),
        ("bench_packing", {"per_size", "ms_per_utt_spread", "rss_spread", "pack_over_copy_min"}),
        ("bench_publish_state", {"baseline_csv_pandas_seconds", "duckdb_state_seconds", "same_selection_and_hours"}),
        ("bench_orchestration_scale", {"per_size", "tick_growth"}),
        ("bench_catalog_refresh", {"per_size", "growth", "per_new_shard"}),
        ("bench_corpus_scale", {"per_hours", "near_duplicates", "growth"}),
        ("bench_exports", {"audio_hours_per_minute", "over_copy"}),
        ("bench_parquet_integrity", {"whole_read_verified_over_unverified", "streamed_read_verified_over_unverified"}),
        ("bench_ingest_memory", {"per_size", "rows_growth", "peak_rss_growth"}),
        ("bench_alignment_memory", {"per_duration", "max_peak_rss_mb"}),
        ("bench_alignment_accuracy", {"platform", "pocketsphinx"}),
        ("bench_near_duplicates", {"near_duplicates", "baseline_exact_hash", "ms_per_utt", "baseline_ms_per_utt"}),
        (
            "bench_near_duplicates_batch",
            {"incremental_wall_s", "batch_in_process_wall_s", "batch_ray_wall_s", "ratio_batch_ray_over_incremental"},
        ),
        ("bench_near_dup_keyspace", {"corpora", "variants"}),
        ("bench_near_dup_capped_keys", {"2^12"}),
        ("bench_near_dup_skip_capped", {"2^12"}),
        ("bench_near_dup_postings_budget", {"off", "on", "on_over_off", "same_decisions"}),
        ("bench_near_dup_recall_at_scale", {"curve", "equivalence_check", "audio_alone_recall_below"}),
        ("bench_near_duplicates_index", {"per_size", "growth", "new_over_baseline_wall_at_largest"}),
        ("bench_near_duplicates_order", {"per_size", "growth", "partitioned_over_single_file_mean_at_largest"}),
        ("bench_near_dup_filter_rate", {"false_positive_percent", "computed", "now_over_baseline_rate_small_segments"}),
        (
            "bench_near_duplicates_compaction",
            {"paths", "worst_wall_bounded_over_baseline", "worst_written_bounded_over_baseline", "decisions_identical"},
        ),
        ("bench_write_fence", {"local", "s3_loopback"}),
        ("bench_root_confinement", {"shard_write", "glob"}),
        (
            "bench_code_location_import",
            {"code_location_import", "baseline_eager_model_libraries", "ratio_import_s_over_baseline"},
        ),
    ],
)
def test_benchmark_prints_one_json_record(name, keys):
    result = subprocess.run(
        [sys.executable, "-m", module_of(name), "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout[-2000:]
    record = json.loads(lines[0])
    assert record["benchmark"] == name.removeprefix("bench_")
    assert keys <= set(record)


def test_corpus_scale_measures_a_prebuilt_near_duplicate_index_on_a_copy_and_leaves_it_as_it_was(tmp_path):
    """``--nd-index HOURS=DIR``: the new shard is measured on a hard-linked copy of DIR (its commit
    and compaction replace and remove names in the copy only), with the counters that tell the
    lookup's terms apart in the record."""
    import hashlib

    from benchmarks.corpus.bench_corpus_scale import measure_near_duplicates
    from benchmarks.corpus.bench_near_duplicates_index import build_index

    index = tmp_path / "index"
    build_index(str(index), 2, 40)

    def files() -> dict[str, str]:
        return {
            str(path.relative_to(index)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(index.rglob("*"))
            if path.is_file()
        }

    before = files()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    measured = measure_near_duplicates(
        [0.05], 40, baseline_max_hours=0, simultaneous=1, prebuilt={"0.05": str(index)}, scratch=str(scratch)
    )["0.05"]
    assert measured["shards"] == 2 and measured["index"] == str(index)
    figures = measured["postings_index"]
    assert figures["copies_found"] == 4  # a tenth of the new shard's 40 utterances are copies
    for counter in ("minor_faults", "rss_anon_peak_mb", "rss_file_peak_mb", "filter_bytes_read", "segment_bytes_read"):
        assert figures[counter] >= 0
    assert figures["segment_bytes_read"] > 0 and figures["live_segments"]
    assert figures["blocks_read"] >= figures["blocks_read_by_chance"] >= 0 and figures["blocks_read"] > 0
    assert figures["lock_held_ms"]["reserve"] > 0 and figures["lock_held_ms"]["commit"] > 0
    assert files() == before
    assert list(scratch.iterdir()) == []
