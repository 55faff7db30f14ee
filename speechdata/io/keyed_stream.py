"""Read rows of a per-shard parquet file in a caller's key order, in one pass over the file.

Packing joins four per-shard files (audio container, two feature stores, frame grids) by ``utt_id``
and writes them in key order. Loading every file per batch of keys re-reads the shard once per
batch (quadratic); loading each file whole makes memory grow with the shard. Here each file is read
once, batch by batch in its own order (``ParquetFile.iter_batches``, one row group at a time), and a
row read before its turn waits in a reorder buffer. Files written in key order (qwen, grids, the
utterance index) never buffer; the audio container (ordered by source file and start time) buffers
only as far as its order strays from key order.

How far that is gets computed beforehand from the ``utt_id`` column alone. A file whose reorder
buffer would pass ``max_buffer_bytes`` is instead read by random access, one row group at a time
with the last one cached: bounded memory, at the price of re-reading row groups.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from speechdata.io.storage import DataRoot

DEFAULT_MAX_BUFFER_BYTES = 256 * 1024 * 1024
BATCH_ROWS = 64
STREAM_BUFFER_BYTES = 4 * 1024 * 1024
PAYLOAD_PAGE_BYTES = 8 * 1024 * 1024
"""Data page size for the payload stores (audio container, feature stores): a few whole payloads per
page. With parquet's default 1 MiB pages, Arrow reads a column of 400 KB values about half as fast."""


def read_keys(data_root: DataRoot, relative: str, key: str = "utt_id") -> list[str]:
    """The key column alone (column pruning: no payload is read)."""
    return data_root.read_parquet(relative, columns=[key])[key].to_pylist()


def reorder_buffer_rows(file_keys: Sequence[str], wanted: Sequence[str]) -> int:
    """The most rows that wait in the reorder buffer when ``wanted`` is read from a file in ``file_keys`` order."""
    if not wanted:
        return 0
    position = {k: i for i, k in enumerate(file_keys)}
    positions = np.fromiter((position[k] for k in wanted), dtype=np.int64, count=len(wanted))
    furthest_read = np.maximum.accumulate(positions)
    # Rows read so far that are wanted = rank of the furthest position among the wanted positions.
    read = np.searchsorted(np.sort(positions), furthest_read, side="right")
    return int((read - np.arange(1, len(wanted) + 1)).max())


class KeyedRows:
    r"""Rows of one parquet file, delivered as ``{column: value}`` in the order of ``wanted``.

    ``wanted`` must be a subset of the file's keys (a :class:`KeyError` names the first missing).
    Binary columns come back as ``memoryview``\ s of the Arrow buffer, list columns as numpy arrays, scalars as Python values.
    """

    def __init__(
        self,
        data_root: DataRoot,
        relative: str,
        columns: list[str],
        wanted: Sequence[str],
        *,
        key: str = "utt_id",
        max_buffer_bytes: int = DEFAULT_MAX_BUFFER_BYTES,
    ):
        self.data_root, self.relative, self.key = data_root, relative, key
        self.columns = [key, *[c for c in columns if c != key]]
        self.wanted = list(wanted)
        file_keys = read_keys(data_root, relative, key)
        known = set(file_keys)
        missing = next((k for k in self.wanted if k not in known), None)
        if missing is not None:
            raise KeyError(f"{data_root.uri(relative)}: no row with {key} {missing!r}")
        self.file_keys = file_keys
        self.buffer_rows = reorder_buffer_rows(file_keys, self.wanted)
        with data_root.open_parquet(relative) as parquet:
            metadata = parquet.metadata
        row_bytes = sum(metadata.row_group(g).total_byte_size for g in range(metadata.num_row_groups))
        self.bytes_per_row = row_bytes / max(metadata.num_rows, 1)
        self.streamed = self.buffer_rows * self.bytes_per_row <= max_buffer_bytes

    def __iter__(self) -> Iterator[dict]:
        return self._stream() if self.streamed else self._random_access()

    def _stream(self) -> Iterator[dict]:
        wanted_set = set(self.wanted)
        pending: dict[str, dict] = {}
        turn = 0
        # A buffered stream reads a column chunk page by page instead of whole: memory per file
        # stays near one batch rather than one row group (64-128 MB of payload).
        with self.data_root.open_parquet(self.relative, buffer_size=STREAM_BUFFER_BYTES) as parquet:
            # One row group per iter_batches call: over the whole file, Arrow's reader keeps more
            # and more of it alive (measured: live Arrow memory and RSS grow with the file).
            for group in range(parquet.num_row_groups):
                for batch in parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], columns=self.columns):
                    for row in _rows(batch):
                        if row[self.key] in wanted_set:
                            pending[row[self.key]] = row
                    while turn < len(self.wanted) and self.wanted[turn] in pending:
                        yield pending.pop(self.wanted[turn])
                        turn += 1
                    if turn == len(self.wanted):
                        return

    def _random_access(self) -> Iterator[dict]:
        with self.data_root.open_parquet(self.relative) as parquet:
            starts = np.cumsum([0] + [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)])
            position = {k: i for i, k in enumerate(self.file_keys)}
            cached_group, cached = -1, None
            for wanted_key in self.wanted:
                row = position[wanted_key]
                group = int(np.searchsorted(starts, row, side="right")) - 1
                if group != cached_group:
                    cached_group, cached = group, parquet.read_row_group(group, columns=self.columns)
                [found] = _rows(cached.slice(row - int(starts[group]), 1))
                yield found


def _rows(batch: pa.RecordBatch | pa.Table) -> list[dict]:
    """The batch as row dicts, list columns as numpy slices of one flat buffer (no Python ints)."""
    columns: dict[str, list] = {}
    for name in batch.column_names:
        column = batch.column(name)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_list(column.type):
            offsets = column.offsets.to_numpy()
            # zero-copy: the default path converts through pandas (and imports it: seconds).
            values = column.values.to_numpy(zero_copy_only=column.values.null_count == 0)
            columns[name] = [values[offsets[i] : offsets[i + 1]] for i in range(len(column))]
        elif pa.types.is_binary(column.type) and column.null_count == 0 and column.buffers()[2] is not None:
            # Views into the batch's Arrow buffer, not a ``bytes`` copy each: audio payloads of many
            # sizes copied through malloc fragment glibc's heap until RSS grows with the shard.
            offsets = np.frombuffer(column.buffers()[1], np.int32)[column.offset : column.offset + len(column) + 1]
            data = memoryview(column.buffers()[2])
            columns[name] = [data[offsets[i] : offsets[i + 1]] for i in range(len(column))]
        else:
            columns[name] = column.to_pylist()
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


READ_AHEAD_ROWS = 32


def read_ahead(rows: Iterable[dict], depth: int = READ_AHEAD_ROWS) -> Iterator[dict]:
    """``rows`` produced by a background thread, at most ``depth`` ahead of the caller.

    Arrow reads and decodes without the GIL, so the files of a join read side by side (on a cold
    cache, one file's disk reads overlap another's decoding). What the thread raises is raised here;
    a caller that stops early stops the thread.
    """
    handoff: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def offer(item: tuple) -> bool:
        """Put ``item`` unless the caller has stopped (then a full queue would block forever)."""
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for row in rows:
                if not offer((row, None)):
                    return
            offer((done, None))
        except BaseException as error:  # handed to the consumer, which re-raises it
            offer((done, error))

    thread = threading.Thread(target=produce, name="read-ahead", daemon=True)
    thread.start()
    try:
        while True:
            row, error = handoff.get()
            if row is done:
                if error is not None:
                    raise error
                return
            yield row
    finally:
        stop.set()
        thread.join()
