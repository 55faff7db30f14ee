"""Per-product ledgers, publish-after-check and empty shards, through real materializations."""

import hashlib

import dagster as dg
import pyarrow as pa
import pytest

from assets import ON_DEMAND_SHARD_ASSETS, SHARD_ASSETS
from assets.packaging import bridge_tars, shard_manifest
from assets.partitions import shard_partitions
from speechdata.accounting.ledgers import PRODUCT_STAGES, shard_ledgers
from speechdata.bridge.manifest import manifest_path
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.shards import build_sample_shard
from tests.conftest import land_shard

MATERIALIZE_ALL = [*SHARD_ASSETS, *ON_DEMAND_SHARD_ASSETS]
"""What "Materialize all" on a shard partition selects in the UI: every shard-partitioned asset."""


@pytest.fixture(scope="module")
def shard_run(tmp_path_factory, model_cache_dir):
    from tests.tiny_resources import tiny_resources_for

    data_root = DataRoot(str(tmp_path_factory.mktemp("ledgers") / "data"))
    resources = tiny_resources_for(data_root.url, model_cache_dir)
    with dg.instance_for_test() as instance:
        build_sample_shard(data_root, "good", 4, seed=3, long_recordings=1, with_faults=True)
        instance.add_dynamic_partitions(shard_partitions.name, ["good"])
        result = dg.materialize(MATERIALIZE_ALL, partition_key="good", instance=instance, resources=resources)
        yield data_root, resources, instance, result


def file_digests(data_root: DataRoot, pattern: str) -> dict[str, str]:
    return {
        p: hashlib.sha256(data_root.fs.cat_file(p)).hexdigest()
        for p in sorted(data_root.fs.glob(data_root.path(pattern)))
    }


def test_materialize_all_without_segmentation_is_green_and_every_ledger_balances(shard_run):
    data_root, _, _, result = shard_run
    assert result.success
    ledgers = shard_ledgers(data_root, "good")
    # The hf product is built per country (hf_dataset), never by a shard's "Materialize all": it has
    # no published index for the shard yet, so no ledger rather than one that claims to balance.
    assert set(ledgers) == set(PRODUCT_STAGES) - {"hf"}
    for product, ledger in ledgers.items():
        assert ledger.balanced, (product, ledger)
    # No LLM segmentation landed: every aligned utterance is a translation reject, never a bridge one.
    assert "no_segmentation" in ledgers["translation"].rejects_by_reason
    assert "no_segmentation" not in ledgers["bridge"].rejects_by_reason
    [event] = result.asset_materializations_for_node("shard_manifest")
    assert event.metadata["published"].value is True
    # Per-reason counts are in the ledger table, not one metadata key each.
    count = ledgers["translation"].rejects_by_reason["no_segmentation"]
    assert f"no_segmentation: {count}" in event.metadata["ledgers"].value
    assert event.metadata["unbalanced_products"].value == 0
    assert "| bridge |" in event.metadata["ledgers"].value


def test_the_catalog_accounting_view_says_the_same_per_product(shard_run):
    from assets.catalog import manifest_catalog

    data_root, resources, instance, _ = shard_run
    result = dg.materialize([manifest_catalog], instance=instance, resources=resources)
    assert result.success
    [event] = result.asset_materializations_for_node("manifest_catalog")
    ledgers = shard_ledgers(data_root, "good")
    assert event.metadata["unbalanced_ledgers"].value == 0
    for product, ledger in ledgers.items():
        for reason, count in ledger.rejects_by_reason.items():
            assert event.metadata[f"rejects/{product}/{reason}"].value == count
    import duckdb

    with duckdb.connect(data_root.path("catalog.duckdb"), read_only=True) as connection:
        rows = connection.execute(
            "SELECT product, landed, produced, rejected, balanced FROM product_accounting WHERE shard = 'good'"
        ).fetchall()
    by_product = {r[0]: r[1:] for r in rows}
    hf_landed, hf_produced, _, hf_balanced = by_product.pop("hf")  # no country built: not yet produced
    assert (hf_landed, hf_produced, hf_balanced) == (ledgers["bridge"].landed, None, False)
    assert by_product == {p: (ledger.landed, ledger.produced, ledger.rejected, True) for p, ledger in ledgers.items()}


def test_translation_then_shard_manifest_alone_is_green(shard_run):
    data_root, resources, instance, _ = shard_run
    assert dg.materialize(ON_DEMAND_SHARD_ASSETS, partition_key="good", instance=instance, resources=resources).success
    assert dg.materialize([shard_manifest], partition_key="good", instance=instance, resources=resources).success


