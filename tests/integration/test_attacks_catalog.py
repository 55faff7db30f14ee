"""The catalog under a careless or hostile user: read-only for real, self-healing, never blocked.

* every write form DuckDB accepts, against every catalogued folder, leaves the bytes on disk as they were;
* a corrupt ``catalog.duckdb`` (or refresh state) is rebuilt by the next refresh, which says so, and loses nothing;
* the catalog's files are regular files of the root (a symbolic link or a pipe is refused, naming
  it), and nothing planted in them survives a refresh;
* a reader holding the catalog open does not block a refresh, a query during a refresh reads the
  previous version, and the refresh sensor asks again for a refresh that failed;
* a catalog never built is an error naming the path and the command that builds it.
"""

from __future__ import annotations

import hashlib
import os
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import dagster as dg
import duckdb
import pytest
from dagster_duckdb import DuckDBResource

import speechdata.catalog.views as catalog_views
from assets.catalog import manifest_catalog
from resources.storage import DataRootResource
from sensors.catalog import catalog_refresh_sensor
from speechdata.catalog.cli import open_catalog, refresh
from speechdata.catalog.readonly import READ_ONLY_ROOT_URL, READABLE_FOLDERS
from speechdata.catalog.views import CATALOG_FILE
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from tests.unit.test_catalog import SHARD_A, SHARD_B, write_manifest, write_rejects

REPO_ROOT = Path(__file__).resolve().parents[2]

STATE_TABLES = (
    "catalog_manifest_files",
    "catalog_manifest_groups",
    "catalog_rejects_files",
    "catalog_rejected_ids",
    "catalog_accounting_shards",
    "catalog_product_accounting",
    "catalog_product_rejects",
)


@pytest.fixture
def root(tmp_path) -> DataRoot:
    data_root = DataRoot(str(tmp_path / "data"))
    write_manifest(data_root, "shard-a", SHARD_A)
    write_manifest(data_root, "shard-b", SHARD_B)
    write_rejects(data_root, "shard-a", "ingest", ["u9"], reason="unreadable_audio")
    data_root.write_bytes(layout.landing_success_marker("shard-a"), b"")
    data_root.write_bytes(f"{layout.TRANSLATION}/shard-a/kept.txt", b"translation")
    data_root.write_bytes(f"{layout.ASR}/shard-a/kept.txt", b"asr")
    return data_root


