"""The per-shard accounting state gives exactly what the accounting views give, recounting only changed shards."""

import duckdb
import pyarrow as pa
import pytest

from speechdata.catalog.accounting_state import (
    ACCOUNTING_STATE_TABLES,
    REJECTS_BY_PRODUCT_FROM_STATE,
    SHARD_ACCOUNTING_FROM_STATE,
)
from speechdata.catalog.queries import NAMED_QUERIES, run_query
from speechdata.catalog.views import refresh_catalog
from speechdata.hf.shard_paths import published_index
from speechdata.io import layout
from tests.unit.test_catalog import SHARD_A, SHARD_B, land_ids, write_manifest, write_rejects
from tests.unit.test_catalog_incremental import catalog_contents, comparable, connect, full_refresh_from_scratch


def keys(shard, rows):
    return [f"{shard}_{r[0]}" for r in rows]


def write_product(data_root, product, shard, utt_ids):
    if product == "asr":
        data_root.write_parquet(layout.asr_flac_index(shard), pa.table({"utt_id": utt_ids}))
    elif product == "hf":
        data_root.write_parquet(published_index(shard, "us"), pa.table({"utt_id": utt_ids}))
    elif product == "translation":
        data_root.write_parquet(layout.streaming_segments(shard), pa.table({"utt_id": utt_ids}))
    elif product == "vad":  # one chunk may hold several utterances
        chunks = [utt_ids[i : i + 2] for i in range(0, len(utt_ids), 2)]
        data_root.write_parquet(
            layout.vad_segments(shard), pa.table({"utt_ids": pa.array(chunks, pa.list_(pa.string()))})
        )
    else:
        raise ValueError(product)


@pytest.fixture
def root(data_root):
    """Shard a built for every product with rejects of several stages, b for two, q only landed,
    z only rejected (never landed)."""
    a, b = keys("shard-a", SHARD_A), keys("shard-b", SHARD_B)
    land_ids(data_root, "shard-a", [*a, "shard-a_u8", "shard-a_u9"])
    land_ids(data_root, "shard-b", [*b, None])
    land_ids(data_root, "shard-q", ["q1", "q2"])
    write_manifest(data_root, "shard-a", SHARD_A)
    write_manifest(data_root, "shard-b", SHARD_B)
    for product in ("asr", "vad", "translation", "hf"):
        write_product(data_root, product, "shard-a", a)
    write_product(data_root, "asr", "shard-b", b)
    write_rejects(data_root, "shard-a", "alignments", ["shard-a_u8", "shard-a_u9"])
    write_rejects(data_root, "shard-a", "raw_shards", ["shard-a_u9"], reason="unreadable_audio")
    write_rejects(data_root, "shard-a", "streaming_segments", a[:2], reason="no_segmentation")
    write_rejects(data_root, "shard-b", "raw_shards", [None], reason="unreadable_audio")
    write_rejects(data_root, "shard-z", "alignments", ["z1"])
    return data_root


def assert_state_matches_the_views(connection):
    for state_sql, view_sql in (
        (SHARD_ACCOUNTING_FROM_STATE, NAMED_QUERIES["shard_accounting"]),
        (REJECTS_BY_PRODUCT_FROM_STATE, NAMED_QUERIES["rejects_by_product"]),
    ):
        from_state, from_views = run_query(connection, state_sql), run_query(connection, view_sql)
        assert from_state.schema == from_views.schema
        assert from_state.to_pylist() == from_views.to_pylist()


def assert_equals_a_full_refresh(connection, data_root, summary):
    full_summary, full = full_refresh_from_scratch(data_root)
    assert comparable(summary) == comparable(full_summary)
    assert catalog_contents(connection) == full


def test_the_state_matches_the_views_and_recounts_only_changed_shards(root):
    with connect(root) as connection:
        first = refresh_catalog(connection, root.url)
        assert first.accounting_shards_read == 4  # a, b, q, z
        assert_state_matches_the_views(connection)
        rows = run_query(connection, SHARD_ACCOUNTING_FROM_STATE).to_pylist()
        a_bridge = next(r for r in rows if (r["shard"], r["product"]) == ("shard-a", "bridge"))
        assert (a_bridge["landed"], a_bridge["produced"], a_bridge["rejected"], a_bridge["balanced"]) == (5, 3, 2, True)
        a_vad = next(r for r in rows if (r["shard"], r["product"]) == ("shard-a", "vad"))  # u8: in no ledger of VAD's
        assert (a_vad["landed"], a_vad["produced"], a_vad["rejected"], a_vad["balanced"]) == (5, 3, 1, False)
        b_bridge = next(r for r in rows if (r["shard"], r["product"]) == ("shard-b", "bridge"))
        assert (b_bridge["landed"], b_bridge["rejected"], b_bridge["balanced"]) == (3, 1, True)  # the null id

        assert refresh_catalog(connection, root.url).accounting_shards_read == 0

        write_product(root, "hf", "shard-b", keys("shard-b", SHARD_B))  # b built for one more product
        summary = refresh_catalog(connection, root.url)
        assert summary.accounting_shards_read == 1
        assert_state_matches_the_views(connection)

        # a re-landed with one utterance fewer, q's first ledger, z's ledger gone
        land_ids(root, "shard-a", [*keys("shard-a", SHARD_A), "shard-a_u8"])
        write_rejects(root, "shard-q", "raw_shards", ["q2"], reason="unreadable_audio")
        root.fs.rm(root.path(layout.rejects("shard-z", "alignments")))
        summary = refresh_catalog(connection, root.url)
        assert summary.accounting_shards_read == 2
        assert_state_matches_the_views(connection)
        assert_equals_a_full_refresh(connection, root, summary)

        # b deleted whole, a's VAD output removed
        for path in (layout.landing_dir("shard-b"), layout.shard_dir("shard-b"), "manifests/shard=shard-b"):
            root.fs.rm(root.path(path), recursive=True)
        root.fs.rm(root.path(layout.vad_segments("shard-a")))
        summary = refresh_catalog(connection, root.url)
        assert summary.accounting_shards_read == 1
        assert_state_matches_the_views(connection)
        shards = {r[0] for r in connection.execute("SELECT shard FROM catalog_product_accounting").fetchall()}
        assert shards == {"shard-a", "shard-q"}
        assert_equals_a_full_refresh(connection, root, summary)


def test_a_catalog_refreshed_before_the_state_existed_is_counted_whole_once(root):
    with connect(root) as connection:
        refresh_catalog(connection, root.url)
        for table in ACCOUNTING_STATE_TABLES:
            connection.execute(f"DROP TABLE {table}")
        summary = refresh_catalog(connection, root.url)
        assert summary.accounting_shards_read == 4
        assert_state_matches_the_views(connection)
        assert refresh_catalog(connection, root.url).accounting_shards_read == 0


def test_a_corrupt_ledger_fails_the_refresh_and_keeps_the_accounting_state(root):
    with connect(root) as connection:
        refresh_catalog(connection, root.url)
        before = catalog_contents(connection, list(ACCOUNTING_STATE_TABLES))
        root.write_bytes(layout.asr_flac_index("shard-q"), b"not parquet")
        with pytest.raises(duckdb.Error, match="asr_flac"):
            refresh_catalog(connection, root.url)
        assert catalog_contents(connection, list(ACCOUNTING_STATE_TABLES)) == before
