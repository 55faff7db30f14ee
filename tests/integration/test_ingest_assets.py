"""The ingest assets materialized in process with the real resources, on a sample shard."""

import json

import dagster as dg
import pytest

from assets.ingest import normalized_audio, raw_shards
from assets.partitions import shard_partitions
from speechdata.audio.container import iter_container_audio
from speechdata.io import layout
from speechdata.testing.shards import FAULT_REASONS, build_sample_shard
from tests.tiny_resources import tiny_resources_for


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def materialize(instance, data_root, shard_id, selection=(raw_shards, normalized_audio), raise_on_error=True):
    instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
    return dg.materialize(
        list(selection),
        partition_key=shard_id,
        instance=instance,
        resources=tiny_resources_for(data_root.url),
        raise_on_error=raise_on_error,
    )


def materialization(result, key):
    [event] = result.asset_materializations_for_node(key)
    return event.metadata


def test_sample_shard_with_faults_is_indexed_normalized_and_accounted_for(instance, data_root):
    landed = build_sample_shard(data_root, "s1", 8, seed=1, long_recordings=1, as_tar=True, with_faults=True)
    result = materialize(instance, data_root, "s1")
    assert result.success

    raw_meta = materialization(result, "raw_shards")
    assert raw_meta["dagster/row_count"].value == 11
    assert raw_meta["utterances_in"].value == landed.num_rows == 16
    assert raw_meta["rejects"].value == len(FAULT_REASONS)
    assert raw_meta["rejects_by_reason"].value == {reason: 1 for reason in FAULT_REASONS}
    assert raw_meta["hours"].value > 0
    assert "| utt_id |" in raw_meta["preview"].value

    audio_meta = materialization(result, "normalized_audio")
    assert audio_meta["dagster/row_count"].value == 11
    assert audio_meta["audio_seconds_per_second"].value > 0
    assert audio_meta["sample_rate"].value == 24_000

    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {
        "every_landed_row_accounted_for": True,
        "every_indexed_utterance_normalized_or_rejected": True,
    }
    index = data_root.read_parquet(layout.utterance_index("s1"))
    decoded = {utt: samples for utt, samples, _ in iter_container_audio(data_root, layout.normalized_audio("s1"))}
    assert set(decoded) == set(index["utt_id"].to_pylist())
    for utt_id, duration_s in zip(index["utt_id"].to_pylist(), index["duration_s"].to_pylist()):
        assert abs(decoded[utt_id].shape[0] / 24_000 - duration_s) < 1e-3
    # Extra columns are carried through, in the one namespace field.
    assert all(json.loads(e)["speaker"] is not None for e in index["extra"].to_pylist())


def test_contract_breach_fails_the_run_with_file_column_and_rule(instance, data_root):
    import pyarrow as pa

    data_root.write_parquet(layout.landing_metadata("bad"), pa.table({"utt_id": ["a"]}))
    result = materialize(instance, data_root, "bad", selection=(raw_shards,), raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    info = failure.step_failure_data.user_failure_data
    assert "audio_path" in info.description and "required column is missing" in info.description
    assert info.metadata["column"].value == "audio_path"
    assert info.metadata["file"].value.endswith("landing/bad/metadata.parquet")


def test_contract_breach_shows_its_one_reason_on_the_shards_own_check(instance, data_root):
    import pyarrow as pa

    data_root.write_parquet(layout.landing_metadata("bad"), pa.table({"utt_id": ["a"]}))
    result = materialize(instance, data_root, "bad", raise_on_error=False)
    assert not result.success
    [evaluation] = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert evaluation.asset_key == raw_shards.key and evaluation.partition == "bad" and not evaluation.passed
    assert evaluation.metadata["column"].value == "audio_path"
    assert "required column is missing" in evaluation.metadata["landing_contract"].value
    # normalized_audio never ran: its check has no verdict (Dagster shows it as not executed).
    assert not any(
        e.event_type_value == "ASSET_CHECK_EVALUATION" and e.asset_key == normalized_audio.key
        for e in result.all_events
    )