def run_cli(*args, data_root: DataRoot, timeout: float = 120):
    env = {**os.environ, "DATA_ROOT": data_root.root, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "speechdata.catalog.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def snapshot(folder: str) -> dict[str, str]:
    """Every file and folder under ``folder``: path -> sha256 of its bytes ("dir" for a folder)."""
    found = {}
    for parent, folders, files in os.walk(folder):
        for name in folders:
            found[os.path.join(parent, name)] = "dir"
        for name in files:
            path = os.path.join(parent, name)
            with open(path, "rb") as handle:
                found[path] = hashlib.sha256(handle.read()).hexdigest()
    return found


# --- read-only for real

WRITE_FORMS = (
    "COPY (SELECT 1 AS x) TO '{file}'",
    "COPY (SELECT 1 AS x) TO '{file}' (FORMAT parquet)",
    "EXPLAIN COPY (SELECT 1 AS x) TO '{file}'",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{file}'",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{file}' (FORMAT parquet)",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS x, 'p' AS part) TO '{folder}' (FORMAT parquet, PARTITION_BY (part), OVERWRITE)",
    "COPY (SELECT 1 AS x, 'p' AS part) TO '{folder}' (FORMAT csv, PARTITION_BY (part), OVERWRITE_OR_IGNORE)",
    "SELECT 1; COPY (SELECT 1 AS x) TO '{file}'",
    "WITH x AS (SELECT 1 AS y) SELECT * FROM x; COPY (SELECT 1 AS x) TO '{file}'",
    "PREPARE forge AS COPY (SELECT 1 AS x) TO '{file}'; EXECUTE forge",
    "EXPORT DATABASE '{folder}/exported'",
    "ATTACH '{file}.duckdb' AS forged; CREATE TABLE forged.t AS SELECT 1",
    "ATTACH '{file}.duckdb' AS forged; COPY FROM DATABASE catalog TO forged",
    "SET temp_directory = '{folder}'; SELECT count(*) FROM range(10)",
    "PRAGMA enable_profiling = 'json'; PRAGMA profiling_output = '{file}'; SELECT 1",
    "SET profiling_output = '{file}'; SET enable_profiling = 'json'; SELECT 1",
    "CALL enable_logging(storage = 'file', storage_path = '{folder}')",
    "SET secret_directory = '{folder}'; CREATE PERSISTENT SECRET forged (TYPE s3, KEY_ID 'k', SECRET 's')",
    "CREATE PERSISTENT SECRET forged (TYPE s3, KEY_ID 'k', SECRET 's')",
    "SET extension_directory = '{folder}'; INSTALL httpfs",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true; COPY (SELECT 1 AS x) TO '{file}'",
    "RESET lock_configuration; SET enable_external_access = true; COPY (SELECT 1 AS x) TO '{file}'",
    "SET allowed_directories = ['{folder}']; COPY (SELECT 1 AS x) TO '{file}'",
    "CHECKPOINT",
    "SELECT * FROM checkpoint()",
    "SELECT * FROM force_checkpoint()",
    "CREATE TABLE forged AS SELECT 1",
    "INSERT INTO catalog_manifest_files VALUES ('forged', 1, 'forged', 1)",
    "DROP VIEW samples",
    "SELECT * FROM read_text('{file}')",
)
"""Statement forms that write, or would unlock a write; ``{file}`` / ``{folder}`` name a target."""


def targets(root: DataRoot) -> list[tuple[str, str]]:
    """(file, folder) in every catalogued folder, by its real path and by the read-only filesystem's
    URL, new names and names that exist (a published manifest, a rejects ledger, a ``_SUCCESS``)."""
    found = []
    for folder in READABLE_FOLDERS:
        for base in (root.root, READ_ONLY_ROOT_URL):
            found.append((f"{base}/{folder}/forged.csv", f"{base}/{folder}"))
    for existing in ("manifests/shard=shard-a/part-0.parquet", layout.rejects("shard-a", "ingest")):
        for base in (root.root, READ_ONLY_ROOT_URL):
            found.append((f"{base}/{existing}", f"{base}/{existing.rsplit('/', 1)[0]}"))
    found.append((root.path(layout.landing_success_marker("shard-a")), root.path("landing/shard-a")))
    return found


def test_no_statement_changes_a_byte_under_the_data_root(root):
    refresh(root)
    before = snapshot(root.root)
    ran = set()
    for file, folder in targets(root):
        for form in WRITE_FORMS:
            sql = form.format(file=file, folder=folder)
            # Straight to the connection, past the CLI's statement check: the lock-down alone must hold.
            with open_catalog(root) as connection:
                try:
                    connection.execute(sql)
                    ran.add(form)
                except Exception:
                    pass
                [(locked, external)] = connection.execute(
                    "SELECT current_setting('lock_configuration'), current_setting('enable_external_access')"
                ).fetchall()
                assert (locked, external) == (True, False), sql
    assert snapshot(root.root) == before
    # What ran writes nothing by itself: a plan, a read of an existing file, a checkpoint of a read-only database.
    assert ran <= {
        "EXPLAIN COPY (SELECT 1 AS x) TO '{file}'",
        "SELECT * FROM read_text('{file}')",
        "CHECKPOINT",
        "SELECT * FROM checkpoint()",
    }, ran
    # The views still read through the locked connection.
    with open_catalog(root) as connection:
        assert connection.execute("SELECT count(*) FROM samples").fetchone()[0] == 5
        assert connection.execute("SELECT count(*) FROM rejects").fetchone()[0] == 1


def test_the_cli_cannot_forge_a_manifest_a_ledger_or_a_success_marker(root):
    assert run_cli("--refresh", data_root=root).returncode == 0
    before = snapshot(root.root)
    for file, _ in targets(root):
        if not file.startswith(root.root):
            continue
        forged = run_cli(f"EXPLAIN ANALYZE COPY (SELECT 'forged' AS x) TO '{file}'", data_root=root)
        assert forged.returncode == 2, forged.stdout
        assert forged.stderr.startswith("catalog: error: "), forged.stderr
    assert snapshot(root.root) == before
    assert run_cli("SELECT count(*) FROM samples", data_root=root).stdout.splitlines()[2].strip() == "5"


def test_the_read_only_filesystem_serves_nothing_outside_the_catalogued_folders(root, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("the content of a file outside the root")
    os.symlink(outside, root.path("manifests/link.txt"))
    refresh(root)
    with open_catalog(root) as connection:
        for sql in (
            f"SELECT * FROM read_text('{READ_ONLY_ROOT_URL}/manifests/link.txt')",
            f"SELECT * FROM read_text('{READ_ONLY_ROOT_URL}/manifests/../../secret.txt')",
            f"SELECT * FROM read_text('{READ_ONLY_ROOT_URL}/{CATALOG_FILE}')",
            f"SELECT * FROM read_text('{outside}')",
        ):
            try:
                served = repr(connection.execute(sql).fetchall())
            except duckdb.Error as refused:
                served = str(refused)
            assert "outside the root" not in served and "DUCK" not in served, sql


# --- a corrupt catalog heals itself


def state_path(root: DataRoot) -> str:
    """The refresh's state, beside the catalog (no reader opens it)."""
    return root.path(f".{CATALOG_FILE}.state")


def state_rows(database_path: str) -> dict[str, list]:
    with duckdb.connect(database_path, read_only=True) as connection:
        return {t: sorted(connection.execute(f"SELECT * FROM {t}").fetchall(), key=repr) for t in STATE_TABLES}


def corrupt(path: str, how: str) -> None:
    data = Path(path).read_bytes()
    if how == "garbage":
        Path(path).write_bytes(os.urandom(len(data)))
    elif how == "truncated":
        Path(path).write_bytes(data[: len(data) // 3])
    elif how == "empty":
        Path(path).write_bytes(b"")
    elif how == "incompatible_version":
        # The storage version number follows the ``DUCK`` magic: a DuckDB that does not know it refuses the file.
        assert data[8:12] == b"DUCK"
        Path(path).write_bytes(data[:12] + struct.pack("<Q", 9_999) + data[20:])


def materialize_catalog(root: DataRoot, instance, **kwargs):
    resources = {
        "data_root": DataRootResource(url=root.url),
        "catalog": DuckDBResource(database=root.path(CATALOG_FILE)),
    }
    return dg.materialize([manifest_catalog], instance=instance, resources=resources, **kwargs)


@pytest.mark.parametrize("which", ["catalog", "state"])
@pytest.mark.parametrize("how", ["garbage", "truncated", "empty", "incompatible_version"])
def test_a_corrupt_catalog_is_rebuilt_by_the_asset_and_loses_nothing(root, tmp_path, how, which):
    fresh = DataRoot(str(tmp_path / "fresh"))
    root.fs.copy(root.root, fresh.root, recursive=True)
    corrupted = root.path(CATALOG_FILE) if which == "catalog" else state_path(root)
    with dg.instance_for_test() as instance:
        assert materialize_catalog(root, instance).success
        corrupt(corrupted, how)
        result = materialize_catalog(root, instance, raise_on_error=False)
        assert result.success
        [event] = result.asset_materializations_for_node("manifest_catalog")
        assert f"{os.path.basename(corrupted)} is unreadable" in event.metadata["rebuilt_because"].value
        assert event.metadata["dagster/row_count"].value == 5
        # A corrupt state is read again from the files, all of them; the views file holds no state.
        assert event.metadata["manifests_read"].value == (2 if which == "state" else 0)
        warnings = [
            e.message
            for e in instance.all_logs(result.run_id)
            if e.level >= 30 and "catalog rebuilt from scratch" in (e.message or "")
        ]
        assert warnings, "the run's log says the catalog was rebuilt"
        # Rebuilding loses nothing: the same state as a catalog built fresh from the same files.
        assert materialize_catalog(fresh, instance).success
    rebuilt, built = state_rows(state_path(root)), state_rows(state_path(fresh))
    assert rebuilt["catalog_manifest_groups"] and rebuilt["catalog_rejected_ids"]
    for table in STATE_TABLES:
        # Paths are relative to the root and fingerprints name inodes: the copied root differs only there.
        if table.endswith("_files") or table == "catalog_accounting_shards":
            assert [r[0] for r in rebuilt[table]] == [r[0] for r in built[table]], table
        else:
            assert rebuilt[table] == built[table], table
    again = run_cli("--named", "hours_per_language", data_root=root)
    assert again.returncode == 0 and again.stdout.splitlines()[-1] == "(2 rows)"


def test_the_cli_refresh_rebuilds_a_corrupt_catalog_and_says_so(root):
    root.write_bytes(CATALOG_FILE, b"not a database at all")
    refreshed = run_cli("--refresh", data_root=root)
    assert refreshed.returncode == 0, refreshed.stderr
    assert "rebuilt from scratch" in refreshed.stderr and "catalog.duckdb is unreadable" in refreshed.stderr
    assert "2 shards, 5 samples" in refreshed.stdout


# --- readers and the refresher never block each other

READER = """
import sys, duckdb
connection = duckdb.connect(sys.argv[1], read_only=True)
print(connection.execute("SELECT manifest_files FROM catalog_info").fetchone()[0], flush=True)
sys.stdin.readline()  # hold the catalog open until told
print(connection.execute("SELECT manifest_files FROM catalog_info").fetchone()[0], flush=True)
"""


def test_a_reader_holding_the_catalog_open_does_not_block_the_refresh(root):
    refresh(root)
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, root.path(CATALOG_FILE)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout.readline().strip() == "2"
        write_manifest(root, "shard-c", SHARD_B)
        started = time.monotonic()
        with dg.instance_for_test() as instance:
            result = materialize_catalog(root, instance, raise_on_error=False)
        elapsed_s = time.monotonic() - started
        assert result.success and elapsed_s < 30, elapsed_s
        # The reader still reads the version it opened, whole.
        out, err = reader.communicate("\n", timeout=60)
        assert reader.returncode == 0, err
        assert out.strip() == "2"
    finally:
        if reader.poll() is None:
            reader.kill()
    counted = run_cli("SELECT manifest_files AS n FROM catalog_info", data_root=root)
    assert counted.stdout.splitlines()[2].strip() == "3"


def test_a_query_during_a_refresh_reads_the_previous_version(root, monkeypatch):
    refresh(root)
    write_manifest(root, "shard-c", SHARD_B)
    inside_refresh, query_done = threading.Event(), threading.Event()
    summary_totals = catalog_views.summary_totals

    def held_summary_totals(connection):
        inside_refresh.set()
        assert query_done.wait(120)
        return summary_totals(connection)

    monkeypatch.setattr(catalog_views, "summary_totals", held_summary_totals)
    failures = []

    def refresh_in_background():
        try:
            refresh(root)
        except BaseException as error:  # reported by the test below
            failures.append(error)

    refresher = threading.Thread(target=refresh_in_background)
    refresher.start()
    try:
        assert inside_refresh.wait(120)
        during = run_cli("SELECT count(*) AS n FROM samples", data_root=root)
        named = run_cli("--named", "hours_per_shard", data_root=root)
    finally:
        query_done.set()
        refresher.join(120)
    assert during.returncode == 0, during.stderr
    assert during.stdout.splitlines()[2].strip() == "7"  # the views read the live files: shard-c included
    assert named.returncode == 0, named.stderr
    assert not failures, failures
    after = run_cli("SELECT manifest_files FROM catalog_info", data_root=root)
    assert after.stdout.splitlines()[2].strip() == "3"


def test_the_refresh_sensor_asks_again_for_a_refresh_that_failed(root, tmp_path):
    sensor_resources = {"data_root": DataRootResource(url=root.url)}
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("shard_manifest"))
        first = catalog_refresh_sensor(dg.build_sensor_context(instance=instance, resources=sensor_resources))
        [request] = first.run_requests
        # While the requested refresh has not run, nothing more is asked for.
        waiting = catalog_refresh_sensor(
            dg.build_sensor_context(instance=instance, resources=sensor_resources, cursor=first.cursor)
        )
        assert isinstance(waiting, dg.SkipReason)

        # The refresh fails: its catalog file cannot be written (a file stands where its folder should be).
        (tmp_path / "blocked").write_text("a file, not a folder")
        broken = {
            "data_root": DataRootResource(url=root.url),
            "catalog": DuckDBResource(database=str(tmp_path / "blocked" / CATALOG_FILE)),
        }
        failed = dg.materialize(
            [manifest_catalog],
            instance=instance,
            resources=broken,
            tags={"dagster/run_key": request.run_key},
            raise_on_error=False,
        )
        assert not failed.success
        context = dg.build_sensor_context(instance=instance, resources=sensor_resources, cursor=first.cursor)
        retry = catalog_refresh_sensor(context)
        [again] = retry.run_requests
        assert again.run_key != request.run_key

        succeeded = materialize_catalog(root, instance, tags={"dagster/run_key": again.run_key})
        assert succeeded.success
        context = dg.build_sensor_context(instance=instance, resources=sensor_resources, cursor=retry.cursor)
        assert isinstance(catalog_refresh_sensor(context), dg.SkipReason)
        # Covered now: the next tick asks for nothing until a manifest changes.
        assert isinstance(
            catalog_refresh_sensor(
                dg.build_sensor_context(instance=instance, resources=sensor_resources, cursor=context.cursor)
            ),
            dg.SkipReason,
        )
        instance.report_runless_asset_event(dg.AssetMaterialization("shard_manifest"))
        newer = catalog_refresh_sensor(
            dg.build_sensor_context(instance=instance, resources=sensor_resources, cursor=context.cursor)
        )
        assert len(newer.run_requests) == 1


@pytest.mark.parametrize("asset", ["streaming_segments", "streaming_pairs", "hf_dataset", "hf_split_assignments"])
def test_the_refresh_sensor_asks_for_a_refresh_after_a_translation_or_publishing_run(root, asset):
    sensor_resources = {"data_root": DataRootResource(url=root.url)}
    with dg.instance_for_test() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("shard_manifest"))
        first = catalog_refresh_sensor(dg.build_sensor_context(instance=instance, resources=sensor_resources))
        [request] = first.run_requests
        assert materialize_catalog(root, instance, tags={"dagster/run_key": request.run_key}).success
        covered = dg.build_sensor_context(instance=instance, resources=sensor_resources, cursor=first.cursor)
        assert isinstance(catalog_refresh_sensor(covered), dg.SkipReason)
        # The product's own run changes what product_accounting counts: the catalog must follow.
        instance.report_runless_asset_event(dg.AssetMaterialization(asset))
        after = catalog_refresh_sensor(
            dg.build_sensor_context(instance=instance, resources=sensor_resources, cursor=covered.cursor)
        )
        assert not isinstance(after, dg.SkipReason), after
        assert len(after.run_requests) == 1 and after.run_requests[0].run_key != request.run_key


# --- a catalog never built


def test_a_catalog_never_built_names_its_path_and_the_command_that_builds_it(root):
    for args in (["SELECT 1"], ["--named", "hours_per_language"], ["--language", "en"]):
        missing = run_cli(*args, data_root=root)
        assert missing.returncode == 2 and missing.stdout == ""
        message = missing.stderr.strip()
        assert len(message.splitlines()) == 1, message
        assert root.path(CATALOG_FILE) in message and "speechdata catalog --refresh" in message, message
    assert not root.exists(CATALOG_FILE)
    # A plain ``duckdb.connect(path)`` creates an empty database: still a catalog never built.
    duckdb.connect(root.path(CATALOG_FILE)).close()
    for args in (["SELECT count(*) FROM samples"], ["--named", "hours_per_language"], ["--language", "en"]):
        empty = run_cli(*args, data_root=root)
        assert empty.returncode == 2 and empty.stdout == ""
        message = empty.stderr.strip()
        assert len(message.splitlines()) == 1, message
        assert "never built" in message and root.path(CATALOG_FILE) in message, message
        assert "speechdata catalog --refresh" in message, message
    # The refresh builds it in place of the empty file.
    assert run_cli("--refresh", data_root=root).returncode == 0
    assert run_cli("--named", "hours_per_language", data_root=root).returncode == 0


KILLED_REFRESH = """
import os, sys
import speechdata.catalog.database_file as database_file
from speechdata.catalog.cli import refresh
from speechdata.io.storage import DataRoot

def killed(*args):
    os._exit(9)  # killed half-way through the refresh: the state synced, not committed; the new views file begun

database_file.write_catalog_info = killed
refresh(DataRoot(sys.argv[1]))
"""


def test_a_refresh_killed_half_way_leaves_the_previous_catalog_and_the_next_one_cleans_up(root):
    refresh(root)
    before = Path(root.path(CATALOG_FILE)).read_bytes()
    write_manifest(root, "shard-c", SHARD_B)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_REFRESH, root.root],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )
    assert killed.returncode == 9
    assert Path(root.path(CATALOG_FILE)).read_bytes() == before
    left = [name for name in os.listdir(root.root) if name.startswith("._tmp-")]
    assert left, "the killed refresh left its temp"
    assert refresh(root).summary.manifest_files == 3
    assert not [name for name in os.listdir(root.root) if name.startswith("._tmp-")]


