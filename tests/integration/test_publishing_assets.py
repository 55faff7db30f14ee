"""The publishing assets on seed-004 corpora: datasets load with the real reader, rows match the
source JSON, assignments stay put as data arrives, train subsets keep to their budget, and the sensor
asks for the countries whose shards changed."""

import io
import json
import tracemalloc
from pathlib import Path

import dagster as dg
import datasets
import pytest
import soundfile as sf

from assets.ingest import raw_shards
from assets.partitions import country_partitions, shard_partitions
from assets.publishing import hf_dataset, hf_split_assignments
from resources.hub import HfDatasetSettings, HubPublisherResource
from resources.storage import DataRootResource
from speechdata.hf.assignment import refresh_split_assignments
from speechdata.hf.dataset import DatasetOptions, build_country_dataset
from speechdata.hf.segments import SegmentLimits
from speechdata.hf.splits import SplitTargets
from speechdata.hf.state import rows_as_dicts, state_connection
from speechdata.importers.aligned_json import import_aligned_countries
from speechdata.io import layout
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.aligned_json import build_aligned_json_corpus
from tests.tiny_resources import tiny_resources_for

MAX_CER = 0.1


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def land(corpus_dir, data_root, instance=None, countries=None) -> list[str]:
    shards = [s for r in import_aligned_countries(str(corpus_dir), data_root, countries) for s in r.shards]
    if instance is not None:
        instance.add_dynamic_partitions(shard_partitions.name, shards)
        for shard in shards:
            assert dg.materialize(
                [raw_shards],
                partition_key=shard,
                instance=instance,
                resources=tiny_resources_for(data_root.url),
            ).success
    else:
        for shard in shards:
            run_raw_shards(data_root, shard)
    return shards


def publish(instance, data_root, country, **settings):
    instance.add_dynamic_partitions(country_partitions.name, [country])
    result = dg.materialize(
        [hf_split_assignments, hf_dataset],
        partition_key=country,
        instance=instance,
        resources=tiny_resources_for(data_root.url, hf_dataset_settings=HfDatasetSettings(max_cer=MAX_CER, **settings)),
    )
    assert result.success
    return {
        event.asset_key.path[-1]: event.event_specific_data.materialization.metadata
        for event in result.get_asset_materialization_events()
    }


def source_segments(corpus_dir, country) -> dict[str, dict]:
    found = {}
    for path in (corpus_dir / country / "Alignment/alignment_output").glob("*_aligned.json"):
        video_id, transcript_id = path.name[: -len("_aligned.json")].rsplit("_", 1)
        for seg in json.loads(path.read_text())["segments"]:
            key = f"{country}_{video_id}_{round(seg['start'] * 1000)}_{round(seg['end'] * 1000)}"
            found[key] = {**seg, "video_id": video_id, "transcript_id": transcript_id}
    return found


def expected_reason(seg) -> str | None:
    duration = seg["end"] - seg["start"]
    if duration < 3.0:
        return "too_short"
    if duration > 20.0:
        return "too_long"
    return "cer_above_max" if seg["cer"] > MAX_CER else None


def state_rows(data_root, country, sql):
    with state_connection(data_root, layout.hf_state_database("speech-segments", country)) as db:
        return rows_as_dicts(db, sql)


