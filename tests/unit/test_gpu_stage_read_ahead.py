"""The alignment and QE stages read the next shard's inputs while the current one computes.

Two shards go through one local GPU worker: the second shard's inputs are read on the worker's
read-ahead thread and handed to the stage, and its files are byte for byte those of a run that
reads them itself. An input rewritten between the read-ahead and the shard's turn is read again.
"""

import dataclasses
import os
import posixpath

import pyarrow as pa
import pytest

from resources.alignment_job import alignment_shard_job
from resources.gpu_worker import ShardWorker
from resources.qe_job import qe_shard_job
from speechdata.alignment.log_probs import CTC_FRAME_S
from speechdata.alignment.stage import run_alignments
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.testing.shards import build_sample_shard
from speechdata.translation.qe_stage import run_qe_scores
from speechdata.translation.stage import SEGMENTS_SCHEMA
from tests.tiny_resources import tiny_resources_for


def recording_inputs(job):
    """The job, with each shard's ``inputs`` (as the worker hands them to ``run``) kept by shard id."""
    received = {}

    def run(model, shard_id, inputs, on_progress):
        received[shard_id] = inputs
        return job.run(model, shard_id, inputs, on_progress)

    return dataclasses.replace(job, run=run), received


def files_under(data_root: DataRoot) -> dict[str, bytes]:
    """Every file of the data root (relative path -> bytes), shard locks aside."""
    base = data_root.path("")
    found = {}
    for directory, _, names in os.walk(base):
        for name in names:
            path = os.path.join(directory, name)
            relative = os.path.relpath(path, base)
            if "lock" not in posixpath.basename(relative):
                with open(path, "rb") as handle:
                    found[relative] = handle.read()
    return found


# --- alignments


@pytest.fixture
def two_normalized_shards(data_root):
    for number, shard_id in enumerate(("s1", "s2"), start=1):
        build_sample_shard(data_root, shard_id, 6, seed=number, long_recordings=0, formats=("wav", "flac"))
        run_raw_shards(data_root, shard_id)
        run_normalized_audio(data_root, shard_id)
    return data_root


def test_alignments_of_a_shard_read_ahead_are_byte_identical_to_a_run_that_reads_its_own(
    two_normalized_shards, model_cache_dir
):
    data_root = two_normalized_shards
    aligner = tiny_resources_for(data_root.url, model_cache_dir)["aligner"]
    job, received = recording_inputs(alignment_shard_job(data_root, aligner, write_ctm_files=True))
    worker = ShardWorker("test")

    first = worker.run_shard(job, "s1", next_shard_id="s2")
    second = worker.run_shard(job, "s2")
    assert not first.inputs_read_ahead and second.inputs_read_ahead
    pre_read = received["s2"]
    assert pre_read is not None and pre_read.shard_id == "s2"
    index = data_root.read_parquet(layout.utterance_index("s2")).to_pylist()
    aligned = {row["utt_id"] for row in index if row["language"] in aligner.models}
    assert aligned and {a.utt_id for a in pre_read.audio if a.audio_16k is not None} == aligned
    read_ahead_files = files_under(data_root)

    # The same shard again, the stage reading (and resampling) its inputs itself as without a worker.
    summary = run_alignments(data_root, "s2", aligner.aligner_for, settings=aligner.log_prob_settings(CTC_FRAME_S))
    assert summary.rows_out == second.result.rows_out > 0
    assert {r.utt_id for r in summary.rejects} == {r.utt_id for r in second.result.rejects}
    assert files_under(data_root) == read_ahead_files


