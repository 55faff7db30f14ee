"""bench_publish_state's windowed selection chooses what a plain sort-and-filter chooses, whatever
the storage order of the state's segments (the windows only guess the key order from it)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.corpus.bench_publish_state import choose_batch, synthetic
from speechdata.hf.state import registered_rows, state_connection
from speechdata.io.storage import DataRoot


def _reference(columns: dict[str, np.ndarray], max_cer: float, batch: int) -> list[str]:
    order = np.argsort(columns["key"], kind="stable")
    keys = columns["key"][order]
    wanted = (columns["status"] == "pending") & (columns["split"] == "train") & (columns["cer"] <= max_cer)
    return keys[wanted[order]][:batch].tolist()


@pytest.mark.parametrize("storage_order", ["key", "shuffled", "reversed"])
@pytest.mark.parametrize("batch", [1, 700, 5_000])
def test_windowed_selection_equals_sort_and_filter(tmp_path, storage_order, batch):
    columns = synthetic(6_000, seed=3)
    # Stored out of key order: registration order is whatever the shards arrived in.
    permutation = {
        "key": np.arange(6_000),
        "shuffled": np.random.default_rng(4).permutation(6_000),
        "reversed": np.arange(6_000)[::-1],
    }[storage_order]
    root = DataRoot(str(tmp_path))
    with (
        state_connection(root, "state.duckdb") as connection,
        registered_rows(
            connection,
            "new",
            {name: pa.array(columns[name][permutation]) for name in ("key", "video_id", "split", "status")},
        ),
    ):
        connection.execute(
            "INSERT INTO segments (key, recording_id, shard_id, split, status) "
            "SELECT key, video_id, 'shard', split, status FROM new"
        )
    facts = str(tmp_path / "facts.parquet")
    pq.write_table(pa.table({name: columns[name] for name in ("key", "cer")}), facts, row_group_size=1_000)
    with state_connection(root, "state.duckdb") as connection:
        chosen = choose_batch(connection, facts, 0.15, batch)
        rows = connection.execute(
            "SELECT key FROM segments WHERE rowid IN (SELECT unnest(?::BIGINT[]))", [chosen["row"].to_pylist()]
        ).fetchall()
    expected = _reference(columns, 0.15, batch)
    assert chosen["key"].to_pylist() == expected
    assert sorted(key for (key,) in rows) == sorted(expected)  # each row id is its key's row
    assert len(expected) == min(batch, len(_reference(columns, 0.15, 10**9)))
