"""Asset-check figures are plotted per partition, never as one series mixing partitions.

Dagster 1.13's UI charts a check's numeric metadata as one series over time across every partition
(the check's Plots have no partition axis), while an asset's plots have one. So each check of a
partitioned asset is partitioned like it (its evaluations name their partition), its numeric
figures go on that partition's materialization (``<check>.<key>``), and the check keeps them as text.
"""

import dagster as dg
import pytest

from assets.ingest import RAW_SHARDS_ACCOUNTED, raw_shards
from assets.partitions import country_partitions, shard_partitions
from assets.publishing import hf_split_assignments
from assets.reporting import check_figures, unplotted_check
from dagster_project.definitions import defs
from speechdata.testing.aligned_json import build_aligned_json_corpus
from speechdata.testing.shards import build_sample_shard
from tests.integration.test_publishing_assets import land
from tests.tiny_resources import tiny_resources_for

PLOTTED = (dg.IntMetadataValue, dg.FloatMetadataValue)
RANGE = {"dagster/asset_partition_range_start": "p0", "dagster/asset_partition_range_end": "p2"}


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def test_every_check_of_a_partitioned_asset_is_partitioned_like_the_asset():
    graph = defs.resolve_asset_graph()
    partitioned_checks = 0
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        for check_key in node.check_keys:
            spec = graph.get_check_spec(check_key)
            assert spec.partitions_def == node.partitions_def, (check_key, node.partitions_def, spec.partitions_def)
            partitioned_checks += node.partitions_def is not None
    assert partitioned_checks >= 10


def test_check_figures_move_to_the_materialization_and_stay_readable_on_the_check():
    check = dg.AssetCheckResult(
        check_name="accounted",
        passed=False,
        description="2 unaccounted",
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"landed": 5, "share": 0.4, "ok": True, "examples": dg.MetadataValue.json(["a", "b"])},
    )
    assert check_figures([check]) == {"accounted.landed": 5, "accounted.share": 0.4}
    shown = unplotted_check(check)
    assert (shown.passed, shown.description, shown.severity) == (False, "2 unaccounted", dg.AssetCheckSeverity.WARN)
    assert shown.metadata["landed"] == dg.MetadataValue.text("5") and shown.metadata["share"].value == "0.4"
    assert shown.metadata["ok"].value is True and shown.metadata["examples"].value == ["a", "b"]
    assert not any(isinstance(value, PLOTTED) for value in shown.metadata.values())


def test_a_shard_checks_figures_are_on_each_shards_materialization(instance, data_root):
    shards = ["p0", "p1", "p2"]
    landed = {
        s: build_sample_shard(data_root, s, n, seed=n, long_recordings=0).num_rows for s, n in zip(shards, (1, 2, 3))
    }
    instance.add_dynamic_partitions(shard_partitions.name, shards)
    result = dg.materialize([raw_shards], instance=instance, tags=RANGE, resources=tiny_resources_for(data_root.url))
    assert result.success

    evaluations = result.get_asset_check_evaluations()
    assert sorted(e.partition for e in evaluations) == shards
    for evaluation in evaluations:
        assert not any(isinstance(value, PLOTTED) for value in evaluation.metadata.values()), evaluation.metadata
        assert evaluation.metadata["landed"].value == str(landed[evaluation.partition])
    figures = {
        e.partition: e.metadata[f"{RAW_SHARDS_ACCOUNTED}.landed"].value
        for e in result.asset_materializations_for_node("raw_shards")
    }
    assert figures == landed and len(set(figures.values())) == 3


def test_a_country_checks_evaluation_names_its_country(tmp_path, instance, data_root, clips):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 2}, clips=clips, audio_format="flac")
    build_aligned_json_corpus(corpus, {"fr": 2}, clips=clips, audio_format="flac", seed=5)
    land(corpus, data_root, instance)
    instance.add_dynamic_partitions(country_partitions.name, ["de", "fr"])
    for country in ("de", "fr"):
        result = dg.materialize(
            [hf_split_assignments],
            partition_key=country,
            instance=instance,
            resources=tiny_resources_for(data_root.url),
        )
        assert result.success
        [evaluation] = result.get_asset_check_evaluations()
        assert evaluation.partition == country and evaluation.passed
        assert evaluation.metadata["leaking_segments"] == dg.MetadataValue.text("0")
        [materialization] = result.asset_materializations_for_node("hf_split_assignments")
        assert materialization.metadata["no_recording_in_two_splits.leaking_segments"].value == 0
