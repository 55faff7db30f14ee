"""Attacks on "what is published is what the ledger says": shards that reuse utterance ids, shards
re-landed smaller into another country, and ledgers that do not balance."""

import io

import dagster as dg
import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import soundfile as sf

from assets.ingest import raw_shards
from assets.partitions import country_partitions, shard_partitions
from assets.publishing import hf_dataset, hf_split_assignments
from resources.hub import HubPublisherResource
from resources.storage import DataRootResource
from speechdata.asr.stage import read_published_build
from speechdata.hf.accounting import published_utterances
from speechdata.hf.assignment import refresh_split_assignments
from speechdata.hf.card import write_dataset_card
from speechdata.hf.dataset import DatasetOptions, build_country_dataset
from speechdata.hf.state import rows_as_dicts, state_connection
from speechdata.io import layout
from speechdata.landing.ingest import run_raw_shards
from speechdata.landing.mark import mark_landed
from tests.conftest import encode, land_shard, tone
from tests.materialize import materialize_shard
from tests.tiny_resources import tiny_resources_for

DATASET = "speech-segments"


def with_aligned_transcripts(row: dict) -> dict:
    """The row with the fields that make a shard one meant for the HF dataset (an ASR transcript, its CER...)."""
    return {
        **row,
        "human_text": row["text"],
        "asr_text": row["text"],
        "cer": 0.0,
        "transcript_id": "t0",
        "transcript_start_idx": 0,
        "transcript_end_idx": len(row["text"]),
    }


def granary_rows(shard_id: str, country: str, n: int, skip=(), prefix="utt") -> tuple[list[dict], dict]:
    """Rows named like the Granary importer's (``utt_000000``...: the same ids in every shard), 4 s each,
    with aligned transcripts so that the shard feeds the HF dataset."""
    rows, files = [], {}
    for i in range(n):
        if i in skip:
            continue
        utt_id = f"{prefix}_{i:06d}"
        rows.append(
            with_aligned_transcripts(
                {
                    "utt_id": utt_id,
                    "audio_path": f"{utt_id}.wav",
                    "text": f"{shard_id} sentence {i}",
                    "language": "de",
                    "country": country,
                }
            )
        )
        files[f"{utt_id}.wav"] = encode(tone(4.0, 16_000, freq=200.0 + 40 * i), 16_000)
    return rows, files


def land_granary_shard(data_root, shard_id, country, n, skip=(), prefix="utt"):
    rows, files = granary_rows(shard_id, country, n, skip, prefix)
    land_shard(data_root, shard_id, rows, files)
    mark_landed(data_root, shard_id)


def refresh_and_build(data_root, country):
    refresh_split_assignments(data_root, DATASET, country)
    summary = build_country_dataset(data_root, country, DatasetOptions(dataset=DATASET))
    write_dataset_card(data_root, DATASET)
    return summary


def loaded_rows(data_root, country) -> list[dict]:
    """Every row (without its audio) that the real `datasets` loader reads from the country's config."""
    loaded = datasets.load_dataset(data_root.path(layout.hf_dataset_dir(DATASET)), country)
    return [row for split in loaded.values() for row in split.remove_columns("audio")]


def published_rows(data_root, country) -> list[tuple[str, str, str]]:
    """``(shard, key, human_transcript)`` per published row; each test transcript names its shard."""
    return sorted(
        (row["human_transcript"].split()[0], row["key"], row["human_transcript"])
        for row in loaded_rows(data_root, country)
    )


def state_rows(data_root, country, sql):
    with state_connection(data_root, layout.hf_state_database(DATASET, country)) as db:
        return rows_as_dicts(db, sql)


def expected(shard_id, n, skip=(), prefix="utt"):
    return [(shard_id, f"{prefix}_{i:06d}", f"{shard_id} sentence {i}") for i in range(n) if i not in skip]


