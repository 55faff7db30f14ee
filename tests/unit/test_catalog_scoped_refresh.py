"""A refresh told which shards changed stats only their files and gives what a full refresh gives."""

import duckdb
import pyarrow as pa
import pytest

from speechdata import products
from speechdata.catalog import accounting, accounting_state, incremental, quality, quality_state, views
from speechdata.catalog.database_file import refresh_catalog_file, state_path_of
from speechdata.catalog.incremental import shard_segment
from speechdata.catalog.reading import open_catalog_read_only
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from tests.unit.test_catalog import SHARD_B, land_ids, write_manifest, write_rejects
from tests.unit.test_catalog_incremental import (
    SHARD_D,
    catalog_contents,
    comparable,
    write_four_shards,
)

COUNTER = "catalog_listing"
"""Scoped and full refreshes differ in it and CHECKED alone: how many scoped refreshes ran since the
last full listing, and where the consistency check stands."""
CHECKED = "catalog_checked_shards"


@pytest.fixture
def root(data_root):
    return write_four_shards(data_root)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def any_root(request, root):
    if request.param == "local":
        return root
    bucket_root = DataRoot(f"{request.getfixturevalue('s3_bucket')}/speech")
    # The same four shards as the local root, written into the bucket.
    local = root
    for path in local.fs.find(local.root):
        relative = path[len(local.root.rstrip("/")) + 1 :]
        bucket_root.write_bytes(relative, local.fs.cat_file(path))
    return bucket_root


class GlobLog:
    """Every glob the refresh listed or probed, through the catalog modules' own names for the calls."""

    def __init__(self, monkeypatch):
        self.globs: list[str] = []
        for module in (incremental, accounting_state, quality_state, views):
            if hasattr(module, "list_files"):
                monkeypatch.setattr(module, "list_files", self._wrap(module.list_files))
        for module in (incremental, accounting, quality, views):
            if hasattr(module, "has_files"):
                monkeypatch.setattr(module, "has_files", self._wrap(module.has_files))

    def _wrap(self, call):
        def logged(root, relative_glob):
            known = incremental._KNOWN_MATCHES.get()
            if call.__name__ != "has_files" or known is None or relative_glob not in known:  # else: no listing
                self.globs.append(relative_glob)
            return call(root, relative_glob)

        return logged

    def shards_named(self) -> set[str]:
        """The shard each logged glob names literally; any other glob fails the test."""
        return {_shard_named(relative_glob) for relative_glob in self.globs}


def _per_shard_globs() -> list[str]:
    sources = [accounting_state.LANDED, accounting_state.REJECTS, *(line.name for line in products.product_lines())]
    inputs = views.CatalogInputs(
        "", {}, {}, {name: {} for name in sources}, {name: {} for name in quality_state.QUALITY_GLOBS}, [], ""
    )
    return list(inputs.listed_by_glob())


def _shard_named(logged: str) -> str:
    """The shard ``logged`` names in the place of a per-shard glob's wildcard."""
    parts = logged.split("/")
    for relative_glob in _per_shard_globs():
        index, prefix = shard_segment(relative_glob)
        pattern = relative_glob.split("/")
        if len(pattern) == len(parts) and all(a == b for i, (a, b) in enumerate(zip(pattern, parts)) if i != index):
            assert parts[index].startswith(prefix) and "*" not in parts[index], f"{logged} lists every shard"
            return parts[index][len(prefix) :]
    raise AssertionError(f"{logged} is not a per-shard glob narrowed to one shard")


def contents(database_path: str, root: DataRoot) -> dict[str, list]:
    """The catalog's tables and views, read as a reader reads them (the views over ``root``)."""
    with open_catalog_read_only(database_path, root) as connection:
        return catalog_contents(connection)


def state_contents(database_path: str) -> dict[str, list]:
    with duckdb.connect(state_path_of(database_path), read_only=True) as connection:
        found = catalog_contents(connection)
    found.pop(COUNTER)
    found.pop(CHECKED)
    return found


def refresh_from_scratch(root, tmp_path, name):
    database_path = str(tmp_path / name / "catalog.duckdb")
    return refresh_catalog_file(database_path, root, full=True), database_path


