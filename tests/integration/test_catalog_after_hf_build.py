"""The catalog's refresh after a country's HF build reads the shards the build wrote, not the whole root.

``hf_dataset`` is partitioned by country; its materialization names the shards whose published index
and ``hf_dataset`` rejects it wrote (``shards_whose_catalogued_files_changed``), kept in the country's
state from before the files are written until a recorded build names them, so a build that fails
after writing them leaves them for the next one to name.
"""

import dagster as dg
import pytest

import assets.publishing
from assets.catalog import CATALOGUED_SHARDS_CHANGED, manifest_catalog
from assets.publishing import hf_dataset, hf_split_assignments
from speechdata.hf.published_index import UNREPORTED
from speechdata.hf.shard_paths import published_index
from tests.integration.test_attacks_publishing import index_shard, land_granary_shard, publish, state_rows
from tests.integration.test_catalog_changed_shards import shard_manifest_event
from tests.tiny_resources import tiny_resources_for
from tests.unit.test_catalog_scoped_refresh import contents, refresh_from_scratch, state_contents


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def refresh_catalog(instance, data_root) -> dict:
    """The catalog asset's run, with the HF assets in the graph it was selected from (their partitioning)."""
    result = dg.materialize(
        [manifest_catalog, shard_manifest_event, hf_split_assignments, hf_dataset],
        selection=[manifest_catalog.key],
        instance=instance,
        resources=tiny_resources_for(data_root.url),
    )
    [event] = result.asset_materializations_for_node("manifest_catalog")
    return {key: value.value for key, value in event.metadata.items()}


def named_for_the_catalog(result, asset="hf_dataset") -> list[str]:
    [event] = result.asset_materializations_for_node(asset)
    return event.metadata[CATALOGUED_SHARDS_CHANGED].value


def land_and_index(instance, data_root, shard_id):
    land_granary_shard(data_root, shard_id, "de", 1, prefix=shard_id)
    index_shard(instance, data_root, shard_id)


def assert_same_as_a_full_rebuild(data_root, tmp_path):
    database_path = tiny_resources_for(data_root.url)["catalog"].database
    _, full_path = refresh_from_scratch(data_root, tmp_path, "full")
    assert state_contents(database_path) == state_contents(full_path)
    assert contents(database_path, data_root) == contents(full_path, data_root)


def build_failing(instance, data_root, monkeypatch, name, failure):
    """A build of ``de`` with ``failure`` standing in for ``assets.publishing.<name>``: it fails."""
    with monkeypatch.context() as patched:
        patched.setattr(assets.publishing, name, failure)
        assert not publish(instance, data_root, "de").success


def test_the_refresh_after_a_countrys_build_reads_the_shards_it_wrote_even_after_a_failed_build(
    instance, data_root, tmp_path, monkeypatch
):
    land_and_index(instance, data_root, "shard-a")
    first = publish(instance, data_root, "de")
    assert first.success and named_for_the_catalog(first) == ["shard-a"]
    assert named_for_the_catalog(first, "hf_split_assignments") == []  # it writes no file the catalog reads
    assert refresh_catalog(instance, data_root)["listed"] == "whole root"  # the first refresh

    # One new shard: the build names it alone (shard-a was named by a recorded build), the refresh reads it alone.
    land_and_index(instance, data_root, "shard-b")
    build = publish(instance, data_root, "de")
    assert build.success and named_for_the_catalog(build) == ["shard-b"]
    refreshed = refresh_catalog(instance, data_root)
    assert refreshed["listed"] == "1 changed shards" and data_root.exists(published_index("shard-b", "de"))
    assert_same_as_a_full_rebuild(data_root, tmp_path / "after-b")

    # A build that fails once the published files are written (the state no longer marks shard-c's
    # index as to write), then one that fails after naming shard-c, before its materialization is
    # recorded: the next build names shard-c all the same.
    land_and_index(instance, data_root, "shard-c")
    write_published_indexes = assets.publishing.write_published_indexes

    def write_then_fail(*args):
        write_published_indexes(*args)
        raise OSError("the worker died after writing the published indexes")

    def fail(*args):
        raise OSError("the worker died before its materialization was recorded")

    build_failing(instance, data_root, monkeypatch, "write_published_indexes", write_then_fail)
    assert data_root.exists(published_index("shard-c", "de"))
    build_failing(instance, data_root, monkeypatch, "missing_split_reasons", fail)
    [unreported] = state_rows(data_root, "de", f"SELECT * FROM {UNREPORTED}")
    assert unreported["shard_id"] == "shard-c" and unreported["reported_by"] is not None  # by the failed run
    build = publish(instance, data_root, "de")
    assert build.success and named_for_the_catalog(build) == ["shard-c"]
    assert refresh_catalog(instance, data_root)["listed"] == "1 changed shards"
    assert_same_as_a_full_rebuild(data_root, tmp_path / "after-c")