def test_two_shards_reusing_utterance_ids_publish_every_row_when_built_one_after_the_other(data_root):
    land_granary_shard(data_root, "granary-a", "de", 3)
    run_raw_shards(data_root, "granary-a")
    refresh_and_build(data_root, "de")
    land_granary_shard(data_root, "granary-b", "de", 3)
    run_raw_shards(data_root, "granary-b")
    refresh_and_build(data_root, "de")

    assert published_rows(data_root, "de") == expected("granary-a", 3) + expected("granary-b", 3)
    assert sorted((row["shard_id"], row["key"]) for row in loaded_rows(data_root, "de")) == [
        (shard, f"utt_{i:06d}") for shard in ("granary-a", "granary-b") for i in range(3)
    ]
    keyed = state_rows(data_root, "de", "SELECT shard_id, key, status FROM segments ORDER BY shard_id, key")
    assert [(r["shard_id"], r["key"]) for r in keyed] == [
        (shard, f"utt_{i:06d}") for shard in ("granary-a", "granary-b") for i in range(3)
    ]
    assert {r["status"] for r in keyed} == {"pending"}


def test_two_shards_reusing_utterance_ids_landed_together_publish_every_row(data_root):
    for shard_id in ("granary-a", "granary-b"):
        land_granary_shard(data_root, shard_id, "de", 3)
        run_raw_shards(data_root, shard_id)
    refresh_and_build(data_root, "de")
    assert published_rows(data_root, "de") == expected("granary-a", 3) + expected("granary-b", 3)


def dominant_hz(flac_bytes: bytes) -> float:
    samples, rate = sf.read(io.BytesIO(flac_bytes))
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(samples.shape[0], 1 / rate)[np.argmax(spectrum)])


def test_each_segment_is_cut_from_its_own_shard_when_two_shards_share_a_recording_id(data_root):
    """Seed-004 rows name their recording by ``video_id``; two shards holding one keep their own audio."""
    for shard_id, prefix, freq in (("video-a", "a", 300.0), ("video-b", "b", 900.0)):
        rows = [
            with_aligned_transcripts(
                {
                    "utt_id": f"{prefix}_000000",
                    "audio_path": "clip.wav",
                    "text": f"{shard_id} sentence 0",
                    "language": "de",
                    "country": "de",
                    "video_id": "shared-video",
                }
            )
        ]
        land_shard(data_root, shard_id, rows, {"clip.wav": encode(tone(4.0, 16_000, freq=freq), 16_000)})
        run_raw_shards(data_root, shard_id)
    refresh_and_build(data_root, "de")
    loaded = datasets.load_dataset(data_root.path(layout.hf_dataset_dir(DATASET)), "de")
    heard = {
        row["human_transcript"].split()[0]: dominant_hz(row["audio"]["bytes"])
        for split in loaded.values()
        for row in split.cast_column("audio", datasets.Audio(decode=False))
    }
    assert heard == {"video-a": pytest.approx(300.0, abs=2.0), "video-b": pytest.approx(900.0, abs=2.0)}


@pytest.fixture
def instance(monkeypatch):
    monkeypatch.setenv("SPEECHDATA_PUBLISHING_SETTLE_S", "0")
    with dg.instance_for_test() as instance:
        yield instance


def index_shard(instance, data_root, shard_id):
    assert materialize_shard(instance, data_root, shard_id, [raw_shards]).success


def publish(instance, data_root, country):
    instance.add_dynamic_partitions(country_partitions.name, [country])
    return dg.materialize(
        [hf_split_assignments, hf_dataset],
        partition_key=country,
        instance=instance,
        resources=tiny_resources_for(data_root.url),
        raise_on_error=False,
    )


def sensor_countries(instance, cursor, data_root):
    from sensors.publishing import country_dataset_sensor

    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        resources={"hub": HubPublisherResource(), "data_root": DataRootResource(url=data_root.url)},
    )
    result = country_dataset_sensor(context)
    return sorted(r.partition_key for r in result.run_requests), result.cursor


