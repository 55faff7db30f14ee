"""Stored matrices written on a thread arrive complete and in order; a write error is never lost."""

import numpy as np
import pytest

from speechdata.features.array_store import ARRAY_STORE_SCHEMA, ArrayStoreWriter, iter_arrays
from speechdata.features.background_writes import BackgroundArrayWrites


def test_batches_written_on_the_thread_are_all_stored_in_submission_order(data_root):
    batches = [[(f"u{b}-{i}", np.full((i + 1, 3), b, np.float32)) for i in range(3)] for b in range(5)]
    with data_root.parquet_writer("store.parquet", ARRAY_STORE_SCHEMA) as parquet:
        store = ArrayStoreWriter(parquet, row_group_bytes=64)
        with BackgroundArrayWrites(store, max_pending=1) as writes:
            for batch in batches:
                writes.submit(batch)
    stored = list(iter_arrays(data_root, "store.parquet"))
    assert [u for u, _ in stored] == [u for batch in batches for u, _ in batch]
    assert all(np.array_equal(m, np.full(m.shape, int(u[1]), np.float16)) for u, m in stored)
    assert store.count == 15


class FailingStore:
    def add(self, utt_id, matrix):
        raise OSError(f"disk full at {utt_id}")

    def flush(self):
        pass


def test_a_write_error_is_raised_in_the_caller():
    writes = BackgroundArrayWrites(FailingStore(), max_pending=1)
    writes.submit([("u1", np.zeros((1, 2)))])
    with pytest.raises(OSError, match="disk full at u1"):
        for _ in range(10):  # the thread reports the error by the next submit or at close
            writes.submit([("u2", np.zeros((1, 2)))])
        writes.close()


def test_a_failed_forward_abandons_the_writes_without_hiding_its_error():
    with pytest.raises(RuntimeError, match="forward failed"), BackgroundArrayWrites(FailingStore()) as writes:
        writes.submit([("u1", np.zeros((1, 2)))])
        raise RuntimeError("forward failed")
    assert not writes._thread.is_alive()
