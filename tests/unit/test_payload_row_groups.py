"""Payload files are written in bounded row groups, so readers never hold more than one at a time."""

import numpy as np
import pyarrow.parquet as pq

from speechdata.audio.container import ROW_GROUP_BYTES as CONTAINER_ROW_GROUP_BYTES
from speechdata.features.array_store import ROW_GROUP_BYTES as STORE_ROW_GROUP_BYTES
from speechdata.features.array_store import iter_arrays, write_arrays


def test_the_defaults_bound_row_groups_to_a_few_dozen_megabytes():
    assert STORE_ROW_GROUP_BYTES <= 32 << 20 and CONTAINER_ROW_GROUP_BYTES <= 32 << 20


def test_a_feature_store_is_cut_into_row_groups_of_at_most_the_bound_plus_one_matrix(data_root):
    matrix_bytes = 100 * 2048 * 2  # one 8 s utterance of Qwen states, float16
    count = 2 * STORE_ROW_GROUP_BYTES // matrix_bytes + 3
    rng = np.random.default_rng(0)
    matrices = {f"u{i:04d}": rng.standard_normal((100, 2048)).astype(np.float16) for i in range(count)}
    assert write_arrays(data_root, "store.parquet", matrices.items()) == count

    with data_root.fs.open(data_root.path("store.parquet"), "rb") as handle:
        metadata = pq.ParquetFile(handle).metadata
        groups = [metadata.row_group(g) for g in range(metadata.num_row_groups)]
    assert len(groups) == 3
    assert all(g.num_rows * matrix_bytes <= STORE_ROW_GROUP_BYTES + matrix_bytes for g in groups)
    read = dict(iter_arrays(data_root, "store.parquet"))
    assert read.keys() == matrices.keys() and all(np.array_equal(read[k], m) for k, m in matrices.items())
