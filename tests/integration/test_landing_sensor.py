"""landing_sensor against an ephemeral instance: half-landed shards wait, complete ones run once."""

import dagster as dg
import pytest

from sensors.landing import build_landing_sensor
from speechdata.landing.mark import mark_landed
from speechdata.testing.shards import build_sample_shard
from tests.conftest import land_shard
from tests.tiny_resources import tiny_resources_for


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def tick(sensor, instance, data_root, cursor=None) -> dg.SensorResult:
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=tiny_resources_for(data_root.url))
    result = sensor(context)
    # The daemon applies partition requests; a test context does not, so apply them here.
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result


def test_half_landed_shard_is_ignored_until_success_marker(instance, data_root):
    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    build_sample_shard(data_root, "s1", 2, seed=1, long_recordings=0, complete=False)
    first = tick(sensor, instance, data_root)
    assert first.run_requests == [] and instance.get_dynamic_partitions("shard") == []

    mark_landed(data_root, "s1")
    second = tick(sensor, instance, data_root, first.cursor)
    assert [(r.run_key, r.partition_key) for r in second.run_requests] == [("s1", "s1")]
    assert second.run_requests[0].tags["speechdata/launched_by"] == "landing_sensor"
    assert instance.get_dynamic_partitions("shard") == ["s1"]


def test_complete_shard_is_requested_exactly_once_across_ticks(instance, data_root):
    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    build_sample_shard(data_root, "s1", 2, seed=1, long_recordings=0)
    requested = []
    cursor = None
    for _ in range(3):
        result = tick(sensor, instance, data_root, cursor)
        cursor = result.cursor
        requested += [r.run_key for r in result.run_requests]
    assert requested == ["s1"]


def test_new_countries_and_languages_become_partitions(instance, data_root):
    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    metadata = build_sample_shard(data_root, "s1", 8, seed=2, long_recordings=0)
    cursor = tick(sensor, instance, data_root).cursor
    assert sorted(instance.get_dynamic_partitions("language")) == sorted(set(metadata["language"].to_pylist()))
    # A bridge shard (no ASR transcripts) feeds no HF country: its countries never become partitions.
    assert "asr_text" not in metadata.column_names and set(metadata["country"].to_pylist()) - {None}
    assert instance.get_dynamic_partitions("country") == []

    row = {"audio_path": "a.wav", "text": "hello world", "language": "en", "source": "test"}
    rows = [
        {**row, "utt_id": "a", "country": "fr", "asr_text": "hello world"},
        {**row, "utt_id": "b", "country": "de", "asr_text": None},
    ]
    land_shard(data_root, "s2", rows, {})
    tick(sensor, instance, data_root, cursor)
    # Only the countries of rows carrying a transcript: the rows the HF dataset can publish.
    assert instance.get_dynamic_partitions("country") == ["fr"]


def test_cap_per_tick_holds_and_the_rest_follow_on_later_ticks(instance, data_root):
    sensor = build_landing_sensor(max_shards_per_tick=2, batch_shards=1)
    for i in range(5):
        build_sample_shard(data_root, f"s{i}", 1, seed=i, long_recordings=0, formats=("wav",))
    batches = []
    cursor = None
    for _ in range(4):
        result = tick(sensor, instance, data_root, cursor)
        cursor = result.cursor
        batches.append([r.run_key for r in result.run_requests])
    assert batches == [["s0", "s1"], ["s2", "s3"], ["s4"], []]


def test_shard_with_unreadable_metadata_is_still_registered_so_the_failure_shows(instance, data_root):
    from speechdata.io import layout

    data_root.write_bytes(layout.landing_metadata("broken"), b"not parquet")
    mark_landed(data_root, "broken")
    result = tick(build_landing_sensor(batch_shards=1), instance, data_root)
    assert [r.run_key for r in result.run_requests] == ["broken"]


def test_a_register_only_setting_other_than_0_or_1_stops_the_code_location_naming_it():
    """Read when the code location loads: a typo must not silently launch (or hold back) a corpus."""
    import os
    import subprocess
    import sys

    value = "yes"
    env = {**os.environ, "SPEECHDATA_LANDING_REGISTER_ONLY": value}
    loaded = subprocess.run(
        [sys.executable, "-c", "import sensors.landing"], env=env, capture_output=True, text=True, timeout=120
    )
    assert loaded.returncode != 0
    assert "SPEECHDATA_LANDING_REGISTER_ONLY must be 0 or 1" in loaded.stderr
    assert repr(value) in loaded.stderr
