"""The HF dataset publishes no near duplicate: a later shard's re-encoded copy of an earlier shard's
utterance is filtered ``near_duplicate`` in the country's state, absent from the dataset, a reject
of the ``hf`` ledger, and a change of the country's input fingerprint."""

import dagster as dg
import numpy as np
import pytest

from assets.near_duplicates import near_duplicates
from assets.publishing import INPUT_FINGERPRINT, hf_split_assignments
from resources.hub import HubPublisherResource
from resources.storage import DataRootResource
from speechdata.accounting.ledgers import shard_ledgers
from speechdata.hf.segments import country_input_fingerprints
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.landing.mark import mark_landed
from speechdata.quality.near_dup_planted import transformed
from speechdata.quality.near_duplicates import run_near_duplicates
from tests.conftest import land_shard
from tests.integration.test_attacks_publishing import (
    index_shard,
    loaded_rows,
    publish,
    with_aligned_transcripts,
)
from tests.integration.test_hf_product_accounting import hf_accounting, hf_rejects_by_reason, segment_statuses
from tests.integration.test_near_duplicates_assets import encoded, voice
from tests.tiny_resources import tiny_resources_for


@pytest.fixture
def instance(monkeypatch):
    monkeypatch.setenv("SPEECHDATA_PUBLISHING_SETTLE_S", "0")
    with dg.instance_for_test() as instance:
        yield instance


def land_country_shard(data_root, shard_id: str, utterances: dict[str, tuple[bytes, str, str]]) -> None:
    """``utterances``: ``{utt_id: (file bytes, extension, text)}``, landed for country ``de`` with
    aligned transcripts (so the shard feeds the HF dataset), then indexed and normalized."""
    rows, files = [], {}
    for utt_id, (data, extension, text) in utterances.items():
        files[f"{utt_id}.{extension}"] = data
        rows.append(
            with_aligned_transcripts(
                {
                    "utt_id": utt_id,
                    "audio_path": f"{utt_id}.{extension}",
                    "text": text,
                    "language": "de",
                    "country": "de",
                }
            )
        )
    land_shard(data_root, shard_id, rows, files)
    mark_landed(data_root, shard_id)
    run_raw_shards(data_root, shard_id)
    run_normalized_audio(data_root, shard_id, workers=1)


def land_first_and_its_copy(data_root) -> None:
    """Shard ``first`` (two utterances), then ``second``: an MP3 of first-0, gain changed, and one of its own."""
    originals = [voice(n, seconds=4.0) for n in range(3)]
    land_country_shard(
        data_root,
        "first",
        {
            "first-0": (encoded(originals[0]), "wav", "first said one thing in this shard"),
            "first-1": (encoded(originals[1]), "flac", "first said another thing entirely"),
        },
    )
    copy = transformed(np.random.default_rng(3), originals[0], "gain")
    land_country_shard(
        data_root,
        "second",
        {
            "second-0-copy": (encoded(copy, "MP3", "MPEG_LAYER_III"), "mp3", "second has its own words here"),
            "second-1-own": (encoded(originals[2]), "wav", "second says something nobody said"),
        },
    )


