"""The per-shard graph with the data root on S3 (moto's server on loopback, through s3fs), read back
with the readers training code uses: WebDataset, byte-range fetches, DuckDB over the bucket, soundfile."""

import io
import re

import dagster as dg
import duckdb
import numpy as np
import pytest
import soundfile as sf

from assets import SHARD_ASSETS
from assets.catalog import manifest_catalog
from assets.partitions import language_partitions, shard_partitions
from assets.vad import language_shard_index
from speechdata.bridge.manifest import manifest_path, tar_location
from speechdata.bridge.reader import bridge_dataset, read_sample_at
from speechdata.catalog.accounting_state import REJECTS_BY_PRODUCT_FROM_STATE, SHARD_ACCOUNTING_FROM_STATE
from speechdata.catalog.database_file import STATE_FILE, state_table_columns
from speechdata.catalog.queries import NAMED_QUERIES, run_query
from speechdata.catalog.state_store import STATE_LOG, ObjectStoreState
from speechdata.io import layout
from speechdata.io.storage import TEMP_PREFIX, DataRoot
from speechdata.testing.shards import build_sample_shard

SHARD = "s3-0001"


@pytest.fixture(scope="module")
def bucket_root(s3_endpoint, model_cache_dir, tmp_path_factory):
    """One shard landed in ``s3://<bucket>/speech`` and taken through every shard asset, the catalog and
    the language index, with the same resources the code location builds (only the models are tiny)."""
    import s3fs
    from dagster_duckdb import DuckDBResource

    from dagster_project.definitions import catalog_database_path
    from tests.tiny_resources import tiny_resources_for

    s3fs.S3FileSystem().mkdir("speech-bucket")
    root = DataRoot("s3://speech-bucket/speech")
    landed = build_sample_shard(root, SHARD, 4, seed=3, long_recordings=1, with_faults=True)
    working_copy = tmp_path_factory.mktemp("catalog") / "catalog.duckdb"
    resources = tiny_resources_for(root.url, model_cache_dir, catalog=DuckDBResource(database=str(working_copy)))
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [SHARD])
        shard = dg.materialize(SHARD_ASSETS, partition_key=SHARD, instance=instance, resources=resources)
        catalog = dg.materialize([manifest_catalog], instance=instance, resources=resources)
        languages = sorted(instance.get_dynamic_partitions(language_partitions.name))
        index = dg.materialize([language_shard_index], partition_key="en", instance=instance, resources=resources)
    assert shard.success and catalog.success and index.success
    assert catalog_database_path(root.url) != root.uri("catalog.duckdb")  # DuckDB cannot write to a bucket
    yield root, landed, shard, catalog, languages


def test_every_shard_asset_wrote_to_the_bucket_and_accounts_for_every_utterance(bucket_root):
    root, landed, shard, _, _ = bucket_root
    checks = {(e.asset_key.to_user_string(), e.check_name): e.passed for e in shard.get_asset_check_evaluations()}
    assert checks[("shard_manifest", "every_utterance_accounted_for")] is True
    assert all(checks.values()), checks
    keys = root.fs.find(root.root)
    assert not [k for k in keys if TEMP_PREFIX in k], "an atomic write left its temp object behind"
    for relative in (
        layout.utterance_index(SHARD),
        layout.normalized_audio(SHARD),
        layout.alignments(SHARD),
        layout.frame_grids(SHARD),
        layout.qwen_hidden_states(SHARD),
        layout.wavlm_features(SHARD),
        manifest_path(SHARD),
        layout.vad_segments(SHARD),
        layout.asr_flac_index(SHARD),
    ):
        assert root.path(relative) in keys, relative
    [event] = shard.asset_materializations_for_node("shard_manifest")
    assert event.metadata["manifest_uri"].value == f"s3://speech-bucket/speech/{manifest_path(SHARD)}"
    assert event.metadata["landed"].value == landed.num_rows


