"""bridge_tars, shard_manifest and manifest_catalog on a sample shard, read back with real readers."""

import hashlib
import json

import dagster as dg
import duckdb
import numpy as np
import pytest
import torch

from assets import SHARD_ASSETS
from assets.catalog import manifest_catalog
from assets.partitions import shard_partitions
from resources.storage import DataRootResource
from sensors.catalog import catalog_refresh_sensor
from speechdata.bridge.manifest import manifest_path
from speechdata.bridge.reader import bridge_dataset, read_sample_at
from speechdata.catalog.queries import select_samples
from speechdata.io import layout
from speechdata.testing.shards import build_sample_shard


@pytest.fixture(scope="module")
def packed(tmp_path_factory, model_cache_dir):
    """Two sample shards taken through the whole per-shard graph once for this module."""
    from speechdata.io.storage import DataRoot
    from tests.tiny_resources import tiny_resources_for

    data_root = DataRoot(str(tmp_path_factory.mktemp("packed") / "data"))
    resources = tiny_resources_for(data_root.url, model_cache_dir)
    with dg.instance_for_test() as instance:
        landed = {}
        for shard_id, seed in (("s1", 1), ("s2", 2)):
            landed[shard_id] = build_sample_shard(
                data_root, shard_id, 6, seed=seed, long_recordings=1, with_faults=True
            )
            instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
            result = dg.materialize(SHARD_ASSETS, partition_key=shard_id, instance=instance, resources=resources)
            assert result.success
        yield data_root, resources, instance, landed


def tar_urls(data_root, shard_id):
    return sorted(
        data_root.fs.unstrip_protocol(p) for p in data_root.fs.glob(data_root.path(f"bridge/{shard_id}-*.tar"))
    )


def test_every_member_decodes_with_the_contract_dtypes_and_shapes(packed):
    data_root, _, _, landed = packed
    manifest = data_root.read_parquet(manifest_path("s1")).to_pylist()
    samples = list(bridge_dataset(tar_urls(data_root, "s1")))
    assert [s["__key__"] for s in samples] == sorted(m["key"] for m in manifest) and samples
    by_key = {m["key"]: m for m in manifest}
    for sample in samples:
        info, m = sample["json"], by_key[sample["__key__"]]
        assert "." not in sample["__key__"]
        assert sample["wav"].dtype == np.float32 and abs(sample["wav"].shape[0] / 24_000 - m["duration_s"]) < 1e-3
        assert sample["qwen"].dtype == np.float16 and sample["qwen"].shape == (m["n_tokens"], 64)
        assert sample["wavlm"].dtype == np.float16 and sample["wavlm"].shape == (m["n_frames"], 64)
        assert sample["tokens"].dtype == sample["grid"].dtype == sample["dur"].dtype == np.int32
        assert len(sample["grid"]) == info["n_frames"] == m["n_frames"]
        assert int(sample["dur"].sum()) + int((sample["grid"] == -1).sum()) == info["n_frames"]
        assert info["sample_rate"] == 24_000 and info["frame_rate"] == 12.5 and info["shard"] == "s1"


def test_manifest_byte_ranges_fetch_single_samples(packed):
    data_root, _, _, _ = packed
    manifest = data_root.read_parquet(manifest_path("s2")).to_pylist()
    whole = {s["__key__"]: s for s in bridge_dataset(tar_urls(data_root, "s2"))}
    for row in manifest[::2]:
        sample = read_sample_at(row["tar_url"], row["offset"], row["size"], data_root=data_root.url)
        assert sample["__key__"] == row["key"]
        np.testing.assert_array_equal(sample["qwen"], whole[row["key"]]["qwen"])
        np.testing.assert_array_equal(sample["grid"], whole[row["key"]]["grid"])


def test_every_landed_utterance_is_packed_or_rejected(packed):
    data_root, _, _, landed = packed
    manifest_keys = set(data_root.read_parquet(manifest_path("s1"))["key"].to_pylist())
    rejected = set()
    for path in data_root.fs.glob(data_root.path("shards/s1/rejects/*.parquet")):
        rejected |= set(data_root.read_parquet(path[len(data_root.root) + 1 :])["utt_id"].to_pylist())
    assert set(landed["s1"]["utt_id"].to_pylist()) == manifest_keys | rejected
    assert not manifest_keys & rejected
    extras = json.loads(data_root.read_parquet(manifest_path("s1"))["extra"][0].as_py())
    assert "speaker" in extras and "quality_score" in extras  # carried through, in the namespace


def test_rematerialization_is_byte_identical(packed):
    data_root, resources, instance, _ = packed
    before = {u: hashlib.sha256(data_root.fs.cat_file(u)).hexdigest() for u in tar_urls(data_root, "s1")}
    from assets.packaging import bridge_tars, shard_manifest

    result = dg.materialize([bridge_tars, shard_manifest], partition_key="s1", instance=instance, resources=resources)
    assert result.success
    after = {u: hashlib.sha256(data_root.fs.cat_file(u)).hexdigest() for u in tar_urls(data_root, "s1")}
    assert before == after
    [event] = result.asset_materializations_for_node("bridge_tars")
    assert set(event.metadata["tar_urls"].value.values()) == set(after.values())


