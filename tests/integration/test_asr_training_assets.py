"""asr_flac and asr_manifest materialized in process with the real resources on an imported ASR shard (FLAC tar and audio index)."""

import dagster as dg

from assets.asr_training import asr_flac, asr_manifest
from assets.ingest import raw_shards
from assets.partitions import shard_partitions
from speechdata.asr.stage import read_published_build
from speechdata.importers.segment_tars import build_segment_tar_sample, import_segment_tar_shard
from speechdata.io import layout
from tests.tiny_resources import tiny_resources_for


def test_imported_shard_becomes_flac_and_manifests_with_checks(tmp_path, data_root, clips):
    build_segment_tar_sample(str(tmp_path / "seed"), clips, n_segments=12, extra_members={"../escape.flac": b"x"})
    import_segment_tar_shard(str(tmp_path / "seed"), data_root, "asr-0001")
    resources = tiny_resources_for(data_root.url)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["asr-0001"])
        shard = dg.materialize([raw_shards, asr_flac], partition_key="asr-0001", instance=instance, resources=resources)
        assert shard.success
        manifest = dg.materialize(
            [asr_manifest],
            instance=instance,
            resources=resources,
            run_config={"ops": {"asr_manifest": {"config": {"validation_share": 0.5, "eval_per_language": 1}}}},
        )
        assert manifest.success

    [flac_event] = shard.asset_materializations_for_node("asr_flac")
    flac_meta = flac_event.metadata
    assert flac_meta["dagster/row_count"].value == 12 and flac_meta["rejects"].value == 0
    assert flac_meta["unsafe_tar_members"].value == 1
    assert flac_meta["unsafe_tar_member_examples"].value == [
        {"member": "../escape.flac", "reason": "tar_member_unsafe_path"}
    ]
    assert not list(tmp_path.rglob("escape.flac"))

    [event] = manifest.asset_materializations_for_node("asr_manifest")
    meta = event.metadata
    # The default publishes per-shard parts only: no corpus-wide file is rewritten per new shard.
    assert not data_root.exists(layout.asr_manifest("train"))
    published = read_published_build(data_root)
    train, validation, removed = published.train, published.validation, published.removed
    assert meta["train_rows"].value == train.height and meta["validation_rows"].value == validation.height
    assert train.height + validation.height + removed.height == 12
    assert meta["dagster/row_count"].value == train.height + validation.height
    assert sum(meta["removed_by_reason"].value.values()) == removed.height
    assert "| split | lang | utterances | hours |" in meta["hours_by_language_and_split"].value
    assert all(text.startswith(f"<|{lang}|> ") for text, lang in zip(train["text"], train["lang"]))
    checks = {
        e.check_name: e.passed for e in [*shard.get_asset_check_evaluations(), *manifest.get_asset_check_evaluations()]
    }
    assert checks == {
        "every_landed_row_accounted_for": True,
        "every_indexed_utterance_extracted_or_rejected": True,
        "no_recording_in_two_splits": True,
    }