def assert_same_as_a_full_refresh(root, tmp_path, name, refreshed, database_path):
    full, full_path = refresh_from_scratch(root, tmp_path, name)
    assert comparable(refreshed.summary) == comparable(full.summary)
    assert state_contents(database_path) == state_contents(full_path)
    views_now, views_full = contents(database_path, root), contents(full_path, root)
    assert views_now.keys() == views_full.keys()
    for view in views_full:
        assert views_now[view] == views_full[view], view


def test_a_scoped_refresh_equals_a_full_one_after_adds_relands_and_deletes(any_root, tmp_path, monkeypatch):
    root = any_root
    database_path = str(tmp_path / "catalog" / "catalog.duckdb")
    first = refresh_catalog_file(database_path, root, shards=["shard-a"])
    assert first.summary.manifest_files == 4, "the first refresh of a state lists the whole root"

    steps = []

    def add_shard_e():
        write_manifest(root, "shard-e", SHARD_D, extra={"room": (pa.string(), ["hall"])})
        land_ids(root, "shard-e", ["shard-e_x1", "shard-e_x2"])
        write_rejects(root, "shard-e", "ingest", ["shard-e_x2"], reason="unreadable_audio")
        return {"shard-e"}

    def reland_shard_b():
        write_manifest(root, "shard-b", [*SHARD_B, ("v3", "cy", "gb", 5.0, -4.0, "bara")])
        write_rejects(root, "shard-b", "ingest", ["shard-b_v9"], reason="unreadable_audio")
        return {"shard-b"}

    def delete_shard_c_and_a_ledger_of_shard_a():
        root.fs.rm(root.path("manifests/shard=shard-c"), recursive=True)
        root.fs.rm(root.path(layout.landing_metadata("shard-c")))
        root.fs.rm(root.path(layout.rejects("shard-a", "ingest")))
        return {"shard-c", "shard-a"}

    steps = [add_shard_e, reland_shard_b, delete_shard_c_and_a_ledger_of_shard_a]
    for number, step in enumerate(steps):
        changed = step()
        log = GlobLog(monkeypatch)
        refreshed = refresh_catalog_file(database_path, root, shards=changed, checked_per_refresh=0)
        monkeypatch.undo()
        assert log.globs, "the refresh listed nothing at all"
        assert log.shards_named() == changed, log.globs
        assert_same_as_a_full_refresh(root, tmp_path, f"full-{number}", refreshed, database_path)

    summary = refreshed.summary
    assert (summary.manifests_read, summary.manifests_dropped, summary.manifests_reused) == (0, 1, 4)
    assert summary.shards == 3 and "cy" in summary.languages and "fr" not in summary.languages


def test_a_shard_deleted_by_hand_is_found_by_the_periodic_full_listing(root, tmp_path):
    database_path = str(tmp_path / "catalog.duckdb")
    assert (
        refresh_catalog_file(
            database_path, root, shards=[], full_listing_every=3, checked_per_refresh=0
        ).summary.manifest_files
        == 4
    )
    root.fs.rm(root.path("manifests/shard=shard-c"), recursive=True)  # behind the platform's back
    assert (
        refresh_catalog_file(
            database_path, root, shards=[], full_listing_every=3, checked_per_refresh=0
        ).summary.manifest_files
        == 4
    )
    assert (
        refresh_catalog_file(
            database_path, root, shards=[], full_listing_every=3, checked_per_refresh=0
        ).summary.manifest_files
        == 4
    )
    found = refresh_catalog_file(database_path, root, shards=[], full_listing_every=3, checked_per_refresh=0)
    assert (found.summary.manifest_files, found.summary.manifests_dropped) == (3, 1)
    assert "fr" not in found.summary.languages


