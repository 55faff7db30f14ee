"""A per-shard store of one float16 matrix per utterance (hidden states, pooled features).

One parquet file per shard and product: ``utt_id``, ``n_rows``, ``dim``, ``dtype`` and ``data``
(the C-order bytes of the matrix). Row groups are flushed at a byte budget so writing any shard
takes bounded memory; reading by ``utt_id`` decodes only what is asked for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speechdata.io.keyed_stream import PAYLOAD_PAGE_BYTES
from speechdata.io.storage import DataRoot

ARRAY_STORE_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("n_rows", pa.int32(), nullable=False),
        pa.field("dim", pa.int32(), nullable=False),
        pa.field("dtype", pa.string(), nullable=False),
        pa.field("data", pa.binary(), nullable=False),
    ]
)
ARRAY_STORE_PARQUET_OPTIONS = {
    "compression": {"utt_id": "zstd", "n_rows": "zstd", "dim": "zstd", "dtype": "zstd", "data": "none"},
    # Matrices never repeat: a dictionary over them only slows writing and reading (docs/changelog.md, Packing).
    "use_dictionary": ["utt_id", "n_rows", "dim", "dtype"],
    "data_page_size": PAYLOAD_PAGE_BYTES,
}
ROW_GROUP_BYTES = 16 * 1024 * 1024
"""Flush a row group once this much is buffered. Readers hold a whole row group's column chunk
(Arrow reads it whole), and packing reads its first row groups before the first sample is written:
16 MiB halved packing's peak memory and made its cost per utterance flat from 1 000 to 20 000
utterances against 128 MiB (docs/performance.md, Packing)."""


class ArrayStoreWriter:
    def __init__(self, writer: pq.ParquetWriter, row_group_bytes: int = ROW_GROUP_BYTES):
        self._writer = writer
        self._row_group_bytes = row_group_bytes
        self._rows: list[tuple[str, np.ndarray]] = []
        self._bytes = 0
        self.count = 0

    def add(self, utt_id: str, matrix: np.ndarray) -> None:
        if matrix.ndim != 2:
            raise ValueError(f"{utt_id}: expected a 2-D matrix, got shape {matrix.shape}")
        matrix = np.ascontiguousarray(matrix, dtype=np.float16)
        self._rows.append((utt_id, matrix))
        self._bytes += matrix.nbytes
        self.count += 1
        if self._bytes >= self._row_group_bytes:
            self.flush()

    def flush(self) -> None:
        if not self._rows:
            return
        rows = self._rows
        self._writer.write_batch(
            pa.record_batch(
                [
                    pa.array([u for u, _ in rows], pa.string()),
                    pa.array([m.shape[0] for _, m in rows], pa.int32()),
                    pa.array([m.shape[1] for _, m in rows], pa.int32()),
                    pa.array(["float16"] * len(rows), pa.string()),
                    pa.array([m.tobytes() for _, m in rows], pa.binary()),
                ],
                schema=ARRAY_STORE_SCHEMA,
            )
        )
        self._rows, self._bytes = [], 0


def write_arrays(data_root: DataRoot, relative: str, items: Iterable[tuple[str, np.ndarray]]) -> int:
    """Write ``(utt_id, matrix)`` pairs atomically; returns how many were written."""
    with data_root.parquet_writer(relative, ARRAY_STORE_SCHEMA, **ARRAY_STORE_PARQUET_OPTIONS) as parquet:
        store = ArrayStoreWriter(parquet)
        for utt_id, matrix in items:
            store.add(utt_id, matrix)
        store.flush()
    return store.count


def iter_arrays(
    data_root: DataRoot, relative: str, utt_ids: set[str] | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """Yield ``(utt_id, float16 [n_rows, dim])`` row group by row group."""
    with data_root.open_parquet(relative) as parquet:
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group)
            for utt_id, n_rows, dim, dtype, data in zip(
                *(table[c].to_pylist() for c in ARRAY_STORE_SCHEMA.names), strict=True
            ):
                if utt_ids is not None and utt_id not in utt_ids:
                    continue
                yield utt_id, np.frombuffer(data, dtype=dtype).reshape(n_rows, dim)


def read_array_shapes(data_root: DataRoot, relative: str) -> dict[str, tuple[int, int]]:
    table = data_root.read_parquet(relative, columns=["utt_id", "n_rows", "dim"])
    return {u: (n, d) for u, n, d in zip(*(table[c].to_pylist() for c in ("utt_id", "n_rows", "dim")), strict=True)}
