"""The HF state identifies a segment by (shard_id, key); a state written when key alone was the
primary key is re-keyed in place on first use, its rows kept."""

import duckdb

from speechdata.hf.state import state_connection
from speechdata.io import layout

OLD_SEGMENTS = """
CREATE TABLE segments (
    key VARCHAR PRIMARY KEY, recording_id VARCHAR NOT NULL, shard_id VARCHAR NOT NULL, split VARCHAR NOT NULL,
    subset_id INTEGER, file VARCHAR, status VARCHAR NOT NULL, reason VARCHAR, error_message VARCHAR,
    updated_at TIMESTAMP DEFAULT current_timestamp
)
"""


def test_a_state_keyed_by_utt_id_alone_is_rekeyed_and_then_holds_the_same_id_from_two_shards(data_root):
    relative = layout.hf_state_database("speech-segments", "de")
    path = data_root.path(relative)
    data_root.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with duckdb.connect(path) as old:
        old.execute(OLD_SEGMENTS)
        old.execute(
            "INSERT INTO segments (key, recording_id, shard_id, split, file, status) "
            "VALUES ('utt_000000', 'r', 'granary-a', 'train', 'de/train_1-00000-of-00001.parquet', 'uploaded')"
        )
    with state_connection(data_root, relative) as db:
        db.execute(
            "INSERT INTO segments (shard_id, key, recording_id, split, status) "
            "VALUES ('granary-b', 'utt_000000', 'r2', 'train', 'pending')"
        )
    with state_connection(data_root, relative) as db:
        rows = db.execute("SELECT shard_id, key, file, status FROM segments ORDER BY shard_id").fetchall()
    assert rows == [
        ("granary-a", "utt_000000", "de/train_1-00000-of-00001.parquet", "uploaded"),
        ("granary-b", "utt_000000", None, "pending"),
    ]
