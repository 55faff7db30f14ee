"""The catalog's materialization shows quality per language: a histogram of each main signal for
every landed language, and the hours each product's quality filter lost per reason and language."""

import dagster as dg
import pytest

from assets.alignment import alignments, frame_grids
from assets.catalog import HOURS_LOST, manifest_catalog
from assets.ingest import normalized_audio, raw_shards
from assets.quality import quality_decisions, quality_signals
from speechdata.catalog.quality import SIGNAL_UNITS
from speechdata.quality.paths import quality_signals as signals_path
from speechdata.testing.shards import build_sample_shard, load_clips
from tests.materialize import materialize_shard

# Demand more speech than any utterance holds: every bridge utterance is lost as no_speech.
STRICT_BRIDGE = {"ops": {"quality_decisions": {"config": {"bridge": {"thresholds": {"min_speech_share": 0.99}}}}}}


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def test_the_catalog_shows_a_histogram_per_language_and_signal_and_the_hours_lost_per_reason(
    instance, data_root, tiny_resources
):
    clips = load_clips()
    for shard_id, language in (("english", "en"), ("german", "de")):
        build_sample_shard(
            data_root,
            shard_id,
            2,  # two values per histogram, two utterances lost per language
            seed=7,
            long_recordings=0,
            formats=("flac",),
            clips=[c for c in clips if c.language == language],
        )
        assert materialize_shard(
            instance,
            data_root,
            shard_id,
            [raw_shards, normalized_audio, alignments, frame_grids, quality_signals, quality_decisions],
            resources=tiny_resources,
            run_config=STRICT_BRIDGE,
        ).success

    result = dg.materialize([manifest_catalog], instance=instance, resources=tiny_resources)
    assert result.success
    [event] = result.asset_materializations_for_node("manifest_catalog")
    metadata = event.metadata

    histograms = {key for key in metadata if key.startswith("quality_histogram/")}
    assert histograms == {f"quality_histogram/{lang}/{signal}" for lang in ("de", "en") for signal in SIGNAL_UNITS}
    for language, shard_id in (("en", "english"), ("de", "german")):
        measured = data_root.read_parquet(signals_path(shard_id)).to_pylist()
        bandwidth = metadata[f"quality_histogram/{language}/bandwidth_hz"].value
        assert bandwidth.startswith("| Hz | count |")
        assert f"\n\n{len(measured)} values, min " in bandwidth
        assert metadata[f"quality_histogram/{language}/speech_share"].value.startswith("| share | count |")

    lost = metadata[HOURS_LOST].value
    assert lost.splitlines()[0] == "| product | reason | language | utterances | hours |"
    assert "| bridge | no_speech | en | 2 |" in lost
    assert "| bridge | no_speech | de | 2 |" in lost

    # The per-shard accounting: counted per state by DuckDB, its first rows shown with the total.
    from speechdata import products

    total = 2 * len(products.product_lines())  # a row per landed shard and product line
    assert metadata["ledgers_not_built"].value > 0  # no shard got past quality_decisions
    assert metadata["unbalanced_ledgers"].value + metadata["ledgers_not_built"].value <= total
    assert metadata["shard_accounting"].value.rstrip("`\n").endswith(f"({total} rows)")