def test_the_consistency_check_finds_a_shard_deleted_by_hand_stating_a_few_known_shards_per_refresh(
    root, tmp_path, monkeypatch
):
    database_path = str(tmp_path / "catalog.duckdb")
    refresh_catalog_file(database_path, root, shards=[])  # the first refresh lists the root
    root.fs.rm(root.path("manifests/shard=shard-c"), recursive=True)  # behind the platform's back
    checked, found = [], None
    for _ in range(4):  # four known shards, one checked per refresh: each once in four refreshes
        log = GlobLog(monkeypatch)
        refreshed = refresh_catalog_file(database_path, root, shards=[], checked_per_refresh=1)
        monkeypatch.undo()
        [shard] = log.shards_named()  # never the whole root
        checked.append(shard)
        if refreshed.summary.manifests_dropped:
            found = shard
    assert sorted(checked) == ["shard-a", "shard-b", "shard-c", "shard-d"] and found == "shard-c"
    assert "fr" not in refreshed.summary.languages and refreshed.summary.manifest_files == 3


def test_a_caller_that_cannot_say_what_changed_gets_a_full_listing(root, tmp_path):
    database_path = str(tmp_path / "catalog.duckdb")
    refresh_catalog_file(database_path, root, shards=[])
    root.fs.rm(root.path("manifests/shard=shard-c"), recursive=True)
    assert refresh_catalog_file(database_path, root).summary.manifests_dropped == 1


def test_a_changed_shard_that_is_not_a_shard_id_is_refused_by_name(root, tmp_path):
    database_path = str(tmp_path / "catalog.duckdb")
    refresh_catalog_file(database_path, root)
    for shard in ["../landing", "shard-a/../../x", "*", ""]:
        with pytest.raises(ValueError, match="is not a shard id"):
            refresh_catalog_file(database_path, root, shards=[shard])


@pytest.mark.slow
def test_a_worker_whose_state_is_behind_the_buckets_takes_the_buckets_before_a_scoped_refresh(
    root, s3_bucket, tmp_path
):
    bucket_root = DataRoot(f"{s3_bucket}/speech")
    for path in root.fs.find(root.root):
        bucket_root.write_bytes(path[len(root.root.rstrip("/")) + 1 :], root.fs.cat_file(path))
    worker_a, worker_b = (str(tmp_path / name / "catalog.duckdb") for name in ("a", "b"))
    refresh_catalog_file(worker_a, bucket_root, shards=[])
    refresh_catalog_file(worker_b, bucket_root, shards=[])  # takes the state worker a put in the bucket

    write_manifest(bucket_root, "shard-e", SHARD_D)
    assert (
        refresh_catalog_file(worker_b, bucket_root, shards=["shard-e"], checked_per_refresh=0).summary.listed_shards
        == 1
    )
    write_manifest(bucket_root, "shard-f", SHARD_D)
    # Worker a's own state never saw shard-e; told only of shard-f, it starts from the bucket's state.
    refreshed = refresh_catalog_file(worker_a, bucket_root, shards=["shard-f"], checked_per_refresh=0)
    assert refreshed.summary.listed_shards == 1 and refreshed.summary.manifest_files == 6
    full, _ = refresh_from_scratch(bucket_root, tmp_path, "full")
    assert comparable(refreshed.summary) == comparable(full.summary)


def test_a_state_of_an_earlier_layout_is_rebuilt_whole_once_then_refreshed_scoped(root, tmp_path):
    database_path = str(tmp_path / "catalog" / "catalog.duckdb")
    refresh_catalog_file(database_path, root)
    # The state as a refresh before the per-shard rejected counts and histogram totals left it.
    with duckdb.connect(state_path_of(database_path)) as state:
        for table in ("catalog_state_layout", "catalog_rejected_shards", "catalog_quality_bin_totals"):
            state.execute(f"DROP TABLE {table}")
    write_manifest(root, "shard-e", SHARD_D)
    write_rejects(root, "shard-e", "ingest", ["shard-e_x2"], reason="unreadable_audio")

    rebuilt = refresh_catalog_file(database_path, root, shards=["shard-e"])
    assert rebuilt.summary.listed_shards is None and rebuilt.summary.manifests_read == 5, "every file read again"
    full, full_path = refresh_from_scratch(root, tmp_path, "full")
    assert comparable(rebuilt.summary) == comparable(full.summary)
    assert state_contents(database_path) == state_contents(full_path)

    again = refresh_catalog_file(database_path, root, shards=["shard-e"])
    assert (again.summary.listed_shards, again.summary.manifests_read) == (1, 0)
    assert again.summary.rejected_utterances == rebuilt.summary.rejected_utterances > 0
