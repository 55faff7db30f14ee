"""Damaged or truncated intermediates fail the stage that reads them, naming the file and its producer."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from speechdata.audio.container import iter_container_audio
from speechdata.bridge.commit import stage_bridge
from speechdata.bridge.tars import iter_bridge_samples
from speechdata.features.array_store import iter_arrays
from speechdata.io import layout
from speechdata.io.keyed_stream import KeyedRows, read_keys
from speechdata.io.parquet_integrity import UnreadableIntermediate, producer_of
from speechdata.io.storage import DataRoot
from speechdata.testing.packing_inputs import write_packing_inputs

SHARD = "s"


@pytest.fixture
def shard_root(data_root: DataRoot) -> DataRoot:
    write_packing_inputs(data_root, SHARD, 24, seconds=1.0, qwen_dim=8, wavlm_dim=8)
    return data_root


def overwrite_inside_column(data_root: DataRoot, relative: str, column: str, garbage: bytes = b"\xa5" * 64) -> None:
    """Garbage written over the middle of ``column``'s first column chunk (a payload, not a header)."""
    path = data_root.path(relative)
    chunk = pq.ParquetFile(path).metadata.row_group(0)
    names = [chunk.column(i).path_in_schema for i in range(chunk.num_columns)]
    meta = chunk.column(names.index(column))
    position = meta.data_page_offset + meta.total_compressed_size // 2
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(garbage)


def test_garbage_in_the_audio_container_fails_packing_naming_the_file_and_its_producer(shard_root):
    overwrite_inside_column(shard_root, layout.normalized_audio(SHARD), "audio")
    with pytest.raises(UnreadableIntermediate, match=r"shards/s/audio_24k\.parquet.*re-run normalized_audio"):
        stage_bridge(shard_root, SHARD, iter_bridge_samples(shard_root, SHARD))
    assert not shard_root.exists(layout.staged_bridge_index(SHARD))  # never marked ready to commit


@pytest.mark.parametrize("max_buffer_bytes", [256 * 1024 * 1024, 0], ids=["streamed", "random-access"])
def test_every_reader_of_a_damaged_payload_file_refuses_it(shard_root, max_buffer_bytes):
    audio = layout.normalized_audio(SHARD)
    overwrite_inside_column(shard_root, audio, "audio")
    keys = sorted(read_keys(shard_root, audio))  # the key column's pages are intact: a pruned read still works
    with pytest.raises(UnreadableIntermediate, match=r"shards/s/audio_24k\.parquet"):
        list(KeyedRows(shard_root, audio, ["audio"], keys, max_buffer_bytes=max_buffer_bytes))
    with pytest.raises(UnreadableIntermediate, match=r"shards/s/audio_24k\.parquet"):
        list(iter_container_audio(shard_root, audio))
    with pytest.raises(UnreadableIntermediate, match=r"shards/s/audio_24k\.parquet"):
        shard_root.read_parquet(audio)


def test_a_damaged_feature_store_names_the_feature_stage(shard_root):
    overwrite_inside_column(shard_root, layout.wavlm_features(SHARD), "data")
    with pytest.raises(UnreadableIntermediate, match=r"shards/s/wavlm_features\.parquet.*re-run wavlm_features"):
        list(iter_arrays(shard_root, layout.wavlm_features(SHARD)))


def test_a_truncated_intermediate_names_the_file_and_the_stage_that_writes_it(shard_root):
    path = shard_root.path(layout.frame_grids(SHARD))
    with open(path, "r+b") as handle:
        handle.truncate(handle.seek(0, 2) // 2)
    with pytest.raises(UnreadableIntermediate, match=r"shards/s/frame_grids\.parquet.*re-run frame_grids") as caught:
        shard_root.read_parquet(layout.frame_grids(SHARD))
    assert caught.value.relative == layout.frame_grids(SHARD)
    with pytest.raises(UnreadableIntermediate, match=r"shards/s/frame_grids\.parquet"):
        stage_bridge(shard_root, SHARD, iter_bridge_samples(shard_root, SHARD))


def test_a_missing_file_is_still_file_not_found(data_root):
    with pytest.raises(FileNotFoundError):
        data_root.read_parquet(layout.frame_grids(SHARD))


def test_intact_files_read_back_unchanged_through_the_verifying_readers(shard_root):
    audio = layout.normalized_audio(SHARD)
    keys = sorted(read_keys(shard_root, audio))
    streamed = [bytes(row["audio"]) for row in KeyedRows(shard_root, audio, ["audio"], keys)]
    whole = dict(zip(*(shard_root.read_parquet(audio)[c].to_pylist() for c in ("utt_id", "audio"))))
    assert streamed == [whole[k] for k in keys]


@pytest.mark.parametrize(
    ("relative", "producer"),
    [
        (layout.utterance_index("x"), "raw_shards"),
        (layout.alignment_scores("x"), "alignments"),
        (layout.qwen_hidden_states("x"), "qwen_hidden_states"),
        (layout.rejects("x", "vad"), "the stage vad"),
        (layout.staged_bridge_index("x"), "bridge_tars"),
        (layout.streaming_segments("x"), "streaming_segments"),
    ],
)
def test_each_intermediate_names_the_asset_that_writes_it(relative, producer):
    assert producer_of(relative) == producer


def test_whole_table_writes_carry_page_checksums_too(data_root):
    relative = layout.alignment_scores(SHARD)
    payload = [bytes([n]) * 50_000 for n in range(8)]
    data_root.write_parquet(
        relative, pa.table({"utt_id": [f"u{n}" for n in range(8)], "blob": payload}), compression="none"
    )
    overwrite_inside_column(data_root, relative, "blob")
    with pytest.raises(UnreadableIntermediate, match=r"shards/s/alignment_scores\.parquet.*re-run alignments"):
        data_root.read_parquet(relative)
