"""A catalog refresh within a memory limit: it spills what does not fit, in a folder of its own."""

import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks.corpus.bench_catalog_refresh import write_corpus_shard
from speechdata.catalog import accounting_state, database_file, incremental, quality_state
from speechdata.catalog.database_file import CatalogRefreshOutOfMemory, refresh_catalog_file
from speechdata.catalog.refresh_memory import (
    DEFAULT_MEMORY_LIMIT,
    MEMORY_LIMIT_ENV,
    THREADS_ENV,
    RefreshMemory,
    refresh_memory_from_env,
)
from speechdata.io.storage import TEMP_PREFIX, DataRoot
from tests.unit.test_catalog_scoped_refresh import comparable, contents, state_contents

TINY_LIMIT_MB = 24
SHARDS, ROWS = 30, 2_000


def _uncompressed_mb(root: DataRoot) -> float:
    total = 0
    for folder, _, names in os.walk(root.root):
        for name in names:
            if name.endswith(".parquet"):
                meta = pq.ParquetFile(os.path.join(folder, name)).metadata
                total += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return total / 2**20


def _spilled_files_while_refreshing(monkeypatch) -> list[list[str]]:
    """The files in each refresh's spill folder once the state is synced (before DuckDB removes them)."""
    seen: list[list[str]] = []
    build_published = database_file._build_published

    def spying(*args, **kwargs):
        config = next(arg for arg in args if isinstance(arg, dict))
        spill = os.path.dirname(config["temp_directory"])
        seen.append(sorted(name for _, _, names in os.walk(spill) for name in names if name.endswith(".tmp")))
        return build_published(*args, **kwargs)

    monkeypatch.setattr(database_file, "_build_published", spying)
    return seen


def test_a_first_import_of_more_data_than_the_memory_limit_spills_and_equals_the_unlimited_one(
    data_root, tmp_path, monkeypatch
):
    root = data_root
    rng = np.random.default_rng(0)
    for index in range(SHARDS):
        write_corpus_shard(root, rng, index, ROWS)
    # What the first import reads, uncompressed, is more than the limit: the rows cannot all be held.
    assert _uncompressed_mb(root) > 1.2 * TINY_LIMIT_MB
    spilled = _spilled_files_while_refreshing(monkeypatch)

    bounded_path = str(tmp_path / "bounded" / "catalog.duckdb")
    bounded = refresh_catalog_file(bounded_path, root, memory=RefreshMemory(f"{TINY_LIMIT_MB}MB", threads=1))
    unlimited_path = str(tmp_path / "unlimited" / "catalog.duckdb")
    unlimited = refresh_catalog_file(unlimited_path, root, memory=RefreshMemory(None))

    assert spilled[0], "the bounded refresh never spilled"
    assert not spilled[1], "the unlimited refresh spilled"
    assert bounded.summary.samples == SHARDS * ROWS
    assert comparable(bounded.summary) == comparable(unlimited.summary)
    assert state_contents(bounded_path) == state_contents(unlimited_path)
    assert contents(bounded_path, root) == contents(unlimited_path, root)
    # The spill folder went with the refresh.
    for path in (bounded_path, unlimited_path):
        assert not [name for name in os.listdir(os.path.dirname(path)) if name.startswith(TEMP_PREFIX)]


def test_a_refresh_that_cannot_fit_even_spilling_names_the_setting_to_raise(data_root, tmp_path):
    root = data_root
    rng = np.random.default_rng(0)
    for index in range(4):
        write_corpus_shard(root, rng, index, 200)
    database = str(tmp_path / "catalog.duckdb")
    with pytest.raises(CatalogRefreshOutOfMemory, match=f"{MEMORY_LIMIT_ENV}.*{THREADS_ENV}"):
        refresh_catalog_file(database, root, memory=RefreshMemory("1MB", threads=1))
    assert not [name for name in os.listdir(tmp_path) if name.startswith(TEMP_PREFIX)]
    # The state rolled back: a refresh within a workable limit imports the corpus whole.
    assert refresh_catalog_file(database, root, memory=RefreshMemory("64MB")).summary.samples == 4 * 200


