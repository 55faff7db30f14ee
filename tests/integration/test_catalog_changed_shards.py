"""manifest_catalog names the shards materialized since its last refresh, from the event log."""

import dagster as dg
import pytest
from dagster_duckdb import DuckDBResource

from assets.catalog import CATALOGUED_SHARDS_CHANGED, CATALOGUED_THROUGH, catalogued_shards_changed, manifest_catalog
from assets.partitions import country_partitions, shard_partitions
from resources.storage import DataRootResource
from tests.unit.test_catalog import write_manifest
from tests.unit.test_catalog_incremental import SHARD_D, write_four_shards


@dg.asset(name="shard_manifest", partitions_def=shard_partitions)
def shard_manifest_event():
    """Stands in for the shard asset in the selection: only its materializations are reported."""


@dg.asset(name="asr_flac", partitions_def=shard_partitions)
def asr_flac_event():
    """A catalogued shard asset the catalog does not depend on: outside its job's own graph."""


@dg.asset(name="hf_dataset", partitions_def=country_partitions)
def hf_dataset_event():
    """Stands in for the country asset: its materializations name the shards they changed in their metadata."""


@pytest.fixture
def refresh(data_root, tmp_path):
    write_four_shards(data_root)
    resources = {
        "data_root": DataRootResource(url=data_root.url),
        "catalog": DuckDBResource(database=data_root.path("catalog.duckdb")),
    }
    with dg.instance_for_test() as instance:

        def materialize():
            result = dg.materialize(
                [manifest_catalog, shard_manifest_event, asr_flac_event, hf_dataset_event],
                selection=[manifest_catalog.key],
                instance=instance,
                resources=resources,
            )
            [event] = result.asset_materializations_for_node("manifest_catalog")
            return {key: value.value for key, value in event.metadata.items()}

        yield instance, materialize


def report(instance, asset, partition, metadata=None):
    instance.report_runless_asset_event(dg.AssetMaterialization(asset, partition=partition, metadata=metadata))


def test_the_refresh_lists_only_the_shards_materialized_since_the_last_one(refresh, data_root):
    instance, materialize = refresh
    first = materialize()
    assert first["listed"] == "whole root"  # no cursor recorded yet
    write_manifest(data_root, "shard-e", SHARD_D)
    report(instance, "shard_manifest", "shard-e")
    # A catalogued shard asset outside the catalog job's own graph: its partitioning comes from
    # every asset the run was given.
    report(instance, "asr_flac", "shard-b")
    second = materialize()
    assert second["listed"] == "2 changed shards" and second["shards"] == first["shards"] + 1
    assert second[CATALOGUED_THROUGH] > first[CATALOGUED_THROUGH]

    # A country's HF dataset names the shards whose files it wrote: the refresh reads those.
    report(instance, "hf_dataset", "us", {CATALOGUED_SHARDS_CHANGED: catalogued_shards_changed(["shard-b"])})
    assert materialize()["listed"] == "1 changed shards"

    # One that does not name them (a build before it named them, or too many): the refresh lists
    # the root, and so finds a shard deleted by hand.
    report(instance, "hf_dataset", "us")
    data_root.fs.rm(data_root.path("manifests/shard=shard-c"), recursive=True)
    third = materialize()
    assert third["listed"] == "whole root" and third["manifests_dropped"] == 1
    report(instance, "hf_dataset", "us", {CATALOGUED_SHARDS_CHANGED: catalogued_shards_changed(["s"] * 10_001)})
    assert materialize()["listed"] == "whole root"
