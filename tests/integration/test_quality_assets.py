"""The quality group materialized through Dagster with the tiny resources, and what reads it."""

import dagster as dg
import pytest

from assets.alignment import alignments, frame_grids
from assets.features import qwen_hidden_states
from assets.ingest import normalized_audio, raw_shards
from assets.quality import quality_decisions, quality_signals
from speechdata.alignment.greedy import greedy_hypotheses_path
from speechdata.features.array_store import iter_arrays
from speechdata.features.stage import QWEN_STAGE
from speechdata.io import layout
from speechdata.quality.paths import quality_decisions as decisions_path
from speechdata.quality.paths import quality_signals as signals_path
from speechdata.quality.policy import default_policies, policies_digest
from speechdata.testing.shards import build_sample_shard
from tests.materialize import materialize_shard

UPSTREAM = [raw_shards, normalized_audio, alignments, frame_grids]


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def _data_version(instance, asset: str, partition: str) -> str:
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=1
    ).records[0]
    return record.asset_materialization.tags["dagster/data_version"]


def test_a_policy_change_re_decides_and_the_encoder_skips_what_it_rejects(instance, data_root, tiny_resources):
    build_sample_shard(data_root, "s1", 4, seed=5, long_recordings=0, formats=("flac",))
    result = materialize_shard(
        instance, data_root, "s1", [*UPSTREAM, quality_signals, quality_decisions], resources=tiny_resources
    )
    assert result.success

    [signals_event] = result.asset_materializations_for_node("quality_signals")
    assert "| Hz | count |" in signals_event.metadata["histogram/bandwidth_hz"].value
    assert "| share | count |" in signals_event.metadata["histogram/speech_share"].value
    signals = data_root.read_parquet(signals_path("s1")).to_pylist()
    hypotheses = data_root.read_parquet(greedy_hypotheses_path("s1")).to_pylist()
    # The aligner's greedy transcripts: one per utterance it computed log-probs for (not those it
    # rejected before the forward pass, e.g. a language with no tiny model).
    assert len(signals) == 4 and 0 < len(hypotheses) <= 4
    assert {r["utt_id"] for r in signals if r["cer"] is not None} == {r["utt_id"] for r in hypotheses}
    assert all(row["mos"] is not None and row["audio_language"] for row in signals)  # computed in tiny too

    tiny_digest = policies_digest(default_policies("tiny"))
    assert _data_version(instance, "quality_decisions", "s1") == tiny_digest
    assert all(row["reason"] is None for row in data_root.read_parquet(decisions_path("s1")).to_pylist())

    # Demand more speech than any utterance holds: every bridge utterance is now rejected as no_speech.
    strict = {"ops": {"quality_decisions": {"config": {"bridge": {"thresholds": {"min_speech_share": 0.99}}}}}}
    result = dg.materialize(
        [quality_decisions, qwen_hidden_states],
        partition_key="s1",
        instance=instance,
        resources=tiny_resources,
        run_config=strict,
        selection=[quality_decisions, qwen_hidden_states],
    )
    assert result.success
    assert _data_version(instance, "quality_decisions", "s1") != tiny_digest
    rejects = data_root.read_parquet(layout.rejects("s1", QWEN_STAGE)).to_pylist()
    gridded = data_root.read_parquet(layout.frame_grids("s1"), columns=["utt_id"])["utt_id"].to_pylist()
    assert gridded and sorted(r["utt_id"] for r in rejects) == sorted(gridded)
    assert {r["reason"] for r in rejects} == {"no_speech"}
    assert dict(iter_arrays(data_root, layout.qwen_hidden_states("s1"))) == {}