def test_a_shard_relanded_smaller_into_another_country_leaves_no_withdrawn_row_published(data_root, instance):
    land_granary_shard(data_root, "movable", "de", 4, prefix="m")
    land_granary_shard(data_root, "staying", "de", 4)
    for shard_id in ("movable", "staying"):
        index_shard(instance, data_root, shard_id)
    countries, cursor = sensor_countries(instance, None, data_root)
    assert countries == ["de"]
    assert publish(instance, data_root, "de").success
    assert published_rows(data_root, "de") == expected("movable", 4, prefix="m") + expected("staying", 4)
    # What is on the Hub: every file uploaded.
    with state_connection(data_root, layout.hf_state_database(DATASET, "de")) as db:
        db.execute("UPDATE files SET status = 'uploaded'")
        db.execute("UPDATE segments SET status = 'uploaded' WHERE status = 'pending'")
    sealed_before = {
        r["path_in_repo"]
        for r in state_rows(data_root, "de", "SELECT path_in_repo FROM files WHERE split LIKE 'train_%'")
    }

    # movable comes back smaller, in another country: the country it left is refreshed too.
    land_granary_shard(data_root, "movable", "at", 4, skip=(1,), prefix="m")
    index_shard(instance, data_root, "movable")
    countries, cursor = sensor_countries(instance, cursor, data_root)
    assert countries == ["at", "de"]
    for country in countries:
        assert publish(instance, data_root, country).success
    # staying loses one utterance in place: its sealed train subset is rewritten without it.
    land_granary_shard(data_root, "staying", "de", 4, skip=(2,))
    index_shard(instance, data_root, "staying")
    countries, _ = sensor_countries(instance, cursor, data_root)
    assert countries == ["de"]
    assert publish(instance, data_root, "de").success

    assert published_rows(data_root, "de") == expected("staying", 4, skip=(2,))
    assert published_rows(data_root, "at") == expected("movable", 4, skip=(1,), prefix="m")
    files = {r["path_in_repo"]: r["status"] for r in state_rows(data_root, "de", "SELECT * FROM files")}
    # The sealed subset that held withdrawn rows is replaced: old files to delete on the Hub, new to upload.
    assert sealed_before and all(files.get(path) == "deleted" for path in sealed_before)
    assert any(status == "pending" and path.startswith("de/train_") for path, status in files.items())
    keys = state_rows(data_root, "de", "SELECT shard_id, key FROM segments ORDER BY shard_id, key")
    assert [(r["shard_id"], r["key"]) for r in keys] == [("staying", f"utt_{i:06d}") for i in (0, 1, 3)]
    assert published_utterances(data_root, DATASET, "movable") == {f"m_{i:06d}" for i in (0, 2, 3)}
    assert published_utterances(data_root, DATASET, "staying") == {f"utt_{i:06d}" for i in (0, 1, 3)}


def test_an_unbalanced_hf_ledger_fails_publishing_naming_shard_product_and_ids(data_root, instance):
    land_granary_shard(data_root, "lossy", "de", 4)
    index_shard(instance, data_root, "lossy")
    instance.add_dynamic_partitions(country_partitions.name, ["de"])
    resources = tiny_resources_for(data_root.url)
    assert dg.materialize([hf_split_assignments], partition_key="de", instance=instance, resources=resources).success
    with state_connection(data_root, layout.hf_state_database(DATASET, "de")) as db:
        db.execute("DELETE FROM segments WHERE key = 'utt_000002'")  # a refresh that lost a row

    result = dg.materialize(
        [hf_dataset], partition_key="de", instance=instance, resources=resources, raise_on_error=False
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)
    assert "shard lossy" in message and "hf ledger" in message and "utt_000002" in message
    assert not data_root.exists(f"{layout.hf_dataset_dir(DATASET)}/de")


