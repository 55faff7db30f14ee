"""Re-landing detection by content: clocks, preserved mtimes and restored backups cannot fool it."""

import json
import os
import shutil
import time

import dagster as dg
import pyarrow as pa

from sensors.landing import RELANDED_TAG, build_landing_sensor
from speechdata.io import layout
from speechdata.landing.mark import mark_landed
from speechdata.landing.scan import landing_fingerprint
from tests.conftest import encode, tone
from tests.integration.test_landing_sensor import tick

WAV = encode(tone(1.0, 16_000), 16_000)


def land(data_root, shard_id, utt_ids, *, root=None):
    """A shard of one-second files, one per utterance, marked landed with ``mark_landed``."""
    root = root or data_root
    rows = [{"utt_id": u, "audio_path": f"{u}.wav"} for u in utt_ids]
    for u in utt_ids:
        root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{u}.wav", WAV)
    root.write_parquet(layout.landing_metadata(shard_id), pa.Table.from_pylist(rows))
    mark_landed(root, shard_id)


def settle(sensor, instance, data_root):
    """Ticks until nothing is requested; the cursor after the quiet tick."""
    cursor = None
    for _ in range(3):
        result = tick(sensor, instance, data_root, cursor)
        cursor = result.cursor
        if not result.run_requests:
            return cursor
    raise AssertionError("the sensor kept requesting runs")


def set_mtime(path, stamp):
    os.utime(path, ns=(stamp, stamp))


def test_a_success_marker_dated_in_the_future_does_not_hide_another_shards_relanding(data_root):
    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    with dg.instance_for_test() as instance:
        land(data_root, "a", ["a1"])
        land(data_root, "b", ["b1"])
        cursor = settle(sensor, instance, data_root)
        a_marker = data_root.path(layout.landing_success_marker("a"))
        set_mtime(a_marker, time.time_ns() + 86_400 * 10**9)  # a clock a day ahead, on shard a only
        touched = tick(sensor, instance, data_root, cursor)
        land(data_root, "b", ["b1", "b2"])
        later = tick(sensor, instance, data_root, touched.cursor)
        assert [(r.partition_key, r.tags[RELANDED_TAG]) for r in later.run_requests] == [("b", "true")]
        assert later.run_requests[0].run_key == f"b@{landing_fingerprint(data_root, 'b')}"
        assert touched.run_requests == []  # a's content did not change


def test_a_relanding_copied_with_preserved_mtimes_is_detected(data_root, tmp_path):
    """``cp -p`` / ``rsync -a`` of a new version whose files carry the old version's times."""
    from speechdata.io.storage import DataRoot

    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    with dg.instance_for_test() as instance:
        land(data_root, "s1", ["u1", "u2"])
        cursor = settle(sensor, instance, data_root)
        old_times = {
            name: os.stat(data_root.path(f"landing/s1/{name}")).st_mtime_ns for name in ("metadata.parquet", "_SUCCESS")
        }
        staging = DataRoot(str(tmp_path / "staging"))
        land(data_root, "s1", ["u1"], root=staging)  # the new version: one utterance gone
        for name, stamp in old_times.items():
            set_mtime(staging.path(f"landing/s1/{name}"), stamp)
        shutil.rmtree(data_root.path("landing/s1/audio"))
        shutil.copytree(staging.path("landing/s1"), data_root.path("landing/s1"), dirs_exist_ok=True)  # copy2: cp -p
        for name, stamp in old_times.items():
            assert os.stat(data_root.path(f"landing/s1/{name}")).st_mtime_ns == stamp
        result = tick(sensor, instance, data_root, cursor)
        [request] = result.run_requests
        assert request.partition_key == "s1" and request.tags[RELANDED_TAG] == "true"