def test_two_countries_load_with_datasets_and_every_row_matches_its_source_json(tmp_path, data_root, clips, instance):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 3}, clips=clips, audio_format="opus")
    build_aligned_json_corpus(corpus, {"fr": 3}, clips=clips, audio_format="flac", seed=5)
    land(corpus, data_root, instance)
    metadata = publish(instance, data_root, "de")
    publish(instance, data_root, "fr")
    assert metadata["hf_split_assignments"]["dagster/row_count"].value == 3

    dataset_dir = data_root.path(layout.hf_dataset_dir("speech-segments"))
    reasons = set()
    for country, rate in (("de", 48_000), ("fr", 16_000)):
        loaded = datasets.load_dataset(dataset_dir, country)
        assert set(loaded) == {"test", "validation", "train_1"}
        source = source_segments(corpus, country)
        kept = {k for k, seg in source.items() if expected_reason(seg) is None}
        seen = set()
        for split in loaded.values():
            for row in split.cast_column("audio", datasets.Audio(decode=False)):
                seg = source[row["key"]]
                seen.add(row["key"])
                samples, sample_rate = sf.read(io.BytesIO(row["audio"]["bytes"]))
                assert sample_rate == rate and samples.ndim == 1
                assert samples.shape[0] / rate == pytest.approx(seg["end"] - seg["start"], abs=2 / rate)
                assert (row["human_transcript"], row["asr_transcript"]) == (seg["human_text"], seg["asr_text"])
                assert (row["video_id"], row["transcript_id"], row["country"]) == (
                    seg["video_id"],
                    seg["transcript_id"],
                    country,
                )
                assert row["cer"] == pytest.approx(seg["cer"], abs=1e-6)
                assert (row["start_seconds"], row["end_seconds"]) == pytest.approx((seg["start"], seg["end"]), abs=1e-3)
                assert (row["original_transcript_start_idx"], row["original_transcript_end_idx"]) == (
                    seg["start_idx"],
                    seg["end_idx"],
                )
                assert 0.0 <= row["wer"] <= 1.0
        assert seen == kept
        recorded = {
            r["key"]: r["reason"]
            for r in state_rows(data_root, country, "SELECT key, reason FROM segments WHERE status = 'filtered'")
        }
        assert recorded == {k: expected_reason(s) for k, s in source.items() if k not in kept}
        reasons |= set(recorded.values())
    assert reasons == {"too_short", "cer_above_max"}
    card = data_root.path(layout.hf_dataset_file("speech-segments", "README.md"))
    card_text = Path(card).read_text()
    assert "config_name: fr" in card_text and "config_name: de" in card_text


def test_new_recordings_never_move_old_ones_and_published_train_files_stay_byte_identical(
    tmp_path, data_root, clips, instance
):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 3}, clips=clips, audio_format="flac")
    land(corpus, data_root, instance)
    publish(instance, data_root, "de")
    before = {r["recording_id"]: r["split"] for r in state_rows(data_root, "de", "SELECT * FROM recordings")}
    train_1 = {
        r["path_in_repo"]: r["sha256"]
        for r in state_rows(data_root, "de", "SELECT * FROM files WHERE split = 'train_1'")
    }

    build_aligned_json_corpus(corpus, {"de": 3}, clips=clips, audio_format="flac", first_recording=10)
    land(corpus, data_root, instance)
    metadata = publish(instance, data_root, "de")
    after = {r["recording_id"]: r for r in state_rows(data_root, "de", "SELECT * FROM recordings")}
    assert {r: after[r]["split"] for r in before} == before
    assert len(after) == 6
    files = {r["path_in_repo"]: r for r in state_rows(data_root, "de", "SELECT * FROM files")}
    assert {p: files[p]["sha256"] for p in train_1} == train_1
    # The new shard's recordings fill the open subset with a part of their own: train_1 gains files.
    new_train = {r for r, row in after.items() if r not in before and row["split"] == "train"}
    assert new_train and {after[r]["subset_id"] for r in new_train} == {1}
    assert "train_1" in metadata["hf_dataset"]["splits_written"].value
    assert len([p for p in files if p.startswith("de/train_1-")]) > len(train_1)