def test_small_tar_budget_rolls_over_and_drops_stale_tars(packed):
    data_root, resources, instance, _ = packed
    from assets.packaging import bridge_tars, shard_manifest

    n_samples = data_root.read_parquet(layout.bridge_index("s2")).num_rows
    config = {"ops": {"bridge_tars": {"config": {"max_samples": 2}}}}
    assert dg.materialize(
        [bridge_tars, shard_manifest], partition_key="s2", instance=instance, resources=resources, run_config=config
    ).success
    assert len(tar_urls(data_root, "s2")) == -(-n_samples // 2)
    assert len(list(bridge_dataset(tar_urls(data_root, "s2")))) == n_samples
    assert dg.materialize(
        [bridge_tars, shard_manifest], partition_key="s2", instance=instance, resources=resources
    ).success
    assert len(tar_urls(data_root, "s2")) == 1


def test_reader_works_with_a_multi_worker_dataloader_and_filters_language(packed):
    data_root, _, _, _ = packed
    urls = tar_urls(data_root, "s1") + tar_urls(data_root, "s2")
    dataset = bridge_dataset(urls, languages=["de"], shuffle=10).map(lambda s: s["__key__"])
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    keys = list(loader)
    expected = [
        row["key"]
        for shard in ("s1", "s2")
        for row in data_root.read_parquet(manifest_path(shard)).to_pylist()
        if row["language"] == "de"
    ]
    assert sorted(keys) == sorted(expected) and keys


def test_catalog_refresh_sensor_and_asset_pick_up_manifests(packed):
    data_root, resources, instance, _ = packed
    bound = {"data_root": DataRootResource(url=data_root.url)}
    context = dg.build_sensor_context(instance=instance, resources=bound)
    result = catalog_refresh_sensor(context)
    assert len(result.run_requests) == 1
    assert isinstance(
        catalog_refresh_sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor, resources=bound)),
        dg.SkipReason,
    )

    materialized = dg.materialize([manifest_catalog], instance=instance, resources=resources)
    assert materialized.success
    with duckdb.connect(f"{data_root.root}/catalog.duckdb", read_only=True) as connection:
        [(total,)] = connection.execute("SELECT count(*) FROM samples").fetchall()
        selection = select_samples(connection, languages=["de"])
    manifests = sum(data_root.read_parquet(manifest_path(s)).num_rows for s in ("s1", "s2"))
    assert total == manifests
    assert set(selection["language"].to_pylist()) == {"de"}
    assert "de" in instance.get_dynamic_partitions("language")


def test_manifest_catalog_reads_only_changed_manifests_unless_asked_for_a_full_refresh(packed):
    data_root, resources, instance, _ = packed

    def refresh(config=None):
        run_config = {"ops": {"manifest_catalog": {"config": config}}} if config else None
        result = dg.materialize([manifest_catalog], instance=instance, resources=resources, run_config=run_config)
        [event] = result.asset_materializations_for_node("manifest_catalog")
        return {k: event.metadata[k].value for k in ("manifests_read", "manifests_reused", "dagster/row_count")}

    refresh()  # whatever an earlier test left: now current
    again = refresh()
    assert (again["manifests_read"], again["manifests_reused"]) == (0, 2)
    full = refresh({"full": True})
    assert (full["manifests_read"], full["manifests_reused"]) == (2, 0)
    assert again["dagster/row_count"] == full["dagster/row_count"] > 0


def latest_metadata(instance, asset_key: str, shard_id: str):
    [record] = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset_key), asset_partitions=[shard_id]), limit=1
    ).records
    return record.asset_materialization.metadata


MAX_MANIFEST_NUMBERS = 8
"""How many plottable numbers shard_manifest may carry: the ledger's detail lives in its table."""


def test_shard_manifest_metadata_is_the_ledger_table_a_few_numbers_and_two_histograms(packed):
    data_root, _, instance, _ = packed
    metadata = latest_metadata(instance, "shard_manifest", "s1")
    numbers = [key for key, value in metadata.items() if isinstance(value, dg.IntMetadataValue | dg.FloatMetadataValue)]
    assert len(numbers) <= MAX_MANIFEST_NUMBERS, numbers
    assert not [key for key in metadata if key.startswith(("ledger/", "rejects/"))]
    assert "| bridge |" in metadata["ledgers"].value
    manifest = data_root.read_parquet(manifest_path("s1"))
    for column in ("duration_s", "alignment_score"):
        histogram = metadata[f"{column}_histogram"].value
        assert histogram.startswith(f"| {column} | count |")
        binned = sum(int(line.split("|")[2]) for line in histogram.splitlines()[2:12])
        assert binned == len(manifest[column].drop_null()) > 0


def test_every_asset_with_an_output_table_describes_every_column(packed):
    _, _, instance, _ = packed
    described = {}
    for asset in SHARD_ASSETS:
        for key in asset.keys:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, asset_partitions=["s1"]), limit=1
            ).records
            schema = records[0].asset_materialization.metadata.get("dagster/column_schema") if records else None
            if schema is not None:
                described[key.to_user_string()] = {c.name: c.description for c in schema.value.columns}
    assert {"raw_shards", "shard_manifest"} <= set(described)
    undescribed = {asset: [c for c, text in columns.items() if not text] for asset, columns in described.items()}
    assert not {asset: columns for asset, columns in undescribed.items() if columns}