def test_bridge_tars_stream_from_the_bucket_with_webdataset_and_by_byte_range(bucket_root):
    root, _, _, _, _ = bucket_root
    manifest = root.read_parquet(manifest_path(SHARD)).to_pylist()
    # Stored relative to the root (a copied bucket still reads), resolved against the root read from.
    assert manifest and all(row["tar_url"].startswith("bridge/") for row in manifest)
    urls = sorted({tar_location(root.url, row["tar_url"]) for row in manifest})
    assert all(url.startswith("s3://speech-bucket/speech/bridge/") for url in urls)
    samples = {s["__key__"]: s for s in bridge_dataset(urls)}
    assert sorted(samples) == sorted(row["key"] for row in manifest)
    for row in manifest:
        sample = samples[row["key"]]
        assert sample["qwen"].dtype == np.float16 and sample["qwen"].shape[0] == row["n_tokens"]
        assert len(sample["grid"]) == row["n_frames"] == sample["wavlm"].shape[0]
        single = read_sample_at(row["tar_url"], row["offset"], row["size"], data_root=root.url)
        assert np.array_equal(single["grid"], sample["grid"]) and np.array_equal(single["wav"], sample["wav"])


def test_duckdb_reads_the_manifests_in_the_bucket_through_the_catalog(bucket_root, tmp_path):
    from speechdata.catalog.cli import main, open_catalog

    root, _, _, catalog, languages = bucket_root
    manifest = root.read_parquet(manifest_path(SHARD))
    [event] = catalog.asset_materializations_for_node("manifest_catalog")
    assert event.metadata["dagster/row_count"].value == manifest.num_rows
    assert event.metadata["duckdb_reads_through"].value in ("httpfs", "fsspec")
    assert root.exists("catalog.duckdb")  # the built database was uploaded next to the manifests
    assert languages == sorted(event.metadata["languages"].value) and "en" in languages
    # The refresh's state went up beside the catalog (a snapshot and its log), for the next worker to start from.
    assert root.exists(STATE_LOG) and not root.exists(STATE_FILE)
    state_copy = str(tmp_path / ".catalog.duckdb.state")
    assert ObjectStoreState(root, state_copy, state_table_columns()).fetch()
    with (
        duckdb.connect(state_copy, read_only=True) as state,
        open_catalog(root) as connection,
    ):
        [(samples, shards)] = connection.execute("SELECT count(*), count(DISTINCT shard) FROM samples").fetchall()
        keys = {row[0] for row in connection.execute("SELECT key FROM samples").fetchall()}
        rejects = connection.execute("SELECT count(DISTINCT utt_id) FROM rejects").fetchall()[0][0]
        # The per-shard accounting the asset showed was counted from the bucket's files: the same rows as the views.
        for state_sql, view_sql in (
            (SHARD_ACCOUNTING_FROM_STATE, NAMED_QUERIES["shard_accounting"]),
            (REJECTS_BY_PRODUCT_FROM_STATE, NAMED_QUERIES["rejects_by_product"]),
        ):
            from_state = run_query(state, state_sql).to_pylist()
            assert from_state and from_state == run_query(connection, view_sql).to_pylist()
    assert (samples, shards) == (manifest.num_rows, 1) and keys == set(manifest["key"].to_pylist())
    assert event.metadata["accounting_shards_recounted"].value == 1
    assert rejects == event.metadata["rejected_utterances"].value > 0
    with pytest.raises(duckdb.Error), open_catalog(root) as connection:  # the copy a reader gets is read-only
        connection.execute("CREATE TABLE scratch AS SELECT 1")
    out = io.StringIO()
    import contextlib

    with contextlib.redirect_stdout(out):
        assert main(["--data-root", root.url, "--named", "hours_per_shard"]) == 0
    assert SHARD in out.getvalue()


