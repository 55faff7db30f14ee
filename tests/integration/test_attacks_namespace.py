"""User columns live in one namespace (``extra``): they never shadow a pipeline column, and every
shard's manifest has the same columns, so plain DuckDB and polars globs read them all."""

import json

import dagster as dg
import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets import SHARD_ASSETS
from assets.packaging import shard_manifest
from assets.partitions import shard_partitions
from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.catalog.queries import run_query
from speechdata.io import layout
from speechdata.landing.contract import ContractError
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.shards import build_sample_shard
from tests.conftest import encode, land_shard, tone

HOSTILE = {"tar_url": "http://evil.example/x.tar", "offset": 7, "key": "not-mine", "duration_s": 999.0, "extra": "x"}


def land_hostile_columns(data_root, shard_id):
    """A good sample shard whose metadata also carries columns named like the pipeline's own."""
    landed = build_sample_shard(data_root, shard_id, 2, seed=11, long_recordings=0)
    for name, value in HOSTILE.items():
        landed = landed.append_column(name, pa.array([value] * landed.num_rows))
    data_root.write_parquet(layout.landing_metadata(shard_id), landed)


def test_a_reserved_name_in_the_metadata_is_carried_inside_the_namespace(data_root):
    land_hostile_columns(data_root, "hostile")
    summary = run_raw_shards(data_root, "hostile")
    index = summary.index
    assert summary.rejects == []
    assert index.column_names.count("duration_s") == 1 and "tar_url" not in index.column_names
    assert index["duration_s"].to_pylist() != [999.0, 999.0]  # the probed duration, not the user's
    extra = json.loads(index["extra"][0].as_py())
    assert extra["duration_s"] == 999.0 and extra["tar_url"] == HOSTILE["tar_url"] and extra["extra"] == "x"


def test_a_repeated_column_name_is_a_contract_error_naming_it(data_root):
    audio = encode(tone(1.0, 16_000), 16_000)
    table = pa.Table.from_arrays(
        [pa.array(["a"]), pa.array(["a.wav"]), pa.array([1.0]), pa.array([2.0])],
        names=["utt_id", "audio_path", "snr", "snr"],
    )
    data_root.fs.makedirs(data_root.path("landing/dupcols/audio"), exist_ok=True)
    data_root.write_bytes("landing/dupcols/audio/a.wav", audio)
    with data_root.fs.open(data_root.path(layout.landing_metadata("dupcols")), "wb") as handle:
        pq.write_table(table, handle)
    with pytest.raises(ContractError, match=r"metadata.parquet, column 'snr': column names must be unique"):
        run_raw_shards(data_root, "dupcols")


def test_int64_start_s_out_of_range_is_a_reject_not_a_crash(data_root):
    audio = encode(tone(1.0, 16_000), 16_000)
    table = pa.table({"utt_id": ["ok", "huge"], "audio_path": ["a.wav", "a.wav"], "start_s": [0, 2**62 + 1]})
    land_shard(data_root, "bigint", [], {"a.wav": audio}, table=table)
    index = run_raw_shards(data_root, "bigint").index
    assert index["utt_id"].to_pylist() == ["ok"]
    [reject] = data_root.read_parquet(layout.rejects("bigint", "raw_shards")).to_pylist()
    assert reject["utt_id"] == "huge" and reject["reason"] == "segment_past_end_of_file"


@pytest.fixture(scope="module")
def two_manifests(tmp_path_factory, model_cache_dir):
    from speechdata.io.storage import DataRoot
    from tests.tiny_resources import tiny_resources_for

    data_root = DataRoot(str(tmp_path_factory.mktemp("namespace") / "data"))
    resources = tiny_resources_for(data_root.url, model_cache_dir)
    land_hostile_columns(data_root, "hostile")
    build_sample_shard(data_root, "plain", 2, seed=12, long_recordings=0)  # other extras (speaker, ...)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["hostile", "plain"])
        for shard_id in ("hostile", "plain"):
            up_to_manifest = SHARD_ASSETS[: SHARD_ASSETS.index(shard_manifest) + 1]
            result = dg.materialize(up_to_manifest, partition_key=shard_id, instance=instance, resources=resources)
            assert result.success
    return data_root


def test_every_manifest_has_the_same_columns_and_plain_globs_read_them(two_manifests):
    data_root = two_manifests
    glob = data_root.path("manifests/*/*.parquet")
    # run_query reads the result with whichever Arrow method this DuckDB has (fetch_arrow_table is deprecated).
    by_duckdb = run_query(duckdb.connect(), f"SELECT * FROM read_parquet('{glob}')")
    by_polars = pl.scan_parquet(glob, hive_partitioning=False).collect()
    assert by_duckdb.column_names == by_polars.columns == MANIFEST_COLUMNS.names
    assert by_duckdb.num_rows == by_polars.height > 0
    hostile = data_root.read_parquet(manifest_path("hostile")).to_pylist()
    for row in hostile:
        assert row["tar_url"].startswith("bridge/hostile-") and row["tar_url"].endswith(".tar")  # relative to the root
        assert row["tar_url"] != HOSTILE["tar_url"] and row["key"] != "not-mine" and row["duration_s"] < 999
        assert json.loads(row["extra"])["tar_url"] == HOSTILE["tar_url"]
    speakers = duckdb.sql(
        f"SELECT json_extract_string(extra, '$.speaker') AS speaker FROM read_parquet('{glob}') "
        "WHERE json_extract_string(extra, '$.speaker') IS NOT NULL"
    ).fetchall()
    assert speakers  # the plain shard's landed speaker column is queryable