def test_failed_accounting_keeps_the_previous_manifest_and_tars(shard_run):
    data_root, resources, instance, _ = shard_run
    before = file_digests(data_root, "manifests/shard=good/*") | file_digests(data_root, "bridge/good-*")
    landed = data_root.read_parquet(layout.landing_metadata("good"))
    try:
        # A landed utterance no stage knows of: the bridge ledger cannot balance.
        ghost = pa.Table.from_pylist([{"utt_id": "ghost", "audio_path": "ghost.wav"}]).cast(
            landed.select(["utt_id", "audio_path"]).schema
        )
        data_root.write_parquet(
            layout.landing_metadata("good"),
            pa.concat_tables([landed, ghost], promote_options="default"),
        )
        result = dg.materialize(
            [bridge_tars, shard_manifest],
            partition_key="good",
            instance=instance,
            resources=resources,
            raise_on_error=False,
        )
        assert not result.success
        [evaluation] = [
            e for e in result.get_asset_check_evaluations() if e.check_name == "every_utterance_accounted_for"
        ]
        assert not evaluation.passed and evaluation.metadata["unaccounted"].value == ["ghost"]
        assert file_digests(data_root, "manifests/shard=good/*") | file_digests(data_root, "bridge/good-*") == before
    finally:
        data_root.write_parquet(layout.landing_metadata("good"), landed)


def test_a_shard_with_every_row_rejected_is_an_empty_green_product(shard_run):
    data_root, resources, instance, _ = shard_run
    rows = [{"utt_id": f"u{i}", "audio_path": f"missing{i}.wav", "text": "hello", "language": "en"} for i in range(3)]
    land_shard(data_root, "allbad", rows, {})
    instance.add_dynamic_partitions(shard_partitions.name, ["allbad"])
    result = dg.materialize(MATERIALIZE_ALL, partition_key="allbad", instance=instance, resources=resources)
    assert result.success
    manifest = data_root.read_parquet(manifest_path("allbad"))
    assert manifest.num_rows == 0 and not data_root.fs.glob(data_root.path("bridge/allbad-*.tar"))
    ledgers = shard_ledgers(data_root, "allbad")
    assert all(ledger.balanced for ledger in ledgers.values())
    assert ledgers["bridge"].rejects_by_reason == {"audio_not_found": 3}
    [event] = result.asset_materializations_for_node("shard_manifest")
    assert event.metadata["dagster/row_count"].value == 0 and event.metadata["empty_because"].value


def test_a_shard_with_no_rows_is_an_empty_green_product(shard_run):
    data_root, resources, instance, _ = shard_run
    land_shard(data_root, "norows", [], {}, schema=pa.schema([("utt_id", pa.string()), ("audio_path", pa.string())]))
    instance.add_dynamic_partitions(shard_partitions.name, ["norows"])
    assert dg.materialize(MATERIALIZE_ALL, partition_key="norows", instance=instance, resources=resources).success
    assert data_root.read_parquet(manifest_path("norows")).num_rows == 0


def test_re_landed_empty_shard_swaps_tars_and_manifest_together(shard_run):
    data_root, resources, instance, _ = shard_run
    build_sample_shard(data_root, "shrinks", 2, seed=5, long_recordings=0)
    instance.add_dynamic_partitions(shard_partitions.name, ["shrinks"])
    assert dg.materialize(SHARD_ASSETS, partition_key="shrinks", instance=instance, resources=resources).success
    assert data_root.fs.glob(data_root.path("bridge/shrinks-*.tar"))
    # What the first build committed (the module's shards share a root: some of these utterances may be
    # near-duplicates of an earlier shard's, left out by the quality filter).
    committed = data_root.read_parquet(manifest_path("shrinks")).num_rows
    assert committed >= 1
    land_shard(data_root, "shrinks", [{"utt_id": "gone", "audio_path": "nope.wav"}], {})
    # Every per-shard asset but the manifest commit, by name: the list's order follows the UI's groups.
    all_but_commit = [asset for asset in SHARD_ASSETS if asset.key != shard_manifest.key]
    staged_only = dg.materialize(all_but_commit, partition_key="shrinks", instance=instance, resources=resources)
    assert staged_only.success
    # bridge_tars ran, shard_manifest did not: readers still see the previous version whole.
    assert data_root.fs.glob(data_root.path("bridge/shrinks-*.tar"))
    assert data_root.read_parquet(manifest_path("shrinks")).num_rows == committed
    assert dg.materialize([shard_manifest], partition_key="shrinks", instance=instance, resources=resources).success
    assert not data_root.fs.glob(data_root.path("bridge/shrinks-*.tar"))
    assert data_root.read_parquet(manifest_path("shrinks")).num_rows == 0
    assert data_root.read_parquet(layout.bridge_index("shrinks")).num_rows == 0