# --- the catalog's files are its own: no link out of the root, nothing planted survives a refresh


def outside_database(tmp_path) -> Path:
    """A database outside the data root with a table nobody should read through the catalog."""
    outside = tmp_path / "elsewhere" / "payroll.duckdb"
    outside.parent.mkdir()
    with duckdb.connect(str(outside)) as connection:
        connection.execute("CREATE TABLE payroll AS SELECT 'alice' AS name, 123456 AS salary")
    return outside


@pytest.mark.parametrize(
    "name", [CATALOG_FILE, f"{CATALOG_FILE}.wal", f".{CATALOG_FILE}.state", f".{CATALOG_FILE}.state.wal"]
)
def test_a_catalog_file_that_is_a_symbolic_link_is_refused_by_the_refresh_naming_it(root, tmp_path, name):
    outside = outside_database(tmp_path)
    before = outside.read_bytes()
    link = root.path(name)
    os.symlink(outside, link)
    refreshed = run_cli("--refresh", data_root=root, timeout=60)
    assert refreshed.returncode == 2, refreshed.stdout
    message = refreshed.stderr.strip()
    assert len(message.splitlines()) == 1 and link in message and "symbolic link" in message, message
    assert outside.read_bytes() == before  # neither written nor copied in
    assert os.path.islink(link)  # refused, not replaced behind the user's back
    payroll = run_cli("SELECT * FROM payroll", data_root=root)
    assert payroll.returncode == 2 and "alice" not in payroll.stdout


