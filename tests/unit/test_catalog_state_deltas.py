"""On an object-store root the catalog refresh puts up only what changed: a delta of the shards it
listed, applied on a snapshot by the next worker, and a refresh killed mid-upload leaves a root whose
state, taken by a fresh worker, equals a full refresh's."""

import json

import duckdb
import pytest

from speechdata.catalog import database_file, state_store
from speechdata.catalog.database_file import refresh_catalog_file, state_path_of
from speechdata.catalog.state_store import STATE_FOLDER, STATE_LOG, ObjectStoreState
from speechdata.io.storage import DataRoot
from tests.unit.test_catalog import write_manifest, write_rejects
from tests.unit.test_catalog_incremental import SHARD_D, catalog_contents, write_four_shards
from tests.unit.test_catalog_scoped_refresh import CHECKED, COUNTER

pytestmark = pytest.mark.slow  # the loopback S3 server


@pytest.fixture
def bucket_root(data_root, s3_bucket):
    local = write_four_shards(data_root)
    root = DataRoot(f"{s3_bucket}/speech")
    for path in local.fs.find(local.root):
        root.write_bytes(path[len(local.root.rstrip("/")) + 1 :], local.fs.cat_file(path))
    return root


def log_of(root) -> dict:
    return json.loads(root.fs.cat_file(root.path(STATE_LOG)))


def parts_on(root) -> set[str]:
    return {path.rsplit("/", 1)[-1] for path in root.fs.ls(root.path(STATE_FOLDER), detail=False)} - {"log.json"}


def state_a_fresh_worker_takes(root, folder) -> dict:
    """The state a worker with no local copy starts from: the root's snapshot with its deltas applied."""
    folder.mkdir()
    state_path = str(folder / ".catalog.duckdb.state")
    assert ObjectStoreState(root, state_path, database_file.state_table_columns()).fetch()
    with duckdb.connect(state_path, read_only=True) as connection:
        return catalog_contents(connection)


def full_refresh_state(root, folder) -> dict:
    refresh_catalog_file(str(folder / "catalog.duckdb"), root, full=True)
    with duckdb.connect(state_path_of(str(folder / "catalog.duckdb")), read_only=True) as connection:
        return catalog_contents(connection)


def without_counter(contents: dict) -> dict:
    return {name: rows for name, rows in contents.items() if name not in (COUNTER, CHECKED)}


def test_a_scoped_refresh_puts_up_a_delta_of_its_shards_and_a_snapshot_replaces_them_in_time(
    bucket_root, tmp_path, monkeypatch
):
    monkeypatch.setattr(state_store, "DELTAS_PER_SNAPSHOT", 3)
    root = bucket_root
    database_path = str(tmp_path / "worker" / "catalog.duckdb")
    refresh_catalog_file(database_path, root, shards=[])  # the first refresh lists the root: a snapshot
    [snapshot] = parts_on(root)
    assert log_of(root) == {"snapshot": snapshot, "deltas": []}

    write_manifest(root, "shard-e", SHARD_D)
    write_rejects(root, "shard-e", "ingest", ["shard-e_x2"], reason="unreadable_audio")
    refresh_catalog_file(database_path, root, shards=["shard-e"], checked_per_refresh=0)
    root.fs.rm(root.path("manifests/shard=shard-c"), recursive=True)
    refresh_catalog_file(database_path, root, shards=["shard-c"], checked_per_refresh=0)

    log = log_of(root)
    assert log["snapshot"] == snapshot and len(log["deltas"]) == 2, "the state was put up whole again"
    assert parts_on(root) == {snapshot, *log["deltas"]}
    # The first delta holds shard-e's rows alone (and the one-row tables), nothing of the other shards.
    # Small whatever the state: a few rows per table, in DuckDB's smallest blocks.
    assert root.fs.info(root.path(f"{STATE_FOLDER}/{log['deltas'][0]}"))["size"] < 1 << 20
    local_delta = str(tmp_path / "delta.duckdb")
    root.fs.get(root.path(f"{STATE_FOLDER}/{log['deltas'][0]}"), local_delta)
    with duckdb.connect(local_delta, read_only=True) as delta:
        assert delta.execute("SELECT shard FROM delta_scope").fetchall() == [("shard-e",)]
        [(manifests,)] = delta.execute("SELECT list(path) FROM catalog_manifest_files").fetchall()
        assert manifests == ["manifests/shard=shard-e/part-0.parquet"]
        [(shards,)] = delta.execute("SELECT list(DISTINCT shard) FROM catalog_manifest_groups").fetchall()
        assert shards == ["shard-e"]
    with duckdb.connect(state_path_of(database_path), read_only=True) as connection:
        assert state_a_fresh_worker_takes(root, tmp_path / "fresh") == catalog_contents(connection)

    # The third delta would make three: a snapshot goes up instead and the parts it replaces go.
    write_manifest(root, "shard-f", SHARD_D)
    refresh_catalog_file(database_path, root, shards=["shard-f"])
    log = log_of(root)
    assert log["snapshot"] != snapshot and log["deltas"] == []
    assert parts_on(root) == {log["snapshot"]}
    rebuilt = state_a_fresh_worker_takes(root, tmp_path / "fresh-after-snapshot")
    assert without_counter(rebuilt) == without_counter(full_refresh_state(root, tmp_path / "full"))


class Killed(BaseException):
    """Stands for the process dying: nothing in the refresh catches it."""


def test_refreshes_killed_mid_upload_and_the_next_ones_leave_the_root_as_a_full_refresh_would(
    bucket_root, tmp_path, monkeypatch
):
    root = bucket_root
    database_path = str(tmp_path / "worker" / "catalog.duckdb")
    refresh_catalog_file(database_path, root, shards=[])
    opened, recorded = DataRoot.open_atomic, ObjectStoreState._write_record

    def open_unless_the_log(self, relative):
        if relative == STATE_LOG:
            _kill()
        return opened(self, relative)

    def record_unless_published(self):
        if self.pending == [] and self.log["deltas"]:  # the refresh's delta is in the root's log
            _kill()
        recorded(self)

    kills = {
        "before the part went up": (state_store, "upload_database", _kill),
        "between the part and the log": (DataRoot, "open_atomic", open_unless_the_log),
        "after the log": (ObjectStoreState, "_write_record", record_unless_published),
    }
    for number, (where, (owner, name, replacement)) in enumerate(kills.items()):
        killed_shard = f"shard-k{number}"
        write_manifest(root, killed_shard, SHARD_D)
        with monkeypatch.context() as patch:
            patch.setattr(owner, name, replacement)
            with pytest.raises(Killed):
                refresh_catalog_file(database_path, root, shards=[killed_shard], checked_per_refresh=0)
        # The next refresh is told of another shard only: the killed one's rows still reach the root.
        write_rejects(root, "shard-b", "ingest", [f"shard-b_v{number}"], reason="unreadable_audio")
        refreshed = refresh_catalog_file(database_path, root, shards=["shard-b"], checked_per_refresh=0)
        assert refreshed.summary.listed_shards == 1, where
    rebuilt = state_a_fresh_worker_takes(root, tmp_path / "fresh")
    assert without_counter(rebuilt) == without_counter(full_refresh_state(root, tmp_path / "full"))


def _kill(*args, **kwargs):
    raise Killed()
