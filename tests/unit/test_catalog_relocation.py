"""A catalog reads only the data root it is opened in: a copied ``catalog.duckdb`` never reads the
root it was built over, even while that root still exists."""

import shutil

import duckdb
import pytest

from speechdata.catalog.database_file import refresh_catalog_file
from speechdata.catalog.views import CATALOG_FILE
from speechdata.io.storage import DataRoot
from tests.unit.test_catalog import SHARD_A, SHARD_B, land_ids, write_manifest

CHANGED_IN_OLD_ROOT = [("w1", "fr", "fr", 99.0, -1.0, "only in the old root")]


@pytest.fixture
def built_then_copied(tmp_path):
    """A root with a refreshed catalog, copied whole; then the OLD root's manifest is changed."""
    old = DataRoot(str(tmp_path / "old"))
    write_manifest(old, "shard-a", SHARD_A)
    write_manifest(old, "shard-b", SHARD_B)
    land_ids(old, "shard-a", ["shard-a_u1", "shard-a_u2", "shard-a_u3"])
    refresh_catalog_file(old.path(CATALOG_FILE), old)
    copy = DataRoot(str(tmp_path / "copy"))
    shutil.copytree(old.root, copy.root)
    write_manifest(old, "shard-b", CHANGED_IN_OLD_ROOT)
    land_ids(old, "shard-a", ["shard-a_u1"])
    return old, copy


def samples_by_shard(connection):
    return dict(connection.execute("SELECT shard, count(*) FROM samples GROUP BY shard ORDER BY shard").fetchall())


def test_a_copied_catalog_in_plain_duckdb_reads_the_copy_not_the_old_root(built_then_copied):
    old, copy = built_then_copied
    with duckdb.connect(copy.path(CATALOG_FILE), read_only=True) as connection:
        assert samples_by_shard(connection) == {"shard-a": 3, "shard-b": 2}
        languages = {r[0] for r in connection.execute("SELECT language FROM samples").fetchall()}
        assert "fr" not in languages
        [(landed,)] = connection.execute(
            "SELECT landed FROM product_accounting WHERE shard = 'shard-a' AND product = 'bridge'"
        ).fetchall()
        assert landed == 3  # the copy's landed metadata, not the old root's one id


def test_the_old_catalog_in_plain_duckdb_still_reads_its_own_root(built_then_copied):
    old, _ = built_then_copied
    with duckdb.connect(old.path(CATALOG_FILE), read_only=True) as connection:
        assert samples_by_shard(connection) == {"shard-a": 3, "shard-b": 1}


def test_a_catalog_whose_folder_cannot_be_told_fails_naming_the_root_it_was_built_over(built_then_copied, tmp_path):
    old, copy = built_then_copied
    config = {"temp_directory": str(tmp_path / "elsewhere")}
    with duckdb.connect(copy.path(CATALOG_FILE), read_only=True, config=config) as connection:
        with pytest.raises(duckdb.Error, match=rf"built over {old.root}.*SET VARIABLE speechdata_root"):
            connection.execute("SELECT count(*) FROM samples").fetchall()
        connection.execute("SET VARIABLE speechdata_root = ?", [copy.root])
        assert samples_by_shard(connection) == {"shard-a": 3, "shard-b": 2}
