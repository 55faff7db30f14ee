"""The ``hf`` product line counts what the Hugging Face dataset holds, not the shard's own index.

``hf_dataset`` writes each shard's published index per country and the ``hf_dataset`` rejects (the
segments a state filtered out), so ``shard_ledgers`` and the catalog's ``product_accounting`` balance
exactly when every landed utterance is in the dataset, filtered with a reason, or rejected at landing.
"""

from collections import Counter

import dagster as dg
import pytest

from assets.publishing import hf_dataset
from speechdata.accounting.ledgers import shard_ledgers
from speechdata.catalog.accounting_state import SHARD_ACCOUNTING_FROM_STATE
from speechdata.catalog.queries import NAMED_QUERIES, run_query
from speechdata.catalog.views import refresh_catalog
from speechdata.hf.state import state_connection
from speechdata.io import layout
from speechdata.testing.aligned_json import build_aligned_json_corpus
from tests.integration.test_attacks_publishing import DATASET, index_shard, land_granary_shard
from tests.integration.test_attacks_publishing import publish as build_country
from tests.integration.test_publishing_assets import land, publish
from tests.tiny_resources import tiny_resources_for
from tests.unit.test_catalog_incremental import connect


@pytest.fixture
def instance(monkeypatch):
    monkeypatch.setenv("SPEECHDATA_PUBLISHING_SETTLE_S", "0")
    with dg.instance_for_test() as instance:
        yield instance


def hf_accounting(data_root) -> dict[str, tuple]:
    """The catalog's ``hf`` rows by shard, ``(landed, produced, rejected, balanced)``; the view and the
    per-shard state must agree on every one."""
    with connect(data_root) as connection:
        refresh_catalog(connection, data_root.url)
        by_query = [
            {
                r["shard"]: (r["landed"], r["produced"], r["rejected"], r["balanced"])
                for r in run_query(connection, sql).to_pylist()
                if r["product"] == "hf"
            }
            for sql in (NAMED_QUERIES["shard_accounting"], SHARD_ACCOUNTING_FROM_STATE)
        ]
    assert by_query[0] == by_query[1]
    return by_query[0]


def hf_rejects_by_reason(data_root) -> Counter:
    with connect(data_root) as connection:
        refresh_catalog(connection, data_root.url)
        rows = connection.execute("SELECT reason, count(*) FROM product_rejects WHERE product = 'hf' GROUP BY ALL")
        return Counter(dict(rows.fetchall()))


def segment_statuses(data_root, country) -> list[tuple[str, str, str, str | None]]:
    with state_connection(data_root, layout.hf_state_database(DATASET, country)) as db:
        return db.execute("SELECT shard_id, key, status, reason FROM segments").fetchall()


def test_a_clean_build_of_two_countries_balances_every_shards_hf_ledger_with_filtered_segments_as_rejects(
    tmp_path, data_root, clips, instance
):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 3}, clips=clips, audio_format="opus")
    build_aligned_json_corpus(corpus, {"fr": 3}, clips=clips, audio_format="flac", seed=5)
    shards = land(corpus, data_root, instance)
    publish(instance, data_root, "de")
    publish(instance, data_root, "fr")

    segments = segment_statuses(data_root, "de") + segment_statuses(data_root, "fr")
    filtered = Counter(reason for _, _, status, reason in segments if status == "filtered")
    assert filtered, "the corpus must hold segments the states filter out"
    accounting = hf_accounting(data_root)
    assert sorted(accounting) == sorted(shards)
    for shard_id in shards:
        ledger = shard_ledgers(data_root, shard_id)["hf"]
        in_dataset = {key for shard, key, status, _ in segments if shard == shard_id and status != "filtered"}
        assert ledger.balanced, (shard_id, ledger)
        assert ledger.produced == len(in_dataset)
        assert accounting[shard_id] == (ledger.landed, ledger.produced, ledger.rejected, True)
    assert hf_rejects_by_reason(data_root) == filtered


def test_a_row_lost_from_the_state_of_shards_reusing_utterance_ids_shows_the_shards_hf_ledger_unbalanced(
    data_root, instance
):
    for shard_id in ("granary-a", "granary-b"):  # the same utt_000000... in both
        land_granary_shard(data_root, shard_id, "de", 3)
        index_shard(instance, data_root, shard_id)
    assert build_country(instance, data_root, "de").success
    assert hf_accounting(data_root) == {"granary-a": (3, 3, 0, True), "granary-b": (3, 3, 0, True)}

    with state_connection(data_root, layout.hf_state_database(DATASET, "de")) as db:
        db.execute("DELETE FROM segments WHERE shard_id = 'granary-b' AND key = 'utt_000001'")
    assert not dg.materialize(
        [hf_dataset],
        partition_key="de",
        instance=instance,
        resources=tiny_resources_for(data_root.url),
        raise_on_error=False,
    ).success  # the publishing gate refuses it

    assert hf_accounting(data_root) == {"granary-a": (3, 3, 0, True), "granary-b": (3, 2, 0, False)}
    ledger = shard_ledgers(data_root, "granary-b")["hf"]
    assert (ledger.balanced, ledger.unaccounted) == (False, ["utt_000001"])
    assert shard_ledgers(data_root, "granary-a")["hf"].balanced


def test_a_shard_feeding_two_countries_balances_once_both_are_built_each_in_its_own_run(data_root, instance):
    land_granary_shard(data_root, "mixed", "de", 4)
    index_shard(instance, data_root, "mixed")
    # Half the shard's utterances belong to another country: a second country's run writes its own index.
    metadata = data_root.read_parquet(layout.utterance_index("mixed"))
    countries = ["at" if i % 2 else "de" for i in range(metadata.num_rows)]
    data_root.write_parquet(
        layout.utterance_index("mixed"),
        metadata.set_column(metadata.schema.get_field_index("country"), "country", [countries]),
    )

    assert build_country(instance, data_root, "de").success
    landed, produced, rejected, balanced = hf_accounting(data_root)["mixed"]
    assert (landed, produced, balanced) == (4, 2, False)  # the at half is in no dataset yet
    assert build_country(instance, data_root, "at").success
    assert hf_accounting(data_root)["mixed"] == (4, 4, 0, True)
    assert build_country(instance, data_root, "de").success  # a rebuild of one keeps the other's rows
    assert hf_accounting(data_root)["mixed"] == (4, 4, 0, True)
    assert shard_ledgers(data_root, "mixed")["hf"].balanced