def test_touching_a_shard_or_restoring_it_from_a_backup_requests_nothing(data_root, tmp_path):
    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    with dg.instance_for_test() as instance:
        for shard_id in ("s1", "s2", "s3"):
            land(data_root, shard_id, ["u1", "u2"])
        cursor = settle(sensor, instance, data_root)
        quiet = json.loads(cursor)
        assert quiet["fingerprinted"] == 0  # nothing hashed when no file changed

        marker = data_root.path(layout.landing_success_marker("s2"))
        set_mtime(marker, time.time_ns() + 10**10)
        touched = tick(sensor, instance, data_root, cursor)
        assert touched.run_requests == [] and json.loads(touched.cursor)["fingerprinted"] == 1

        # A restore: every file comes back with new inodes and ctimes, the same bytes.
        backup = tmp_path / "backup"
        shutil.copytree(data_root.path("landing"), backup)
        shutil.rmtree(data_root.path("landing"))
        shutil.copytree(backup, data_root.path("landing"))
        restored = tick(sensor, instance, data_root, touched.cursor)
        assert restored.run_requests == [] and json.loads(restored.cursor)["fingerprinted"] == 3


def test_marking_a_shard_landed_again_requests_it_once_under_a_new_key(data_root):
    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    with dg.instance_for_test() as instance:
        land(data_root, "s1", ["u1"])
        cursor = settle(sensor, instance, data_root)
        keys = []
        for _ in range(2):
            mark_landed(data_root, "s1")
            result = tick(sensor, instance, data_root, cursor)
            keys += [r.run_key for r in result.run_requests]
            cursor = tick(sensor, instance, data_root, result.cursor).cursor
        assert len(keys) == 2 and len(set(keys)) == 2


def test_relandings_beyond_the_cap_wait_for_the_next_tick(data_root):
    sensor = build_landing_sensor(max_shards_per_tick=2, batch_shards=1)
    with dg.instance_for_test() as instance:
        for i in range(3):
            land(data_root, f"s{i}", ["u1"])
        cursor = settle(sensor, instance, data_root)
        for i in range(3):
            land(data_root, f"s{i}", ["u1", "u2"])
        first = tick(sensor, instance, data_root, cursor)
        second = tick(sensor, instance, data_root, first.cursor)
        third = tick(sensor, instance, data_root, second.cursor)
    assert [len(r.run_requests) for r in (first, second, third)] == [2, 1, 0]
    assert sorted(r.partition_key for r in first.run_requests + second.run_requests) == ["s0", "s1", "s2"]


def test_a_registered_shard_relinked_out_of_the_root_is_requested_again_and_never_read(data_root, tmp_path):
    from speechdata.io.storage import DataRoot

    sensor = build_landing_sensor(max_shards_per_tick=10, batch_shards=1)
    with dg.instance_for_test() as instance:
        land(data_root, "s1", ["u1"])
        cursor = settle(sensor, instance, data_root)
        outside = DataRoot(str(tmp_path / "outside"))
        land(data_root, "s1", ["u1", "u2"], root=outside)
        os.remove(data_root.path("landing/s1/metadata.parquet"))
        os.symlink(outside.path("landing/s1/metadata.parquet"), data_root.path("landing/s1/metadata.parquet"))
        mark_landed(data_root, "s1")
        [request] = tick(sensor, instance, data_root, cursor).run_requests
    assert request.run_key.startswith("s1@outside-root-")


def test_hashing_stops_at_its_time_budget_and_the_rest_is_hashed_later(data_root):
    from speechdata.landing.fingerprint import load_fingerprint_state, scan_relandings
    from speechdata.landing.scan import list_landing_dirs

    for i in range(3):
        land(data_root, f"s{i}", ["u1"])
    landed = list_landing_dirs(data_root)
    spent = scan_relandings(data_root, landed, set(landed), max_relanded=10, max_hashed=10, max_hash_seconds=0.0)
    assert spent.hashed == 0 and spent.more_waiting and load_fingerprint_state(data_root) == {}
    later = scan_relandings(data_root, landed, set(landed), max_relanded=10, max_hashed=10)
    assert later.hashed == 3 and not later.more_waiting and sorted(later.baselined) == ["s0", "s1", "s2"]
