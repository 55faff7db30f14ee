"""The recall benchmark's arithmetic: the per-key load it scales, and where recall crosses a level."""

import numpy as np

from benchmarks.accuracy.bench_near_dup_recall_at_scale import crossing, mean_load


def point(hours: float, recall: float) -> dict:
    return {"hours": hours, "audio_alone": {"recall": recall}}


def test_recall_crossing_a_level_is_interpolated_in_log_hours_and_absent_when_never_crossed():
    curve = [point(1_000, 0.95), point(100, 0.95), point(10_000, 0.85)]

    assert crossing(curve, 0.9, "hours") == round(1_000 * 10**0.5)
    assert crossing(curve, 0.5, "hours") is None


def test_the_load_counts_every_indexed_posting_of_each_query_key_value():
    indexed = [np.array([1, 2, 2], np.uint64), np.array([2, 3], np.uint64)]
    queries = [np.array([2, 4], np.uint64), np.array([1], np.uint64)]

    assert mean_load(queries, indexed) == (3 + 0 + 1) / 3
    assert mean_load(queries, indexed + indexed) == 2 * (3 + 0 + 1) / 3