def test_a_catalog_that_is_a_symbolic_link_is_refused_by_readers(root, tmp_path):
    refresh(root)
    outside = outside_database(tmp_path)
    catalog = root.path(CATALOG_FILE)  # named before the link: the root refuses a path that links out
    os.replace(catalog, tmp_path / "moved.duckdb")
    os.symlink(outside, catalog)
    for args in (["SELECT * FROM payroll"], ["--named", "hours_per_language"]):
        answered = run_cli(*args, data_root=root)
        assert answered.returncode == 2 and "alice" not in answered.stdout
        assert catalog in answered.stderr and "symbolic link" in answered.stderr, answered.stderr


@pytest.mark.parametrize("kind", ["folder", "named pipe"])
def test_a_catalog_file_that_is_not_a_regular_file_is_refused_naming_it(root, kind):
    path = root.path(CATALOG_FILE)
    if kind == "folder":
        os.mkdir(path)
    else:
        os.mkfifo(path)  # a refresh that copied it would wait forever for a writer
    refreshed = run_cli("--refresh", data_root=root, timeout=60)
    assert refreshed.returncode == 2
    assert path in refreshed.stderr and f"not a regular file ({'a ' + kind})" in refreshed.stderr, refreshed.stderr
    queried = run_cli("--named", "hours_per_language", data_root=root, timeout=60)
    assert queried.returncode == 2 and path in queried.stderr, queried.stderr