def traced_build(data_root, country, options) -> tuple:
    refresh_split_assignments(
        data_root, options.dataset, country, SegmentLimits(), SplitTargets(test=0.0, validation=0.0)
    )
    tracemalloc.start()
    try:
        summary = build_country_dataset(data_root, country, options)
        return summary, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_train_subsets_keep_to_the_size_budget_and_memory_does_not_grow_with_the_country(tmp_path, data_root, clips):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"fr": 3}, clips=clips, audio_format="flac", segments_per_recording=5)
    build_aligned_json_corpus(corpus, {"de": 12}, clips=clips, audio_format="flac", segments_per_recording=5)
    land(corpus, data_root)
    budget_gb = 0.0015
    options = DatasetOptions(dataset="ds", max_split_size_gb=budget_gb, max_file_mb=0.5)
    small, small_peak = traced_build(data_root, "fr", options)
    summary, peak = traced_build(data_root, "de", options)
    subsets = [s for s in summary.written if s.split.startswith("train_")]
    total_bytes = sum(s.bytes for s in subsets)
    assert len(subsets) >= 3 and total_bytes >= 3 * budget_gb * 1e9
    with state_connection(data_root, layout.hf_state_database("ds", "de")) as db:
        recordings_per_subset = dict(
            db.execute("SELECT subset_id, count(*) FROM recordings GROUP BY subset_id").fetchall()
        )
    for subset in subsets:
        subset_id = int(subset.split.split("_")[1])
        assert subset.bytes <= budget_gb * 1e9 or recordings_per_subset[subset_id] == 1
        # Files roll over before a recording would push them past max_file_mb (one recording = at most 5 rows).
        assert all(f["bytes"] <= 0.5e6 * 1.05 or f["rows"] <= 5 for f in subset.files) and subset.files
    # Memory holds one recording's segments, not the split: four times the data, the same peak.
    assert total_bytes > 3 * sum(s.bytes for s in small.written)
    assert peak < 1.25 * small_peak
    assert summary.max_recording_buffer_bytes < budget_gb * 1e9


@pytest.fixture
def settled(monkeypatch):
    """Shard events count as a settled batch at once (the sensor waits 60 s by default)."""
    monkeypatch.setenv("SPEECHDATA_PUBLISHING_SETTLE_S", "0")


def test_country_dataset_sensor_requests_the_countries_of_newly_indexed_shards(
    tmp_path, data_root, clips, instance, settled
):
    from sensors.publishing import HF_DATASET_JOB_NAME, HF_PUBLISH_JOB_NAME, country_dataset_sensor

    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 1, "fr": 1}, clips=clips, audio_format="flac")
    land(corpus, data_root, instance, ["de"])

    def tick(cursor=None, repo_id=""):
        context = dg.build_sensor_context(
            instance=instance,
            cursor=cursor,
            resources={"data_root": DataRootResource(url=data_root.url), "hub": HubPublisherResource(repo_id=repo_id)},
        )
        return country_dataset_sensor(context)

    first = tick()
    assert [(r.partition_key, r.job_name) for r in first.run_requests] == [("de", HF_DATASET_JOB_NAME)]
    assert first.run_requests[0].tags["speechdata/hf_country"] == "de"
    assert isinstance(tick(first.cursor), dg.SkipReason)
    publish(instance, data_root, "de")  # the run the first tick requested
    land(corpus, data_root, instance, ["fr"])
    second = tick(first.cursor, repo_id="org/ds")
    assert [(r.partition_key, r.job_name) for r in second.run_requests] == [("fr", HF_PUBLISH_JOB_NAME)]


def test_country_dataset_sensor_does_not_queue_a_second_run_for_a_waiting_country(
    tmp_path, data_root, clips, instance, settled
):
    from dagster_project.definitions import defs
    from sensors.publishing import country_dataset_sensor

    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 1}, clips=clips, audio_format="flac")
    land(corpus, data_root, instance)
    context = dg.build_sensor_context(
        instance=instance, resources={"data_root": DataRootResource(url=data_root.url), "hub": HubPublisherResource()}
    )
    [request] = country_dataset_sensor(context).run_requests
    assert request.tags["dagster/priority"] == "-1"
    instance.create_run_for_job(
        defs.resolve_job_def("hf_dataset_job"),
        tags=request.tags,
        status=dg.DagsterRunStatus.NOT_STARTED,
    )
    build_aligned_json_corpus(corpus, {"de": 1}, clips=clips, audio_format="flac", first_recording=5)
    land(corpus, data_root, instance)
    later = country_dataset_sensor(
        dg.build_sensor_context(
            instance=instance,
            resources={"data_root": DataRootResource(url=data_root.url), "hub": HubPublisherResource()},
        )
    )
    assert later.run_requests == []


