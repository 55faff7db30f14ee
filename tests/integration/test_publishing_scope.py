"""What the published HF dataset holds: only the shards and countries meant for it, one config per
country code, every promised split or a stated reason; and country_dataset_sensor rebuilds a country
only when its inputs changed, start-up included."""

from pathlib import Path

import dagster as dg
import datasets
import pytest
import yaml

from resources.hub import HubPublisherResource
from resources.storage import DataRootResource
from speechdata.hf.published_index import published_index
from speechdata.hf.segments import country_segments
from speechdata.io import layout
from speechdata.testing.aligned_json import build_aligned_json_corpus
from tests.conftest import encode, land_shard, tone
from tests.integration.test_attacks_publishing import DATASET, index_shard
from tests.integration.test_publishing_assets import land, publish


@pytest.fixture
def instance(monkeypatch):
    monkeypatch.setenv("SPEECHDATA_PUBLISHING_SETTLE_S", "0")
    with dg.instance_for_test() as instance:
        yield instance


def land_bridge_shard(data_root, instance, shard_id: str, countries: list[str]) -> None:
    """A shard landed for the bridge-tuple product only: text and audio, no ASR transcript nor CER."""
    rows = [
        {
            "utt_id": f"u{i}",
            "audio_path": f"u{i}.wav",
            "text": f"bridge sentence {i}",
            "language": "en",
            "country": country,
        }
        for i, country in enumerate(countries)
    ]
    files = {row["audio_path"]: encode(tone(5.0, 16_000, freq=300.0 + 50 * i), 16_000) for i, row in enumerate(rows)}
    land_shard(data_root, shard_id, rows, files)
    index_shard(instance, data_root, shard_id)


def sensor_tick(instance, data_root, cursor=None):
    from sensors.publishing import country_dataset_sensor

    return country_dataset_sensor(
        dg.build_sensor_context(
            instance=instance,
            cursor=cursor,
            resources={"data_root": DataRootResource(url=data_root.url), "hub": HubPublisherResource()},
        )
    )


def requested(result) -> list[str]:
    return sorted(r.partition_key for r in result.run_requests) if isinstance(result, dg.SensorResult) else []


def test_bridge_shards_feed_no_country_and_the_card_has_one_config_per_published_country(
    tmp_path, data_root, clips, instance
):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 1}, clips=clips, audio_format="flac")
    land(corpus, data_root, instance)
    # Bridge shards of the published country and of others: none of their rows is the dataset's.
    land_bridge_shard(data_root, instance, "bridge-a", ["de", "us", "gb", "fr"])
    land_bridge_shard(data_root, instance, "bridge-b", ["de", "at", "mx"])

    assert requested(sensor_tick(instance, data_root)) == ["de"]
    assert set(country_segments(data_root, "de")["shard_id"].to_pylist()).isdisjoint({"bridge-a", "bridge-b"})
    metadata = publish(instance, data_root, "de")

    card = Path(data_root.path(layout.hf_dataset_file(DATASET, "README.md"))).read_text()
    front_matter = yaml.safe_load(card.split("---\n")[1])
    assert [c["config_name"] for c in front_matter["configs"]] == ["de"]
    assert [c["config_name"] for c in front_matter["dataset_info"]] == ["de"]
    loaded = datasets.load_dataset(data_root.path(layout.hf_dataset_dir(DATASET)), "de")
    for split, rows in loaded.items():
        table = rows.remove_columns("audio").data
        all_null = [name for name in table.column_names if table[name].null_count == table.num_rows]
        # A pseudo-label's confidence: null on every row whose text landed, as here.
        assert all_null == ["asr_confidence"], f"{split}: columns no row fills: {all_null}"
        assert set(table["text_source"].to_pylist()) == {"landed"}
    # The bridge shards' hf ledger is never built: no published index names them.
    for shard_id in ("bridge-a", "bridge-b"):
        assert not data_root.exists(published_index(shard_id, "de"))
    assert metadata["hf_dataset"]["shards_indexed"].value == 1


def test_a_config_lacking_a_promised_split_says_why_in_the_card_and_the_metadata(tmp_path, data_root, clips, instance):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 1}, clips=clips, audio_format="flac")
    land(corpus, data_root, instance)
    metadata = publish(instance, data_root, "de")

    # One recording: train only, so test and validation are missing, each with its reason.
    loaded = datasets.load_dataset(data_root.path(layout.hf_dataset_dir(DATASET)), "de")
    assert set(loaded) == {"train_1"}
    missing = metadata["hf_dataset"]["missing_splits"].value
    assert sorted(missing) == ["test", "validation"]
    assert "the country has 1 recording(s)" in missing["test"] and "rule 4" in missing["validation"]
    card = Path(data_root.path(layout.hf_dataset_file(DATASET, "README.md"))).read_text()
    assert f"| de | test | {missing['test']} |" in card
    assert f"| de | validation | {missing['validation']} |" in card


def test_the_sensor_requests_only_countries_whose_inputs_changed_start_up_included(
    tmp_path, data_root, clips, instance
):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 1, "fr": 1}, clips=clips, audio_format="flac")
    land(corpus, data_root, instance, ["de"])
    publish(instance, data_root, "de")

    # Right after a build (a fresh sensor, as at start-up: no cursor) nothing is requested.
    at_start_up = sensor_tick(instance, data_root)
    assert requested(at_start_up) == []
    cursor = at_start_up.cursor
    assert cursor  # the indexed shards are covered, not looked at again

    # A shard not meant for the dataset, even of the built country: nothing.
    land_bridge_shard(data_root, instance, "bridge-a", ["de", "us"])
    after_bridge = sensor_tick(instance, data_root, cursor)
    assert requested(after_bridge) == []
    cursor = after_bridge.cursor

    # A shard of another country: exactly that country.
    land(corpus, data_root, instance, ["fr"])
    after_fr = sensor_tick(instance, data_root, cursor)
    assert requested(after_fr) == ["fr"]
    publish(instance, data_root, "fr")
    cursor = after_fr.cursor

    # The same shards indexed again (a re-run of raw_shards): nothing changed, nothing requested.
    for shard_id in instance.get_dynamic_partitions("shard"):
        index_shard(instance, data_root, shard_id)
    reindexed = sensor_tick(instance, data_root, cursor)
    assert requested(reindexed) == []
    cursor = reindexed.cursor

    # A new shard of de: exactly de.
    build_aligned_json_corpus(corpus, {"de": 1}, clips=clips, audio_format="flac", first_recording=5)
    land(corpus, data_root, instance, ["de"])
    assert requested(sensor_tick(instance, data_root, cursor)) == ["de"]


def test_a_country_whose_last_shard_left_is_rebuilt_so_its_rows_are_withdrawn(tmp_path, data_root, clips, instance):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 1}, clips=clips, audio_format="flac")
    [shard_id] = land(corpus, data_root, instance)
    publish(instance, data_root, "de")
    cursor = sensor_tick(instance, data_root).cursor

    # The shard re-landed with its rows in another country: both countries' inputs changed.
    metadata = data_root.read_parquet(layout.landing_metadata(shard_id))
    moved = metadata.set_column(metadata.schema.get_field_index("country"), "country", [["at"] * metadata.num_rows])
    data_root.write_parquet(layout.landing_metadata(shard_id), moved)
    index_shard(instance, data_root, shard_id)
    result = sensor_tick(instance, data_root, cursor)
    assert requested(result) == ["at", "de"]
    assert [r.partition_keys for r in result.dynamic_partitions_requests] == [["at"]]