PLANTED = (
    "CREATE TABLE payroll AS SELECT 'alice' AS name, 123456 AS salary",
    "CREATE VIEW planted_view AS SELECT * FROM payroll",
    "CREATE OR REPLACE VIEW hours_by_language AS SELECT 'forged' AS language, 1 AS samples",
    "CREATE MACRO samples_count() AS 999",
    "CREATE MACRO planted_rows() AS TABLE SELECT 'forged' AS x",
    "CREATE SEQUENCE planted_sequence",
    "CREATE TYPE planted_type AS ENUM ('a', 'b')",
    "CREATE SCHEMA planted_schema",
    "CREATE TABLE planted_schema.hidden AS SELECT 'forged' AS x",
    "CREATE INDEX planted_index ON catalog_info (data_root)",
)


def catalog_objects(path: str) -> set[str]:
    with duckdb.connect(path, read_only=True) as connection:
        return {
            f"{kind} {schema}.{name}"
            for kind, sql in (
                ("schema", "SELECT schema_name, schema_name FROM duckdb_schemas() WHERE NOT internal"),
                ("table", "SELECT schema_name, table_name FROM duckdb_tables()"),
                ("view", "SELECT schema_name, view_name FROM duckdb_views() WHERE NOT internal"),
                ("function", "SELECT schema_name, function_name FROM duckdb_functions() WHERE NOT internal"),
                ("sequence", "SELECT schema_name, sequence_name FROM duckdb_sequences()"),
                ("type", "SELECT schema_name, type_name FROM duckdb_types() WHERE NOT internal"),
                ("index", "SELECT schema_name, index_name FROM duckdb_indexes()"),
            )
            for schema, name in connection.execute(sql).fetchall()
        }


