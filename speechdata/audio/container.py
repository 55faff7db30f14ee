"""The per-shard audio container: one parquet file, one encoded 24 kHz mono row per utterance.

One object per shard (not one per utterance) keeps object-store listings and small-file overhead
out of the way; parquet gives column pruning (read ``utt_id``/``n_samples`` without touching the
audio) and row groups for bounded-memory streaming. DuckDB and polars read it as a table.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speechdata.audio.budget import check_audio_budget
from speechdata.audio.codec import AudioCodec, decode_audio
from speechdata.audio.streamed import StreamedAudio, is_long_form
from speechdata.io.keyed_stream import PAYLOAD_PAGE_BYTES
from speechdata.io.storage import DataRoot

AUDIO_CONTAINER_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("sample_rate", pa.int32(), nullable=False),
        pa.field("n_samples", pa.int64(), nullable=False),
        pa.field("duration_s", pa.float64(), nullable=False),
        pa.field("codec", pa.string(), nullable=False),
        pa.field("audio", pa.binary(), nullable=False),
        pa.field("clipped_share", pa.float32()),
    ]
)
"""``clipped_share``: the share of the source segment's samples at full scale
(:func:`speechdata.audio.truth.clipped_share`); null where the writer did not measure it."""

CONTAINER_PARQUET_OPTIONS = {
    "compression": {"utt_id": "zstd", "codec": "zstd", "audio": "none"},
    "use_dictionary": ["utt_id", "sample_rate", "n_samples", "duration_s", "codec", "clipped_share"],
    "data_page_size": PAYLOAD_PAGE_BYTES,
}
"""Encoded audio does not compress further; zstd over it only burns CPU. Nor does it repeat: a
dictionary over the audio column cost 30 % more writing and twice the reading (docs/changelog.md,
Packing) before parquet gave up on it."""

ROW_GROUP_BYTES = 16 * 1024 * 1024
"""Flush a row group once this much encoded audio is buffered: bounds a writer's and a reader's
memory on any shard size, and how much packing reads before its first sample (16 MiB against
64 MiB: docs/performance.md, Packing)."""


@dataclass(frozen=True)
class EncodedUtterance:
    utt_id: str
    sample_rate: int
    n_samples: int
    codec: AudioCodec
    audio: bytes | np.ndarray
    """The encoded bytes, or any contiguous array holding them (pcm16 from ingest: the int16 samples
    themselves, which the container copies once instead of once more into a ``bytes`` first)."""
    clipped_share: float | None = None
    """The share of the source samples at full scale; None when not measured."""

    @property
    def duration_s(self) -> float:
        return self.n_samples / self.sample_rate

    @property
    def audio_bytes(self) -> int:
        return memoryview(self.audio).nbytes


class AudioContainerWriter:
    """Buffer encoded utterances and write them to a ``pq.ParquetWriter`` in bounded row groups."""

    def __init__(
        self, writer: pq.ParquetWriter, row_group_bytes: int = ROW_GROUP_BYTES, max_utterance_s: float | None = None
    ):
        self._max_utterance_s = max_utterance_s
        self._writer = writer
        self._row_group_bytes = row_group_bytes
        self._pending: list[EncodedUtterance] = []
        self._pending_bytes = 0
        self.rows = 0
        self.audio_seconds = 0.0

    def add(self, utterance: EncodedUtterance) -> None:
        # Every reader decodes an utterance whole: one over the budget is never stored (ingest rejects it first).
        check_audio_budget(
            utterance.n_samples,
            utterance.sample_rate,
            what=f"utterance {utterance.utt_id!r}",
            max_seconds=self._max_utterance_s,
        )
        self._pending.append(utterance)
        self._pending_bytes += utterance.audio_bytes
        self.rows += 1
        self.audio_seconds += utterance.duration_s
        if self._pending_bytes >= self._row_group_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        rows = self._pending
        batch = pa.record_batch(
            [
                pa.array([u.utt_id for u in rows], pa.string()),
                pa.array([u.sample_rate for u in rows], pa.int32()),
                pa.array([u.n_samples for u in rows], pa.int64()),
                pa.array([u.duration_s for u in rows], pa.float64()),
                pa.array([u.codec for u in rows], pa.string()),
                _binary_array([u.audio for u in rows], [u.audio_bytes for u in rows]),
                pa.array([u.clipped_share for u in rows], pa.float32()),
            ],
            schema=AUDIO_CONTAINER_SCHEMA,
        )
        self._writer.write_batch(batch)
        self._pending, self._pending_bytes = [], 0


def _binary_array(payloads: list[bytes | np.ndarray], sizes_bytes: list[int]) -> pa.BinaryArray:
    """The payloads as one Arrow binary column, copied once into a buffer of the exact size.

    ``pa.array`` appends value by value into a doubling buffer (the row group's audio copied about
    twice over); a buffer from Arrow's pool rather than ``b"".join`` matters as much: parquet writes a
    column over Python-owned bytes to a Python file markedly more slowly (docs/changelog.md, Ingest).
    """
    lengths = np.array(sizes_bytes, np.int64)
    total_bytes = int(lengths.sum())
    if total_bytes > np.iinfo(np.int32).max:  # beyond ``binary``'s 32-bit offsets: let Arrow report it
        return pa.array([bytes(memoryview(p)) for p in payloads], pa.binary())
    offsets = np.zeros(len(payloads) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = pa.allocate_buffer(total_bytes)
    view = np.frombuffer(data, np.uint8)
    for payload, start, end in zip(payloads, offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        view[start:end] = np.frombuffer(payload, np.uint8)
    return pa.BinaryArray.from_buffers(pa.binary(), len(payloads), [None, pa.py_buffer(offsets), data])


def iter_container_audio(
    data_root: DataRoot, relative: str, utt_ids: set[str] | None = None
) -> Iterator[tuple[str, np.ndarray, int]]:
    """Yield ``(utt_id, samples float32 [n], sample_rate)`` row group by row group."""
    with data_root.open_parquet(relative) as parquet:
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group, columns=["utt_id", "sample_rate", "codec", "audio"])
            for utt_id, rate, codec, data in zip(
                table["utt_id"].to_pylist(),
                table["sample_rate"].to_pylist(),
                table["codec"].to_pylist(),
                table["audio"].to_pylist(),
                strict=True,
            ):
                if utt_ids is not None and utt_id not in utt_ids:
                    continue
                yield utt_id, decode_audio(data, codec), rate


def iter_container_payloads(
    data_root: DataRoot, relative: str, utt_ids: set[str] | None = None
) -> Iterator[tuple[str, int, int, str, pa.Buffer]]:
    """Yield ``(utt_id, n_samples, sample_rate, codec, payload)`` row group by row group, undecoded
    (a reader that decodes only what it needs, or in pieces: the alignment of long utterances).

    The payload is a view of the row group's own memory (``pa.Buffer``: the buffer protocol, and
    ``pa.BufferReader`` for a file-like), not a copy; and without ``pre_buffer`` the reader keeps no
    cached copy of the column chunk (with it, and with ``to_pylist``, a 2-hour FLAC of 244 MB was
    resident three times over once read: 836 MB against 588 MB)."""
    with data_root.open_parquet(relative, pre_buffer=False) as parquet:
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group, columns=["utt_id", "sample_rate", "n_samples", "codec", "audio"])
            audio = table["audio"]
            for row, (utt_id, rate, n_samples, codec) in enumerate(
                zip(
                    table["utt_id"].to_pylist(),
                    table["sample_rate"].to_pylist(),
                    table["n_samples"].to_pylist(),
                    table["codec"].to_pylist(),
                    strict=True,
                )
            ):
                if utt_ids is not None and utt_id not in utt_ids:
                    continue
                yield utt_id, n_samples, rate, codec, audio[row].as_buffer()


def read_container_index(data_root: DataRoot, relative: str) -> pa.Table:
    """``utt_id``, ``sample_rate``, ``n_samples``, ``duration_s`` and ``clipped_share`` for every
    utterance, without the audio (``clipped_share`` null in a container written before it existed)."""
    columns = ["utt_id", "sample_rate", "n_samples", "duration_s"]
    with data_root.open_parquet(relative) as parquet:
        has_clipping = "clipped_share" in parquet.schema_arrow.names
    table = data_root.read_parquet(relative, columns=columns + (["clipped_share"] if has_clipping else []))
    if not has_clipping:
        table = table.append_column(pa.field("clipped_share", pa.float32()), pa.nulls(table.num_rows, pa.float32()))
    return table


def iter_container_utterances(
    data_root: DataRoot, relative: str, utt_ids: set[str] | None = None
) -> Iterator[tuple[str, np.ndarray | StreamedAudio, int]]:
    """:func:`iter_container_audio`, except that an utterance past the whole-decode budget comes as a
    :class:`~speechdata.audio.streamed.StreamedAudio` at its stored rate (sliced window by window,
    never decoded whole) instead of its samples."""
    for utt_id, n_samples, rate, codec, payload in iter_container_payloads(data_root, relative, utt_ids):
        if is_long_form(n_samples, rate):
            yield utt_id, StreamedAudio(payload, codec, rate, n_samples, rate), rate
        else:
            yield utt_id, decode_audio(payload, codec), rate