def test_a_killed_refresh_s_spill_folder_is_removed_by_the_next(data_root, tmp_path):
    root = data_root
    write_corpus_shard(root, np.random.default_rng(0), 0, 10)
    database = tmp_path / "catalog.duckdb"
    orphan = tmp_path / f"{TEMP_PREFIX}0123456789ab-catalog.duckdb.spill" / "state"
    orphan.mkdir(parents=True)
    (orphan / "duckdb_temp_storage-0.tmp").write_bytes(b"spilled")
    elsewhere = tmp_path / "kept"
    elsewhere.mkdir()
    (elsewhere / "file").write_bytes(b"not the catalog's")
    # A link named like a spill folder goes, never what it points at.
    (tmp_path / f"{TEMP_PREFIX}ba9876543210-catalog.duckdb.spill").symlink_to(elsewhere)
    refresh_catalog_file(str(database), root)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(TEMP_PREFIX)]
    assert (elsewhere / "file").read_bytes() == b"not the catalog's"


def test_the_memory_settings_come_from_the_environment():
    assert refresh_memory_from_env({}) == RefreshMemory(DEFAULT_MEMORY_LIMIT, None)
    assert refresh_memory_from_env({MEMORY_LIMIT_ENV: "4GB", THREADS_ENV: "2"}) == RefreshMemory("4GB", 2)
    assert refresh_memory_from_env({MEMORY_LIMIT_ENV: "none"}).memory_limit is None
    assert RefreshMemory("512MB", 2).config("/spill") == {
        "temp_directory": "/spill",
        "preserve_insertion_order": False,
        "memory_limit": "512MB",
        "threads": 2,
    }
    with pytest.raises(ValueError, match=THREADS_ENV):
        refresh_memory_from_env({THREADS_ENV: "zero"})


def _recount_inserts(monkeypatch) -> list[dict]:
    """Each count a recount inserts into the state: whether it was read on the refresh's own
    connection, and the temp tables that connection holds then."""
    seen: list[dict] = []
    for module in (accounting_state, quality_state):
        insert_counted = module.insert_counted

        def spying(connection, table, scratch, select_sql, parameters=None, insert_counted=insert_counted):
            temp = connection.execute("SELECT table_name FROM duckdb_tables() WHERE temporary").fetchall()
            seen.append({"table": table, "on_refresh": scratch is connection, "refresh_temp_tables": temp})
            return insert_counted(connection, table, scratch, select_sql, parameters)

        monkeypatch.setattr(module, "insert_counted", spying)
    return seen


def test_a_first_import_read_and_recounted_in_turns_equals_one_in_a_single_go(data_root, tmp_path, monkeypatch):
    root = data_root
    rng = np.random.default_rng(0)
    for index in range(7):
        write_corpus_shard(root, rng, index, 20)
    inserts = _recount_inserts(monkeypatch)
    whole_path = str(tmp_path / "whole" / "catalog.duckdb")
    whole = refresh_catalog_file(whole_path, root)
    # One turn: read on the refresh's connection, as a refresh of the shards that changed does.
    assert inserts and all(i["on_refresh"] for i in inserts)
    assert any(i["refresh_temp_tables"] for i in inserts)
    inserts.clear()
    # Three turns of shards (2, 2, 2, 1) and reads of two files at a time.
    monkeypatch.setattr(incremental, "FILES_PER_READ", 2)
    monkeypatch.setattr(accounting_state, "SHARDS_PER_RECOUNT", 2)
    monkeypatch.setattr(quality_state, "SHARDS_PER_RECOUNT", 2)
    turns_path = str(tmp_path / "turns" / "catalog.duckdb")
    turns = refresh_catalog_file(turns_path, root)
    # A transaction keeps every temp table it drops until it commits: the turns would all stay.
    # Read on a scratch connection, the refresh's transaction holds only the counts.
    assert {"catalog_product_accounting", "catalog_quality_bins", "catalog_quality_hours_lost"} <= {
        i["table"] for i in inserts
    }
    assert not any(i["on_refresh"] or i["refresh_temp_tables"] for i in inserts)
    assert turns.summary.accounting_shards_read == turns.summary.quality_shards_read == 7
    assert comparable(turns.summary) == comparable(whole.summary)
    assert state_contents(turns_path) == state_contents(whole_path)
    assert contents(turns_path, root) == contents(whole_path, root)


def test_a_memory_limit_duckdb_cannot_read_is_refused_by_name_before_the_state_is_touched(data_root, tmp_path):
    root = data_root
    write_corpus_shard(root, np.random.default_rng(0), 0, 10)
    database = str(tmp_path / "catalog.duckdb")
    refresh_catalog_file(database, root)
    state = state_contents(database)
    with pytest.raises(ValueError, match=f"lots of memory.*{MEMORY_LIMIT_ENV}"):
        refresh_catalog_file(database, root, memory=RefreshMemory("lots of memory"))
    assert state_contents(database) == state