def test_nothing_planted_in_the_catalog_survives_an_incremental_refresh(root):
    refresh(root)
    own = catalog_objects(root.path(CATALOG_FILE))
    hours = run_cli("--named", "hours_per_language", data_root=root).stdout
    with duckdb.connect(root.path(CATALOG_FILE)) as connection:
        for statement in PLANTED:
            connection.execute(statement)
    planted = run_cli("SELECT * FROM payroll", data_root=root)
    assert "alice" in planted.stdout  # what a reader would get without a refresh
    refreshed = refresh(root)  # incremental: no --full
    assert refreshed.summary.manifests_read == 0
    assert catalog_objects(root.path(CATALOG_FILE)) == own
    assert any("payroll" in d for d in refreshed.dropped), refreshed.dropped
    gone = run_cli("SELECT * FROM payroll", data_root=root)
    assert gone.returncode == 2 and "alice" not in gone.stdout
    assert run_cli("--named", "hours_per_language", data_root=root).stdout == hours
    with open_catalog(root) as connection:
        assert connection.execute("SELECT count(*) FROM hours_by_language").fetchone()[0] == 2


def test_a_view_replaced_in_the_catalog_is_created_again_by_the_next_refresh(root):
    refresh(root)
    with duckdb.connect(root.path(CATALOG_FILE)) as connection:
        connection.execute("CREATE OR REPLACE VIEW samples AS SELECT * FROM samples WHERE false")
    refresh(root)
    with open_catalog(root) as connection:
        assert connection.execute("SELECT count(*) FROM samples").fetchone()[0] == 5


