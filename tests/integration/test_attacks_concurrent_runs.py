"""Two runs of one shard at once: the second is refused by name; a lock left by a dead holder is taken over."""

import json
import os
import signal
import socket
import subprocess
import sys

import dagster as dg
import pytest

from assets.partitions import shard_partitions
from speechdata.io import layout
from speechdata.io.shard_lock import ShardLocked, shard_lock, shard_lock_path
from tests.conftest import encode, land_shard, tone

WAV = encode(tone(1.0, 16_000), 16_000)
HOLD_A_LOCK = """
import sys, time
from speechdata.io.shard_lock import shard_lock
with shard_lock(sys.argv[1], "s1", "raw_shards"):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.fixture
def landed(data_root):
    land_shard(data_root, "s1", [{"utt_id": "a", "audio_path": "a.wav"}], {"a.wav": WAV})
    return data_root


def materialize_raw_shards(data_root, resources, instance):
    from assets.ingest import raw_shards

    return dg.materialize(
        [raw_shards], partition_key="s1", instance=instance, resources=resources, raise_on_error=False
    )


def step_error(result) -> str:
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return str(failure.event_specific_data.error)


def test_a_second_run_of_a_shard_in_progress_is_refused_naming_the_holder_then_runs_once_it_died(
    landed, tiny_resources
):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_A_LOCK, landed.root],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
            refused = materialize_raw_shards(landed, tiny_resources, instance)
            assert not refused.success
            error = step_error(refused)
            assert "shard 's1': raw_shards is being written by another run" in error
            assert f"pid {holder.pid} on {socket.gethostname()}" in error
            assert not landed.exists(layout.utterance_index("s1"))

            holder.send_signal(signal.SIGKILL)  # killed outright: its lock stays behind
            holder.wait(timeout=30)
            assert os.path.exists(shard_lock_path(landed.root, "s1", "raw_shards"))
            assert materialize_raw_shards(landed, tiny_resources, instance).success
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
    assert landed.exists(layout.utterance_index("s1"))
    assert not os.path.exists(shard_lock_path(landed.root, "s1", "raw_shards"))


def test_a_lock_from_another_host_holds_while_its_run_is_in_progress_and_is_taken_over_when_it_ended(
    landed, tiny_resources
):
    from dagster_project.definitions import defs

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
        other = instance.create_run_for_job(defs.resolve_job_def("per_shard_job"), status=dg.DagsterRunStatus.STARTED)
        path = shard_lock_path(landed.root, "s1", "raw_shards")
        os.makedirs(os.path.dirname(path))
        with open(path, "w") as handle:
            json.dump(
                {"host": "pod-elsewhere", "pid": 1, "started_at": "then", "run_id": other.run_id, "token": "t"}, handle
            )
        refused = materialize_raw_shards(landed, tiny_resources, instance)
        assert not refused.success
        assert f"pid 1 on pod-elsewhere, run {other.run_id}" in step_error(refused)

        instance.report_run_failed(other)
        assert materialize_raw_shards(landed, tiny_resources, instance).success
    assert not os.path.exists(path)


def test_a_half_written_lock_is_taken_over_and_a_live_one_is_never_removed_by_another(tmp_path):
    root = str(tmp_path)
    path = shard_lock_path(root, "s1", "vad_segments")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write('{"host": ')  # its holder died between create and write
    with shard_lock(root, "s1", "vad_segments") as me:
        with open(path) as handle:
            assert json.load(handle)["token"] == me.token
        with (
            pytest.raises(ShardLocked, match=rf"shard 's1': vad_segments .*pid {os.getpid()} on"),
            shard_lock(root, "s1", "vad_segments"),
        ):
            pass
        assert os.path.exists(path)  # the refused attempt left the holder's lock in place
    assert not os.path.exists(path)
    with shard_lock(root, "s1", "vad_segments"), shard_lock(root, "s1", "alignments"):
        pass  # one lock per product: two assets of one shard may run side by side
