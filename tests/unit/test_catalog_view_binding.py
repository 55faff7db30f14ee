"""A refresh binds the catalog's views over one stand-in file per glob, never over every file of
the corpus, and the views read the real root exactly as when bound over it."""

import os

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.corpus.bench_catalog_refresh import write_corpus_shard
from speechdata.catalog import view_binding
from speechdata.catalog.database_file import refresh_catalog_file
from speechdata.catalog.root_paths import ROOT_VARIABLE
from speechdata.catalog.views import list_catalog_inputs
from speechdata.io.storage import TEMP_PREFIX
from tests.unit.test_catalog_scoped_refresh import contents

SHARDS, ROWS = 3, 40


def _corpus(root) -> None:
    rng = np.random.default_rng(0)
    for index in range(SHARDS):
        write_corpus_shard(root, rng, index, ROWS)


def _binding_spy(monkeypatch) -> list[dict]:
    """What each refresh's views were bound over: the root variable, the files under it and their rows."""
    seen: list[dict] = []
    create_views = view_binding.create_views

    def spying(connection, definitions):
        bound_over = connection.execute(f"SELECT getvariable('{ROOT_VARIABLE}')").fetchone()[0]
        files = sorted(
            os.path.relpath(os.path.join(folder, name), bound_over)
            for folder, _, names in os.walk(bound_over)
            for name in names
            if name.endswith(".parquet")
        )
        rows = [pq.ParquetFile(os.path.join(bound_over, path)).metadata.num_rows for path in files]
        seen.append({"root": bound_over, "files": files, "rows": rows})
        return create_views(connection, definitions)

    monkeypatch.setattr(view_binding, "create_views", spying)
    return seen


def _bound_over_the_real_root(database_path, root, monkeypatch):
    """The same refresh with every view bound over the real root (as before the stand-ins)."""
    with monkeypatch.context() as patched:
        patched.setattr(view_binding, "binds_over", lambda folder, definitions: False)
        refresh_catalog_file(database_path, root)


def test_a_first_import_binds_its_views_over_one_empty_file_per_glob_and_reads_the_same(
    data_root, tmp_path, monkeypatch
):
    root = data_root
    _corpus(root)
    seen = _binding_spy(monkeypatch)
    database_path = str(tmp_path / "stand-ins" / "catalog.duckdb")
    refresh_catalog_file(database_path, root)

    bound = seen[0]
    # Inside the refresh's own spill folder beside the catalog, never the data root.
    assert os.path.dirname(os.path.dirname(bound["root"])) == os.path.dirname(database_path)
    assert os.path.basename(os.path.dirname(bound["root"])).startswith(TEMP_PREFIX)
    # One empty file per glob that matches anything: the first shard's, of all the shards written.
    listed = list_catalog_inputs(root.uri("")).listed_by_glob()
    assert sum(len(files) for files in listed.values()) == 7 * SHARDS  # seven globs, each a file per shard
    first_files = sorted({min(files) for files in listed.values() if files})
    assert bound["files"] == first_files and all("shard-000000" in path for path in first_files)
    assert bound["rows"] == [0] * len(first_files)
    # The stand-ins went with the refresh.
    assert not [n for n in os.listdir(os.path.dirname(database_path)) if n.startswith(TEMP_PREFIX)]

    real_path = str(tmp_path / "real" / "catalog.duckdb")
    _bound_over_the_real_root(real_path, root, monkeypatch)
    assert seen[1]["root"] == root.root
    assert contents(database_path, root) == contents(real_path, root)
    # A plain DuckDB on the catalog file reads the root it sits in, with every shard's rows.
    with duckdb.connect(database_path, read_only=True) as plain:
        plain.execute(f"SET VARIABLE {ROOT_VARIABLE} = ?", [root.root])
        assert plain.execute("SELECT count(*) FROM samples").fetchone()[0] == SHARDS * ROWS


def test_a_column_one_file_lacks_is_still_in_the_views_bound_over_the_real_root(data_root, tmp_path, monkeypatch):
    root = data_root
    _corpus(root)
    # The first shard's rejects ledger, the stand-in of its glob, has no ``detail`` column: the
    # ``rejects`` view names it, so the views cannot bind over the stand-ins.
    ledgers = os.path.join(root.root, "shards", "shard-000000", "rejects")
    (name,) = [n for n in os.listdir(ledgers) if n.endswith(".parquet")]
    ledger = pq.read_table(os.path.join(ledgers, name))
    pq.write_table(ledger.drop_columns(["detail"]), os.path.join(ledgers, name))
    seen = _binding_spy(monkeypatch)
    database_path = str(tmp_path / "fallback" / "catalog.duckdb")
    refresh_catalog_file(database_path, root)

    assert seen[0]["root"] == root.root
    found = contents(database_path, root)
    real_path = str(tmp_path / "real" / "catalog.duckdb")
    _bound_over_the_real_root(real_path, root, monkeypatch)
    assert found == contents(real_path, root)
    with duckdb.connect(database_path, read_only=True) as plain:
        plain.execute(f"SET VARIABLE {ROOT_VARIABLE} = ?", [root.root])
        details = plain.execute("SELECT shard, count(detail) FROM rejects GROUP BY shard ORDER BY shard").fetchall()
    assert details[0] == ("shard-000000", 0) and all(count > 0 for _, count in details[1:])


def test_a_listed_path_that_would_leave_the_stand_in_root_is_refused(tmp_path):
    with pytest.raises(ValueError, match="leaves the stand-in root"):
        view_binding._inside(str(tmp_path), "../outside/part-0.parquet")
    assert view_binding._inside(str(tmp_path), "manifests/shard=a/part-0.parquet").startswith(str(tmp_path))


def test_views_bound_over_a_stand_in_show_columns_only_later_files_have(tmp_path):
    # The binding decides nothing a query keeps: DuckDB binds a view again whenever it is read.
    (tmp_path / "standin").mkdir()
    (tmp_path / "real").mkdir()
    pq.write_table(pa.table({"a": pa.array([], pa.int32())}), tmp_path / "standin" / "f1.parquet")
    pq.write_table(pa.table({"a": [1], "b": ["x"]}), tmp_path / "real" / "f1.parquet")
    pq.write_table(pa.table({"a": [2], "c": [2.5]}), tmp_path / "real" / "f2.parquet")
    with duckdb.connect(str(tmp_path / "views.duckdb")) as connection:
        connection.execute(f"SET VARIABLE {ROOT_VARIABLE} = ?", [str(tmp_path / "standin")])
        connection.execute(
            f"CREATE VIEW v AS SELECT * FROM read_parquet(getvariable('{ROOT_VARIABLE}') || '/f*.parquet', "
            "union_by_name = true)"
        )
        connection.execute(f"SET VARIABLE {ROOT_VARIABLE} = ?", [str(tmp_path / "real")])
        assert connection.execute("SELECT * FROM v ORDER BY a").fetchall() == [(1, "x", None), (2, None, 2.5)]