def test_a_rebuilt_split_loads_its_new_rows_through_the_default_datasets_cache(tmp_path, data_root, clips, instance):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 3}, clips=clips, audio_format="flac")
    land(corpus, data_root, instance)
    shares = {"test_share": 0.3, "validation_share": 0.3}
    publish(instance, data_root, "de", **shares)
    dataset_dir = data_root.path(layout.hf_dataset_dir("speech-segments"))
    before = {split: ds.num_rows for split, ds in datasets.load_dataset(dataset_dir, "de").items()}

    # New recordings, most of them held out: test and validation are rewritten in place.
    build_aligned_json_corpus(corpus, {"de": 3}, clips=clips, audio_format="flac", first_recording=10)
    land(corpus, data_root, instance)
    metadata = publish(instance, data_root, "de", **shares)
    assert {"test", "validation"} & set(metadata["hf_dataset"]["splits_written"].value)
    on_disk = {}
    for r in state_rows(data_root, "de", "SELECT * FROM files WHERE status <> 'deleted' AND split IS NOT NULL"):
        on_disk[r["split"]] = on_disk.get(r["split"], 0) + r["rows"]
    after = {split: ds.num_rows for split, ds in datasets.load_dataset(dataset_dir, "de").items()}
    assert after == on_disk
    assert (after["test"], after["validation"]) != (before["test"], before["validation"])
    card = Path(data_root.path(layout.hf_dataset_file("speech-segments", "README.md"))).read_text()
    assert "license: other" in card and "size_categories:" in card and "dataset_info:" in card
    assert "sampling_rate: 16000" in card and "num_examples:" in card
    # datasets' own Audio decoding (torchcodec on FFmpeg's libraries, installed by make setup).
    row = datasets.load_dataset(dataset_dir, "de")["test"][0]
    decoded = row["audio"].get_all_samples()
    assert decoded.sample_rate == 16_000
    assert decoded.data.shape[-1] / decoded.sample_rate == pytest.approx(row["duration_seconds"], abs=0.01)


def test_country_refresh_is_one_run_per_country_per_settled_batch(tmp_path, data_root, clips, instance, monkeypatch):
    from dagster_project.definitions import defs
    from sensors.publishing import country_dataset_sensor

    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 1, "fr": 1}, clips=clips, audio_format="flac")
    shards = land(corpus, data_root, instance)
    build_aligned_json_corpus(corpus, {"de": 1, "fr": 1}, clips=clips, audio_format="flac", first_recording=4)
    shards += land(corpus, data_root, instance)
    assert len(shards) == 4  # four shards, two countries
    # One shard's ingest run again: five events of four shards.
    assert dg.materialize(
        [raw_shards], partition_key=shards[0], instance=instance, resources=tiny_resources_for(data_root.url)
    ).success

    def tick(cursor=None):
        return country_dataset_sensor(
            dg.build_sensor_context(
                instance=instance,
                cursor=cursor,
                resources={"data_root": DataRootResource(url=data_root.url), "hub": HubPublisherResource()},
            )
        )

    monkeypatch.setenv("SPEECHDATA_PUBLISHING_SETTLE_S", "3600")  # the batch is still arriving
    waiting = tick()
    assert isinstance(waiting, dg.SkipReason) and "settling" in str(waiting.skip_message)
    assert str(waiting.skip_message).startswith("4 shard(s) indexed"), waiting.skip_message  # shards, not events
    monkeypatch.setenv("SPEECHDATA_PUBLISHING_SETTLE_S", "0")
    # A shard run still queued means more of the batch is coming.
    queued = instance.create_run_for_job(defs.resolve_job_def("per_shard_job"), status=dg.DagsterRunStatus.NOT_STARTED)
    assert isinstance(tick(), dg.SkipReason)
    instance.delete_run(queued.run_id)
    settled = tick()
    assert sorted(r.partition_key for r in settled.run_requests) == ["de", "fr"]
    assert isinstance(tick(settled.cursor), dg.SkipReason)
    for country in ("de", "fr"):  # the runs the settled tick requested
        publish(instance, data_root, country)
    monkeypatch.setenv("SPEECHDATA_PUBLISHING_SETTLE_S", "3600")
    monkeypatch.setenv("SPEECHDATA_PUBLISHING_MAX_WAIT_S", "0")  # a stream that never settles still refreshes
    build_aligned_json_corpus(corpus, {"de": 1}, clips=clips, audio_format="flac", first_recording=7)
    land(corpus, data_root, instance)
    assert [r.partition_key for r in tick(settled.cursor).run_requests] == ["de"]
