"""Re-landing: a shard landed again is requested again, and its re-run replaces every output."""

import os
import time

import dagster as dg
import pyarrow.compute as pc

from assets.partitions import shard_partitions
from sensors.landing import RELANDED_TAG, build_landing_sensor
from speechdata.asr.flac_retention import remove_unreferenced_flacs
from speechdata.io import layout
from speechdata.landing.mark import mark_landed
from speechdata.landing.scan import landing_fingerprint
from speechdata.testing.shards import build_sample_shard
from tests.integration.test_landing_sensor import tick


def touch_later(data_root, relative, seconds=5.0):
    """Move a file's mtime forward, as a later landing would (filesystem clocks can be coarse)."""
    path = data_root.path(relative)
    stamp = time.time() + seconds
    os.utime(path, (stamp, stamp))


def test_a_relanded_shard_is_requested_again_under_its_new_fingerprint(data_root):
    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    with dg.instance_for_test() as instance:
        build_sample_shard(data_root, "s1", 2, seed=1, long_recordings=0)
        first = tick(sensor, instance, data_root)
        assert [r.run_key for r in first.run_requests] == ["s1"]
        quiet = tick(sensor, instance, data_root, first.cursor)
        assert quiet.run_requests == []

        build_sample_shard(data_root, "s1", 3, seed=2, long_recordings=0)  # new metadata, new _SUCCESS
        touch_later(data_root, layout.landing_success_marker("s1"))
        again = tick(sensor, instance, data_root, quiet.cursor)
        [request] = again.run_requests
        assert request.partition_key == "s1" and request.tags[RELANDED_TAG] == "true"
        assert request.run_key == f"s1@{landing_fingerprint(data_root, 's1')}"
        assert tick(sensor, instance, data_root, again.cursor).run_requests == []

        mark_landed(data_root, "s1")
        touch_later(data_root, layout.landing_success_marker("s1"), seconds=10.0)
        third = tick(sensor, instance, data_root, again.cursor)
        assert [r.run_key for r in third.run_requests] != [request.run_key] and len(third.run_requests) == 1


def flac_index(data_root) -> list[dict]:
    return data_root.read_parquet(layout.asr_flac_index("s1")).to_pylist()


def test_the_rerun_of_a_relanded_shard_removes_outputs_of_utterances_that_are_gone(data_root, tiny_resources):
    from assets.alignment import alignments
    from assets.asr_training import asr_flac
    from assets.ingest import normalized_audio, raw_shards

    selection = [raw_shards, normalized_audio, alignments, asr_flac]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
        first = build_sample_shard(data_root, "s1", 3, seed=4, long_recordings=0, formats=("wav",))
        assert dg.materialize(selection, partition_key="s1", instance=instance, resources=tiny_resources).success
        gone = [u for u in first["utt_id"].to_pylist() if data_root.exists(layout.ctm("s1", "words", u))][-1]
        [gone_flac] = [r["flac_path"] for r in flac_index(data_root) if r["utt_id"] == gone]
        assert data_root.exists(gone_flac)

        kept = first.filter(pc.not_equal(first["utt_id"], gone))
        data_root.write_parquet(layout.landing_metadata("s1"), kept)
        mark_landed(data_root, "s1")
        assert dg.materialize(selection, partition_key="s1", instance=instance, resources=tiny_resources).success
    assert not data_root.exists(layout.ctm("s1", "words", gone))
    assert gone not in [r["utt_id"] for r in flac_index(data_root)]
    assert data_root.exists(gone_flac)  # the published manifests may still name it: removed after their rebuild
    remove_unreferenced_flacs(data_root)
    assert not data_root.exists(gone_flac)
    assert gone not in data_root.read_parquet(layout.alignments("s1"))["utt_id"].to_pylist()
