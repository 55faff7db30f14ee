"""normalized_audio: a bad utterance is a reject, never the end of the shard; workers change nothing."""

import pyarrow as pa
import pytest

import speechdata.landing.normalize as normalize
from speechdata.io import layout
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.testing.shards import build_sample_shard


def test_a_segment_that_fails_to_decode_is_rejected_and_the_rest_survive(data_root, monkeypatch):
    build_sample_shard(data_root, "s1", 6, seed=3, long_recordings=1)
    run_raw_shards(data_root, "s1")
    real = normalize.read_segment_from
    calls = {"n": 0}

    def flaky(sound, start_s, end_s):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("decoder hiccup")
        return real(sound, start_s, end_s)

    monkeypatch.setattr(normalize, "read_segment_from", flaky)
    summary = run_normalized_audio(data_root, "s1", workers=1)
    assert summary.rows_in == 9
    assert summary.rows_out == 8
    assert [(r.reason, r.stage) for r in summary.rejects] == [("audio_decode_failed", "normalized_audio")]
    assert "decoder hiccup" in summary.rejects[0].detail
    ledger = data_root.read_parquet(layout.rejects("s1", "normalized_audio"))
    assert ledger["reason"].to_pylist() == ["audio_decode_failed"]


@pytest.mark.slow
def test_parallel_workers_give_the_same_container_as_one(data_root):
    build_sample_shard(data_root, "s1", 40, seed=4, long_recordings=2)
    run_raw_shards(data_root, "s1")
    run_normalized_audio(data_root, "s1", workers=1)
    one = data_root.read_parquet(layout.normalized_audio("s1"))
    run_normalized_audio(data_root, "s1", workers=2)
    two = data_root.read_parquet(layout.normalized_audio("s1"))
    assert one.num_rows == 46
    assert one.equals(two)


def test_rerun_replaces_outputs_instead_of_appending(data_root):
    build_sample_shard(data_root, "s1", 4, seed=5, with_faults=True)
    for _ in range(2):
        summary = run_raw_shards(data_root, "s1")
        run_normalized_audio(data_root, "s1")
    assert data_root.read_parquet(layout.rejects("s1", "raw_shards")).num_rows == len(summary.rejects) == 5
    assert data_root.read_parquet(layout.normalized_audio("s1")).num_rows == summary.rows_out == 7
    assert isinstance(data_root.read_parquet(layout.utterance_index("s1")), pa.Table)
