"""The audio container: payloads given as arrays are stored exactly as the same bytes would be."""

import hashlib

import numpy as np
import pyarrow.parquet as pq

from speechdata.audio.codec import decode_pcm16, encode_audio, encode_audio_payload
from speechdata.audio.container import (
    AUDIO_CONTAINER_SCHEMA,
    CONTAINER_PARQUET_OPTIONS,
    AudioContainerWriter,
    EncodedUtterance,
)


def _write(data_root, name, utterances, row_group_bytes):
    with data_root.parquet_writer(name, AUDIO_CONTAINER_SCHEMA, **CONTAINER_PARQUET_OPTIONS) as parquet:
        container = AudioContainerWriter(parquet, row_group_bytes=row_group_bytes)
        for utterance in utterances:
            container.add(utterance)
        container.flush()
    with data_root.fs.open(data_root.path(name), "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def test_int16_array_payloads_write_the_same_file_as_bytes(data_root):
    rng = np.random.default_rng(3)
    clips = [rng.uniform(-1.1, 1.1, int(rng.integers(1, 40_000))).astype(np.float32) for _ in range(9)]
    as_arrays = [
        EncodedUtterance(f"u{i}", 24_000, len(c), "pcm16", encode_audio_payload(c, 24_000, "pcm16"))
        for i, c in enumerate(clips)
    ]
    as_bytes = [
        EncodedUtterance(f"u{i}", 24_000, len(c), "pcm16", encode_audio(c, 24_000, "pcm16"))
        for i, c in enumerate(clips)
    ]
    assert all(a.audio_bytes == len(b.audio) for a, b in zip(as_arrays, as_bytes))
    # small row groups: the flush that builds the audio column runs several times
    assert _write(data_root, "a.parquet", as_arrays, 100_000) == _write(data_root, "b.parquet", as_bytes, 100_000)
    with data_root.fs.open(data_root.path("a.parquet"), "rb") as handle:
        assert pq.ParquetFile(handle).num_row_groups > 1
    stored = data_root.read_parquet("a.parquet")
    for row, clip in zip(stored.to_pylist(), clips):
        assert np.array_equal(decode_pcm16(row["audio"], "pcm16"), np.rint(np.clip(clip, -1, 1) * 32767))
