"""The ingest assets materialized in process with the real resources, on a sample shard."""

import json

import dagster as dg
import pytest

from assets.ingest import normalized_audio, raw_shards
from speechdata.audio.container import iter_container_audio
from speechdata.io import layout
from speechdata.testing.shards import FAULT_REASONS, build_sample_shard
from tests.materialize import materialize_shard


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


INGEST = (raw_shards, normalized_audio)


def materialization(result, key):
    [event] = result.asset_materializations_for_node(key)
    return event.metadata


def test_sample_shard_with_faults_is_indexed_normalized_and_accounted_for(instance, data_root):
    landed = build_sample_shard(data_root, "s1", 8, seed=1, long_recordings=1, as_tar=True, with_faults=True)
    result = materialize_shard(instance, data_root, "s1", INGEST)
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
    result = materialize_shard(instance, data_root, "bad", [raw_shards], raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    info = failure.step_failure_data.user_failure_data
    assert "audio_path" in info.description and "required column is missing" in info.description
    assert info.metadata["column"].value == "audio_path"
    assert info.metadata["file"].value.endswith("landing/bad/metadata.parquet")


def test_contract_breach_shows_its_one_reason_on_the_shards_own_check(instance, data_root):
    import pyarrow as pa

    data_root.write_parquet(layout.landing_metadata("bad"), pa.table({"utt_id": ["a"]}))
    result = materialize_shard(instance, data_root, "bad", INGEST, raise_on_error=False)
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


def land_shard_with_string_start_s(data_root, shard_id):
    """A sample shard whose ``start_s`` column is strings: the landing contract's type rule, broken."""
    import pyarrow as pa

    build_sample_shard(data_root, shard_id, 4, seed=1)
    path = layout.landing_metadata(shard_id)
    table = data_root.read_parquet(path)
    position = table.column_names.index("start_s")
    as_text = pa.array([None if v is None else str(v) for v in table["start_s"].to_pylist()], pa.string())
    data_root.write_parquet(path, table.set_column(position, "start_s", as_text))


def test_contract_breach_reads_as_one_reason_in_the_run_failure_and_downstream_is_not_executed(instance, data_root):
    land_shard_with_string_start_s(data_root, "bad")
    result = materialize_shard(instance, data_root, "bad", INGEST, raise_on_error=False)
    assert not result.success

    # The run's failure (what the runs list and the run page show) carries the reason itself.
    [run_failure] = [e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE"]
    failure_data = run_failure.event_specific_data
    message = failure_data.error.message
    assert "'bad'" in message and "landing/bad/metadata.parquet" in message
    assert "'start_s'" in message and "must be of type double, found string" in message
    user_failure = failure_data.first_step_failure_event.step_failure_data.user_failure_data
    assert user_failure.metadata["shard"].value == "bad"
    assert user_failure.metadata["field"].value == "start_s"
    assert user_failure.metadata["file"].value.endswith("landing/bad/metadata.parquet")
    assert "found string" in user_failure.metadata["rule"].value

    # The shard's own check says the same in its description, on its partition.
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.asset_key == raw_shards.key and evaluation.partition == "bad" and not evaluation.passed
    assert evaluation.description == user_failure.description

    # One step failed; the one downstream was not executed, because its upstream failed.
    failed_steps = [e.step_key for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failed_steps == ["raw_shards"]
    assert not any(e.step_key == "normalized_audio" for e in result.all_events if e.is_step_event)
    logs = [entry.user_message for entry in instance.all_logs(result.run_id)]
    assert any("Dependencies for step normalized_audio failed: ['raw_shards']" in m for m in logs)


def test_raw_shards_metadata_shows_the_first_rejects_with_their_reasons(instance, data_root):
    from assets.reporting import REJECTS_SAMPLE_ROWS

    build_sample_shard(data_root, "s1", 8, seed=1, long_recordings=1, with_faults=True)
    result = materialize_shard(instance, data_root, "s1", [raw_shards])
    sample = materialization(result, "raw_shards")["rejects_sample"].value
    rejects = data_root.read_parquet(layout.rejects("s1", "raw_shards")).to_pylist()
    assert rejects and len(rejects) <= REJECTS_SAMPLE_ROWS
    assert sample.splitlines()[0] == "| utt_id | reason | detail |"
    for reject in rejects:
        assert f"| {reject['reason']} |" in sample
    assert len(sample.splitlines()) == 2 + len(rejects)
    histogram = materialization(result, "raw_shards")["duration_s_histogram"].value
    assert histogram.startswith("| duration_s | count |")
    indexed = data_root.read_parquet(layout.utterance_index("s1")).num_rows
    assert sum(int(line.split("|")[2]) for line in histogram.splitlines()[2:12]) == indexed > 0


def test_rejects_sample_is_capped_and_says_how_many_it_leaves_out():
    from assets.reporting import rejects_sample
    from speechdata.accounting.rejects import Reject

    rejects = [Reject(f"u{i}", "raw_shards", "invalid_segment", f"start_s={i}") for i in range(30)]
    text = rejects_sample(rejects, limit=5).value
    assert text.count("invalid_segment") == 5 and "| u4 |" in text and "| u5 |" not in text
    assert "25 more not shown" in text