def test_nothing_planted_in_the_refresh_state_survives_a_refresh(root):
    refresh(root)
    state = root.path(f".{CATALOG_FILE}.state")
    own = catalog_objects(state)
    with duckdb.connect(state) as connection:
        for statement in PLANTED[:2] + PLANTED[3:9]:
            connection.execute(statement)
        # A forged state row is only data: it is checked against the listing like any other.
        connection.execute(
            "INSERT INTO catalog_manifest_files VALUES ('manifests/shard=forged/part-0.parquet', 1, 'x', 99)"
        )
    refreshed = refresh(root)
    assert catalog_objects(state) == own
    assert refreshed.summary.samples == 5 and refreshed.summary.manifest_files == 2


KILLED_BEFORE_THE_SWAP = """
import os, sys
from speechdata.catalog.cli import refresh
from speechdata.io.storage import DataRoot

os.replace = lambda *args: os._exit(9)  # killed after the state committed, before the new catalog is swapped in
refresh(DataRoot(sys.argv[1]))
"""


def test_a_refresh_killed_after_its_state_committed_is_published_by_the_next_one(root):
    refresh(root)
    before = Path(root.path(CATALOG_FILE)).read_bytes()
    write_manifest(root, "shard-c", SHARD_B)
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_BEFORE_THE_SWAP, root.root],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=120,
    )
    assert killed.returncode == 9
    # Readers still get the previous catalog, whole.
    assert Path(root.path(CATALOG_FILE)).read_bytes() == before
    assert run_cli("SELECT manifest_files AS n FROM catalog_info", data_root=root).stdout.splitlines()[2].strip() == "2"
    # The state is a whole refresh ahead: the next refresh reads nothing again and publishes it.
    refreshed = refresh(root)
    assert refreshed.summary.manifests_read == 0 and refreshed.summary.manifest_files == 3
    assert run_cli("SELECT manifest_files AS n FROM catalog_info", data_root=root).stdout.splitlines()[2].strip() == "3"
    assert not [name for name in os.listdir(root.root) if name.startswith("._tmp-")]
