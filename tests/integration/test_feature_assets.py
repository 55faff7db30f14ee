"""qwen_hidden_states and wavlm_features materialized in process with the tiny models."""

import dagster as dg
import numpy as np
import pytest

from assets import SHARD_ASSETS
from speechdata.features.array_store import iter_arrays
from speechdata.io import layout
from speechdata.quality.decisions import excluded_utterances
from speechdata.testing.shards import build_sample_shard
from tests.materialize import materialize_shard


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def test_features_match_the_frame_grids_for_a_sample_shard(instance, data_root, tiny_resources):
    build_sample_shard(data_root, "s1", 6, seed=7, long_recordings=1)
    result = materialize_shard(instance, data_root, "s1", SHARD_ASSETS, resources=tiny_resources)
    assert result.success
    feature_checks = [
        e
        for e in result.get_asset_check_evaluations()
        if e.asset_key.path[0] in ("qwen_hidden_states", "wavlm_features")
    ]
    assert len(feature_checks) == 6 and all(e.passed for e in feature_checks)

    grids = {g["utt_id"]: g for g in data_root.read_parquet(layout.frame_grids("s1")).to_pylist()}
    qwen = dict(iter_arrays(data_root, layout.qwen_hidden_states("s1")))
    wavlm = dict(iter_arrays(data_root, layout.wavlm_features("s1")))
    # The bridge's quality decisions leave some sample utterances out (the sample reuses its clips, so
    # some are near-duplicates): each is a reject of both stages with its reason, never encoded.
    excluded = excluded_utterances(data_root, "s1", "bridge")
    assert set(qwen) == set(wavlm) == set(grids) - set(excluded) and qwen
    for stage in ("qwen_hidden_states", "wavlm_features"):
        rejects = data_root.read_parquet(layout.rejects("s1", stage)).to_pylist()
        assert {r["utt_id"]: r["reason"] for r in rejects} == {u: reason for u, (reason, _) in excluded.items()}
    for utt_id, grid in grids.items():
        if utt_id in excluded:
            continue
        assert qwen[utt_id].shape == (grid["n_tokens"], 64) and qwen[utt_id].dtype == np.float16
        assert wavlm[utt_id].shape == (grid["n_frames"], 64) and np.isfinite(wavlm[utt_id]).all()

    [event] = result.asset_materializations_for_node("wavlm_features")
    assert event.metadata["device"].value == "cpu"
    assert event.metadata["audio_seconds_per_second"].value > 0
    # A step's first shard has nothing read ahead: it waited for its own inputs.
    assert event.metadata["inputs_read_ahead"].value is False and event.metadata["input_wait_s"].value >= 0