def test_a_later_shards_reencoded_copy_is_filtered_near_duplicate_and_never_published(data_root, instance):
    land_first_and_its_copy(data_root)
    run_near_duplicates(data_root, "first")
    before_decisions = country_input_fingerprints(data_root)["de"]
    run_near_duplicates(data_root, "second")
    after_decisions = country_input_fingerprints(data_root)["de"]
    assert after_decisions != before_decisions  # the sensor asks for the country again

    assert publish(instance, data_root, "de").success

    statuses = {(shard, key): (status, reason) for shard, key, status, reason in segment_statuses(data_root, "de")}
    assert statuses[("second", "second-0-copy")] == ("filtered", "near_duplicate")
    assert {segment: status for segment, (status, _) in statuses.items() if segment[1] != "second-0-copy"} == {
        ("first", "first-0"): "pending",
        ("first", "first-1"): "pending",
        ("second", "second-1-own"): "pending",
    }
    published = sorted((row["shard_id"], row["key"]) for row in loaded_rows(data_root, "de"))
    assert published == [("first", "first-0"), ("first", "first-1"), ("second", "second-1-own")]

    for shard_id in ("first", "second"):
        assert shard_ledgers(data_root, shard_id)["hf"].balanced, shard_id
    assert hf_accounting(data_root) == {"first": (2, 2, 0, True), "second": (2, 1, 1, True)}
    assert hf_rejects_by_reason(data_root) == {"near_duplicate": 1}

    latest = instance.fetch_materializations(hf_split_assignments.key, limit=1).records[0]
    assert latest.asset_materialization.metadata[INPUT_FINGERPRINT].value == after_decisions


def test_the_split_assignment_waits_for_every_shards_near_duplicates_not_for_the_quality_decisions():
    deps = {dep.asset_key: dep for dep in next(iter(hf_split_assignments.specs)).deps}
    assert near_duplicates.key in deps
    assert isinstance(deps[near_duplicates.key].partition_mapping, dg.AllPartitionMapping)
    assert dg.AssetKey("quality_decisions") not in deps


def requested_countries(instance, cursor, data_root) -> tuple[list[str], str | None]:
    """The countries one sensor tick asks for, and its cursor (the one given when it skips)."""
    from sensors.publishing import country_dataset_sensor

    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"hub": HubPublisherResource(), "data_root": DataRootResource(url=data_root.url)},
    )
    result = country_dataset_sensor(context)
    if isinstance(result, dg.SkipReason):
        return [], cursor
    return sorted(r.partition_key for r in result.run_requests), result.cursor


def test_the_sensor_asks_for_the_country_again_once_a_shards_near_duplicates_are_decided(data_root, instance):
    land_first_and_its_copy(data_root)
    for shard_id in ("first", "second"):
        index_shard(instance, data_root, shard_id)
    countries, cursor = requested_countries(instance, None, data_root)
    assert countries == ["de"]
    assert publish(instance, data_root, "de").success
    assert requested_countries(instance, cursor, data_root)[0] == []

    for shard_id in ("first", "second"):  # no shard indexed since: only the near-duplicate decisions are new
        assert dg.materialize(
            [near_duplicates], partition_key=shard_id, instance=instance, resources=tiny_resources_for(data_root.url)
        ).success
    assert requested_countries(instance, cursor, data_root)[0] == ["de"]


def test_a_copy_published_before_its_near_duplicates_were_decided_is_taken_out_at_the_next_build(data_root, instance):
    land_first_and_its_copy(data_root)
    run_near_duplicates(data_root, "first")
    assert publish(instance, data_root, "de").success  # second's decisions not written yet: all four published
    assert ("second", "second-0-copy") in {(row["shard_id"], row["key"]) for row in loaded_rows(data_root, "de")}

    run_near_duplicates(data_root, "second")
    assert publish(instance, data_root, "de").success

    published = sorted((row["shard_id"], row["key"]) for row in loaded_rows(data_root, "de"))
    assert published == [("first", "first-0"), ("first", "first-1"), ("second", "second-1-own")]
    statuses = {(shard, key): (status, reason) for shard, key, status, reason in segment_statuses(data_root, "de")}
    assert statuses[("second", "second-0-copy")] == ("filtered", "near_duplicate")
    assert hf_accounting(data_root) == {"first": (2, 2, 0, True), "second": (2, 1, 1, True)}
    third = publish(instance, data_root, "de")
    assert third.success
    [build] = third.asset_materializations_for_node("hf_dataset")
    assert build.metadata["rewritten_for_withdrawal"].value == []  # nothing left to take out
    assert sorted((row["shard_id"], row["key"]) for row in loaded_rows(data_root, "de")) == published