def test_a_transcript_rewritten_after_the_alignment_read_ahead_is_read_again(two_normalized_shards, model_cache_dir):
    data_root = two_normalized_shards
    aligner = tiny_resources_for(data_root.url, model_cache_dir)["aligner"]
    job, received = recording_inputs(alignment_shard_job(data_root, aligner, write_ctm_files=False))
    worker = ShardWorker("test")
    worker.run_shard(job, "s1", next_shard_id="s2")

    index = data_root.read_parquet(layout.utterance_index("s2"))
    rows = index.to_pylist()
    [changed] = [row for row in rows if row["language"] == "en"][:1]
    changed["text"] = "the fox the fox the fox"
    data_root.write_parquet(layout.utterance_index("s2"), pa.Table.from_pylist(rows, schema=index.schema))

    second = worker.run_shard(job, "s2")
    assert not second.inputs_read_ahead
    assert received["s2"].utterances[changed["utt_id"]]["text"] == "the fox the fox the fox"
    words = [
        row["text"]
        for row in data_root.read_parquet(layout.alignments("s2")).to_pylist()
        if row["utt_id"] == changed["utt_id"] and row["level"] == "word"
    ]
    assert words == ["the", "fox", "the", "fox", "the", "fox"]


# --- qe_scores


def write_segments(data_root: DataRoot, shard_id: str, pairs: list[tuple[str, str]]) -> None:
    rows = [
        {
            "utt_id": f"{shard_id}-u{i // 2}",
            "latency": "low_latency",
            "segment_index": i % 2,
            "emit_ms": 1000 * (i % 2 + 1),
            "source": source,
            "target": target,
            "first_chunk": i % 2,
            "last_chunk": i % 2,
            "n_unmatched_chunks": 0,
        }
        for i, (source, target) in enumerate(pairs)
    ]
    data_root.write_parquet(layout.streaming_segments(shard_id), pa.Table.from_pylist(rows, schema=SEGMENTS_SCHEMA))


PAIRS = {
    "t1": [("good morning everyone", "大家早上好"), ("we went home", "我们回家了")],
    "t2": [("how did the meeting go today", "今天的会议怎么样"), ("which sites", "哪些网站"), ("hello", "你好")],
}


@pytest.fixture
def qe_shards_and_job(data_root, model_cache_dir):
    """Both shards' segments written; the QE job recording its inputs, the received inputs, the scorer."""
    from resources.qe import MetricXResource
    from resources.qe_job import load_scorer

    for shard_id, pairs in PAIRS.items():
        write_segments(data_root, shard_id, pairs)
    resources = tiny_resources_for(data_root.url, model_cache_dir)
    qe = MetricXResource(profile="tiny", model_cache_dir=model_cache_dir)
    job, received = recording_inputs(qe_shard_job(data_root, qe, resources["torch_device"]))
    return job, received, load_scorer(qe.model_dump(), resources["torch_device"].model_dump())


def test_qe_scores_of_a_shard_read_ahead_are_byte_identical_to_a_run_that_reads_its_own(data_root, qe_shards_and_job):
    job, received, scorer = qe_shards_and_job
    worker = ShardWorker("test")

    first = worker.run_shard(job, "t1", next_shard_id="t2")
    second = worker.run_shard(job, "t2")
    assert not first.inputs_read_ahead and second.inputs_read_ahead
    assert received["t2"] is not None and [r["source"] for r in received["t2"].records] == [s for s, _ in PAIRS["t2"]]
    read_ahead_files = files_under(data_root)

    summary = run_qe_scores(data_root, "t2", scorer)
    assert summary.rows_out == second.result.summary.rows_out == len(PAIRS["t2"])
    assert files_under(data_root) == read_ahead_files


def test_segments_rewritten_after_the_qe_read_ahead_are_read_again(data_root, qe_shards_and_job):
    job, received, _ = qe_shards_and_job
    worker = ShardWorker("test")
    worker.run_shard(job, "t1", next_shard_id="t2")

    write_segments(data_root, "t2", [*PAIRS["t2"], ("good night", "晚安")])  # a re-run upstream
    second = worker.run_shard(job, "t2")
    assert not second.inputs_read_ahead
    assert [r["source"] for r in received["t2"].records][-1] == "good night"
    scored = data_root.read_parquet(layout.qe_scores("t2"))
    assert scored["source"].to_pylist() == [s for s, _ in PAIRS["t2"]] + ["good night"]
