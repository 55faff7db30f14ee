"""Ingest's peak memory is bounded by its configuration, not by the number of rows it cuts."""

from benchmarks.stages.bench_ingest_memory import land_long_files_shard, measure_in_subprocess
from speechdata.io.storage import DataRoot

FILES = 32
SMALL_ROWS_PER_FILE, LARGE_ROWS_PER_FILE = 20, 200
MAX_PEAK_GROWTH = 1.5
"""Ten times the rows (and landed audio): the peak may grow by half at most. Holding the results
(the old behaviour) doubled it at these sizes; streaming grows it about 1.2x (the container's row
group and the window of tasks fill up, which the small shard never does)."""


def test_peak_memory_does_not_grow_with_the_row_count(tmp_path):
    peaks = []
    for rows_per_file in (SMALL_ROWS_PER_FILE, LARGE_ROWS_PER_FILE):
        root_dir = tmp_path / f"rows-{rows_per_file}"
        land_long_files_shard(DataRoot(str(root_dir)), "memory", FILES, rows_per_file)
        figures = measure_in_subprocess(str(root_dir), "memory", workers=2)
        assert figures["rows_out"] == FILES * rows_per_file
        peaks.append(max(figures["peak_rss_mb"], figures["peak_worker_rss_mb"]))
    small, large = peaks
    assert large <= small * MAX_PEAK_GROWTH, (
        f"peak RSS {small:.0f} MB at {FILES * SMALL_ROWS_PER_FILE} rows, {large:.0f} MB at {FILES * LARGE_ROWS_PER_FILE}"
    )