def test_an_unbalanced_asr_ledger_fails_the_manifests_naming_shard_product_and_ids(tmp_path, data_root, clips):
    from assets.asr_training import asr_flac, asr_manifest
    from speechdata.importers.segment_tars import build_segment_tar_sample, import_segment_tar_shard

    build_segment_tar_sample(str(tmp_path / "seed"), clips, n_segments=6)
    import_segment_tar_shard(str(tmp_path / "seed"), data_root, "asr-lossy")
    resources = tiny_resources_for(data_root.url)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["asr-lossy"])
        assert dg.materialize(
            [raw_shards, asr_flac], partition_key="asr-lossy", instance=instance, resources=resources
        ).success
        index = data_root.read_parquet(layout.asr_flac_index("asr-lossy"))
        lost = index["utt_id"][0].as_py()
        data_root.write_parquet(layout.asr_flac_index("asr-lossy"), index.slice(1))  # an extraction that lost a row
        result = dg.materialize([asr_manifest], instance=instance, resources=resources, raise_on_error=False)
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.error.message + str(failure.step_failure_data.user_failure_data)
    assert "shard asr-lossy" in message and "asr ledger" in message and lost in message
    assert not data_root.exists(layout.asr_manifest("train"))


def test_an_unbalanced_vad_ledger_fails_the_language_index_naming_shard_product_and_ids(data_root):
    from assets.partitions import language_partitions
    from assets.vad import language_shard_index, vad_segments
    from speechdata.testing.shards import build_sample_shard

    metadata = build_sample_shard(data_root, "vad-lossy", 3, seed=3, long_recordings=0, formats=("wav",))
    language = metadata["language"][0].as_py()
    resources = tiny_resources_for(data_root.url)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["vad-lossy"])
        instance.add_dynamic_partitions(language_partitions.name, [language])
        assert dg.materialize(
            [raw_shards, vad_segments], partition_key="vad-lossy", instance=instance, resources=resources
        ).success
        table = data_root.read_parquet(layout.vad_segments("vad-lossy"))
        rows = table.filter(pc.equal(table["language"], language))
        lost = rows["utt_ids"][0].as_py()[0]
        data_root.write_parquet(
            layout.vad_segments("vad-lossy"),
            table.filter(pc.invert(pc.is_in(table["audio_path"], rows["audio_path"].slice(0, 1)))),
        )
        result = dg.materialize(
            [language_shard_index],
            partition_key=language,
            instance=instance,
            resources=resources,
            run_config={"ops": {"language_shard_index": {"config": {"chunk_s": 1.0, "num_chunks": 4}}}},
            raise_on_error=False,
        )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.step_failure_data.error.message + str(failure.step_failure_data.error.cause)
    assert "shard vad-lossy" in message and "vad ledger" in message and lost in message
    assert not data_root.exists(layout.language_shard_index(language))
    assert not data_root.glob(layout.language_shard_index_part(language, "*"))


def test_an_unbalanced_translation_ledger_writes_no_pairs_and_names_shard_product_and_ids(data_root):
    from speechdata.accounting.ledger_gate import UnbalancedLedger
    from speechdata.translation.qe_stage import run_streaming_pairs
    from speechdata.translation.stage import SEGMENTS_SCHEMA

    land_granary_shard(data_root, "pairs-lossy", "de", 2)
    run_raw_shards(data_root, "pairs-lossy")
    # Segmentation kept utt_000000 and lost utt_000001 without a reject.
    segment = {
        "utt_id": "utt_000000",
        "latency": "low_latency",
        "segment_index": 0,
        "emit_ms": 1000,
        "source": "hallo",
        "target": "hello",
        "first_chunk": 0,
        "last_chunk": 0,
        "n_unmatched_chunks": 0,
    }
    data_root.write_parquet(layout.streaming_segments("pairs-lossy"), pa.Table.from_pylist([segment], SEGMENTS_SCHEMA))
    data_root.write_parquet(
        layout.qe_scores("pairs-lossy"), pa.Table.from_pylist([{**segment, "hypothesis": "hello", "prediction": 1.0}])
    )
    with pytest.raises(UnbalancedLedger, match=r"translation ledger of shard pairs-lossy.*utt_000001"):
        run_streaming_pairs(data_root, "pairs-lossy")
    assert not data_root.exists(layout.streaming_pairs("pairs-lossy"))


