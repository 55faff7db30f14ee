"""Asset-check figures are plotted per partition, never as one series mixing partitions.

Dagster 1.13's UI charts a check's numeric metadata as one series over time across every partition
(the check's Plots have no partition axis), while an asset's plots have one. So each check of a
partitioned asset is partitioned like it (its evaluations name their partition), its numbers are
text (shown, never charted), and the figures to chart per partition are the materialization's.
"""

import dagster as dg
import pytest

from assets.ingest import RAW_SHARDS_ACCOUNTED, raw_shards
from assets.partitions import country_partitions, shard_partitions
from assets.publishing import hf_split_assignments
from assets.reporting import unplotted_check
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


def test_a_checks_numbers_stay_readable_on_the_check_but_are_never_charted():
    check = dg.AssetCheckResult(
        check_name="accounted",
        passed=False,
        description="2 unaccounted",
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"landed": 5, "share": 0.4, "ok": True, "examples": dg.MetadataValue.json(["a", "b"])},
    )
    shown = unplotted_check(check)
    assert (shown.passed, shown.description, shown.severity) == (False, "2 unaccounted", dg.AssetCheckSeverity.WARN)
    assert shown.metadata["landed"] == dg.MetadataValue.text("5") and shown.metadata["share"].value == "0.4"
    assert shown.metadata["ok"].value is True and shown.metadata["examples"].value == ["a", "b"]
    assert not any(isinstance(value, PLOTTED) for value in shown.metadata.values())


def test_each_shards_check_evaluation_names_its_shard_and_its_figures_are_plotted_on_the_asset(instance, data_root):
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
    # The same count, plottable per shard on the asset (Partitions axis).
    figures = {e.partition: e.metadata["utterances_in"] for e in result.asset_materializations_for_node("raw_shards")}
    assert figures == {s: dg.MetadataValue.int(n) for s, n in landed.items()} and len(set(landed.values())) == 3
    assert {e.check_name for e in evaluations} == {RAW_SHARDS_ACCOUNTED}


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
        assert materialization.metadata["leaking_segments"] == dg.MetadataValue.int(0)