def test_asr_flac_and_vad_tars_read_back_from_the_bucket(bucket_root):
    from speechdata.vad.language_index import build_urls, read_language_shard_index
    from speechdata.vad.loader import vad_chunk_loader

    root, _, _, _, _ = bucket_root
    flac = root.read_parquet(layout.asr_flac_index(SHARD)).to_pylist()
    assert flac
    for row in flac:
        with root.fs.open(root.path(row["flac_path"]), "rb") as handle:
            samples, rate = sf.read(handle, dtype="float32")
        assert rate == 16_000 and len(samples) == row["n_samples"]
    index = read_language_shard_index(root, "en")
    assert index.num_rows == 1 and index["shard"].to_pylist() == [SHARD]
    urls = build_urls(["en"], root)
    assert urls and all(url.startswith("s3://speech-bucket/speech/") for url in urls)
    batches = list(vad_chunk_loader(urls, root, languages=["en"], chunk_s=1.0, num_chunks=2, batch_size=4))
    chunks = sum(batch["input_values"].shape[0] for batch in batches)
    assert chunks > 0 and all(language == "en" for batch in batches for language in batch["languages"])


def test_the_country_dataset_builds_and_publishes_state_with_the_root_in_the_bucket(s3_endpoint, tmp_path, clips):
    import s3fs

    from speechdata.hf.assignment import refresh_split_assignments
    from speechdata.hf.card import write_dataset_card
    from speechdata.hf.dataset import DatasetOptions, build_country_dataset
    from speechdata.hf.state import state_connection
    from speechdata.importers.aligned_json import import_aligned_countries
    from speechdata.landing.ingest import run_raw_shards
    from speechdata.testing.aligned_json import build_aligned_json_corpus

    s3fs.S3FileSystem().mkdir("hf-bucket")
    root = DataRoot("s3://hf-bucket/speech")
    build_aligned_json_corpus(tmp_path / "countries", {"de": 3}, clips=clips, audio_format="flac")
    [report] = import_aligned_countries(str(tmp_path / "countries"), root)
    for shard in report.shards:
        run_raw_shards(root, shard)
    summary = refresh_split_assignments(root, "ds", "de")
    built = build_country_dataset(root, "de", DatasetOptions(dataset="ds"))
    write_dataset_card(root, "ds")
    written = {f["path_in_repo"]: f["rows"] for split in built.written for f in split.files}
    assert {re.sub(r"-shard-[0-9a-f]{10}-[0-9a-f]{12}\.parquet$", "", p) for p in written} == {
        f"de/{s}-00000-of-00001" for s in ("test", "validation", "train_1")
    }
    for path, rows in written.items():
        table = root.read_parquet(layout.hf_dataset_file("ds", path))
        assert table.num_rows == rows
        samples, rate = sf.read(io.BytesIO(table["audio"][0].as_py()["bytes"]))
        assert rate == 16_000 and samples.size > 3 * rate
    # The state database lives in the bucket and survives the round trip through a local copy.
    assert root.exists(layout.hf_state_database("ds", "de"))
    with state_connection(root, layout.hf_state_database("ds", "de")) as db:
        [(recordings,)] = db.execute("SELECT count(*) FROM recordings").fetchall()
        [(pending,)] = db.execute(
            "SELECT count(*) FROM segments WHERE status = 'pending' AND file IS NOT NULL"
        ).fetchall()
    assert recordings == sum(summary.recordings_by_split.values()) == 3
    assert pending == sum(written.values())
    # The shards' published indexes and hf_dataset rejects land in the bucket and balance the hf ledger.
    from speechdata.accounting.ledgers import shard_ledgers
    from speechdata.hf.published_index import write_published_indexes

    state_before = root.fs.info(root.path(layout.hf_state_database("ds", "de")))["size"]
    indexed = write_published_indexes(root, "ds", "de")
    assert sorted(indexed) == sorted(report.shards) and sum(indexed.values()) == pending
    for shard in report.shards:
        assert shard_ledgers(root, shard)["hf"].balanced, shard
    assert root.fs.info(root.path(layout.hf_state_database("ds", "de")))["size"] == state_before
    assert not [k for k in root.fs.find(root.root) if TEMP_PREFIX in k]