def test_asr_manifests_refuse_a_shard_relanded_smaller_until_its_flac_is_extracted_again(tmp_path, data_root, clips):
    from assets.asr_training import asr_flac, asr_manifest
    from speechdata.importers.segment_tars import build_segment_tar_sample, import_segment_tar_shard

    build_segment_tar_sample(str(tmp_path / "seed"), clips, n_segments=6)
    import_segment_tar_shard(str(tmp_path / "seed"), data_root, "asr-relanded")
    resources = tiny_resources_for(data_root.url)
    config = {"ops": {"asr_manifest": {"config": {"validation_share": 0.5, "eval_per_language": 1}}}}
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["asr-relanded"])
        shard = [raw_shards, asr_flac]
        assert dg.materialize(shard, partition_key="asr-relanded", instance=instance, resources=resources).success
        assert dg.materialize([asr_manifest], instance=instance, resources=resources, run_config=config).success
        landed = data_root.read_parquet(layout.landing_metadata("asr-relanded"))
        withdrawn = landed["utt_id"][2].as_py()
        data_root.write_parquet(
            layout.landing_metadata("asr-relanded"), landed.filter(pc.not_equal(landed["utt_id"], withdrawn))
        )
        mark_landed(data_root, "asr-relanded")
        assert dg.materialize(
            [raw_shards], partition_key="asr-relanded", instance=instance, resources=resources
        ).success
        stale = dg.materialize(
            [asr_manifest], instance=instance, resources=resources, run_config=config, raise_on_error=False
        )
        assert not stale.success
        [failure] = [e for e in stale.all_events if e.event_type_value == "STEP_FAILURE"]
        assert withdrawn in str(failure.step_failure_data.user_failure_data) + failure.step_failure_data.error.message
        assert dg.materialize(shard, partition_key="asr-relanded", instance=instance, resources=resources).success
        assert dg.materialize([asr_manifest], instance=instance, resources=resources, run_config=config).success
    build = read_published_build(data_root)
    published = {u for frame in (build.train, build.validation, build.removed) for u in frame["utt_id"].to_list()}
    assert published == set(landed["utt_id"].to_pylist()) - {withdrawn}


def test_the_hub_copy_of_a_sealed_subset_loses_the_withdrawn_row_too(data_root):
    import pyarrow.parquet as pq
    from huggingface_hub import HfApi

    from speechdata.hf.publish import RetryPolicy, publish_country, register_card
    from tests.hub_standin import HubStandIn

    def publish_to(hub):
        write_dataset_card(data_root, DATASET)
        register_card(data_root, DATASET, "de")
        api = HfApi(endpoint=hub.url, token="hf_test")
        policy = RetryPolicy(attempts=2, base_delay_s=0.01, max_delay_s=0.02)
        summary = publish_country(data_root, DATASET, "de", api, "org/ds", policy=policy, log=lambda m: None)
        assert not summary.errors
        return summary

    def hub_rows(hub) -> set[tuple[str, str]]:
        return {
            (shard, key)
            for path, data in hub.state.repos["org/ds"].items()
            if path.endswith(".parquet")
            for shard, key in zip(*pq.read_table(io.BytesIO(data), columns=["shard_id", "key"]).to_pydict().values())
        }

    for shard_id in ("hub-a", "hub-b"):
        land_granary_shard(data_root, shard_id, "de", 4)
        run_raw_shards(data_root, shard_id)
    refresh_and_build(data_root, "de")
    with HubStandIn() as hub:
        publish_to(hub)
        assert hub_rows(hub) == {(s, f"utt_{i:06d}") for s in ("hub-a", "hub-b") for i in range(4)}
        land_granary_shard(data_root, "hub-a", "de", 4, skip=(1,))
        run_raw_shards(data_root, "hub-a")
        refresh_and_build(data_root, "de")
        summary = publish_to(hub)
        assert summary.deleted  # the old files of every rewritten split
        assert hub_rows(hub) == {(s, f"utt_{i:06d}") for s in ("hub-a", "hub-b") for i in range(4)} - {
            ("hub-a", "utt_000001")
        }
        local = data_root.path(layout.hf_dataset_dir(DATASET))
        assert set(hub.state.repos["org/ds"]) == {p[len(local) + 1 :] for p in data_root.fs.find(local)}
