"""A shard's lock is held exactly while its holder renews it, whatever Dagster instance the holder runs in.

Two Dagster instances (two ``DAGSTER_HOME``s) may write one data root (docs/reliability.md): each
knows only its own runs. A holder whose run id the instance does not know is alive as long as it
renews its lease; one that stopped renewing is taken over, and, should it wake up, refuses to
change anything. On a local root and on S3 (moto).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import dagster as dg
import pytest

from assets.partitions import shard_partitions
from speechdata.io import layout
from speechdata.io.shard_lock import ShardLocked, ShardLockLost, shard_write_lock
from speechdata.io.storage import DataRoot
from tests.conftest import encode, land_shard, tone

WAV = encode(tone(1.0, 16_000), 16_000)

RUN_IN_ANOTHER_INSTANCE = """
import os, sys, time
import dagster as dg
import assets.ingest as ingest
from assets.partitions import shard_partitions
from resources.storage import DataRootResource

data_root_url, go_on = sys.argv[1], sys.argv[2]
real = ingest.run_raw_shards

def paused(root, shard_id):
    print("building", flush=True)
    while not os.path.exists(go_on):
        time.sleep(0.05)
    return real(root, shard_id)

ingest.run_raw_shards = paused
instance = dg.DagsterInstance.get()  # this process's own DAGSTER_HOME
instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
result = dg.materialize(
    [ingest.raw_shards], partition_key="s1", instance=instance,
    resources={"data_root": DataRootResource(url=data_root_url)}, raise_on_error=False,
)
print("success" if result.success else "failed", flush=True)
"""

HOLD_LOCKS = """
import contextlib, sys, time
from speechdata.io.shard_lock import shard_write_lock
from speechdata.io.storage import DataRoot

root, run_id, products = DataRoot(sys.argv[1]), sys.argv[2], sys.argv[3:]
with contextlib.ExitStack() as stack:
    for product in products:
        stack.enter_context(shard_write_lock(root, "s1", product, run_id=run_id, run_ended=lambda _: True))
    print("held", flush=True)
    line = sys.stdin.readline()  # the test's go: write one file of the shard
    try:
        root.write_bytes("shards/s1/late.bin", b"written after the lease lapsed")
        print("wrote", flush=True)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
"""


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.getcwd(), **extra}


def _step_error(result) -> str:
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return str(failure.event_specific_data.error)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=30)


@pytest.fixture
def landed(data_root):
    land_shard(data_root, "s1", [{"utt_id": "a", "audio_path": "a.wav"}], {"a.wav": WAV})
    return data_root


@pytest.mark.slow  # a second interpreter imports the code location and runs Dagster under its own DAGSTER_HOME
def test_a_live_run_of_another_instance_keeps_its_shard_and_finishes_while_this_instance_is_refused(landed, tmp_path):
    home = tmp_path / "other_dagster_home"
    home.mkdir()
    go_on = tmp_path / "go_on"
    other = subprocess.Popen(
        [sys.executable, "-c", RUN_IN_ANOTHER_INSTANCE, landed.url, str(go_on)],
        stdout=subprocess.PIPE,
        text=True,
        env=_env(DAGSTER_HOME=str(home)),
    )
    try:
        assert other.stdout.readline().strip() == "building"
        lock = json.loads(landed.fs.cat_file(landed.path("_locks/s1/raw_shards.lock")))
        with dg.instance_for_test() as instance:
            assert instance.get_run_by_id(lock["run_id"]) is None  # a run this instance never heard of
            instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
            from assets.ingest import raw_shards

            refused = dg.materialize(
                [raw_shards], partition_key="s1", instance=instance, resources=_data_root(landed), raise_on_error=False
            )
            assert not refused.success
            error = _step_error(refused)
            assert "shard 's1': raw_shards is being written by another run" in error
            assert f"pid {other.pid} on" in error and f"run {lock['run_id']}" in error
            assert not landed.exists(layout.utterance_index("s1"))

            go_on.touch()
            assert other.stdout.readline().strip() == "success"  # never lost its temp files to a second writer
            assert other.wait(timeout=60) == 0
            assert landed.exists(layout.utterance_index("s1"))
            assert dg.materialize(
                [raw_shards], partition_key="s1", instance=instance, resources=_data_root(landed)
            ).success
    finally:
        _stop(other)
    assert not landed.exists("_locks/s1/raw_shards.lock")


def test_a_lock_from_before_leases_is_freed_only_by_a_run_this_instance_knows_has_ended(landed):
    """A lock without a lease (left by an earlier version) cannot prove its holder alive: the instance
    is asked, and a run it does not know (another instance's) is not over."""
    from assets.ingest import raw_shards

    lock = landed.path("_locks/s1/raw_shards.lock")
    landed.fs.makedirs(os.path.dirname(lock), exist_ok=True)
    with open(lock, "w") as handle:
        json.dump(
            {"host": "pod-elsewhere", "pid": 1, "started_at": "then", "run_id": "unknown-here", "token": "t"}, handle
        )
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
        refused = dg.materialize(
            [raw_shards], partition_key="s1", instance=instance, resources=_data_root(landed), raise_on_error=False
        )
        assert not refused.success
        assert "pid 1 on pod-elsewhere, run unknown-here" in _step_error(refused)
        assert not landed.exists(layout.utterance_index("s1"))


def _data_root(root: DataRoot) -> dict:
    from resources.storage import DataRootResource

    return {"data_root": DataRootResource(url=root.url)}


def _shard_assets() -> dict[str, dg.AssetsDefinition]:
    """Every shard-partitioned asset of the code location, by name, as its group module defines it."""
    import assets

    found = {}
    for module in assets.GROUP_MODULES:
        for definition in module.defs.assets or []:
            if isinstance(definition, dg.AssetsDefinition) and definition.partitions_def == shard_partitions:
                found.update({key.to_user_string(): definition for key in definition.keys})
    return found


@pytest.mark.slow  # one step per shard asset, each loading its models before it meets the lock
def test_every_shard_asset_is_refused_while_a_live_holder_of_another_instance_has_its_lock(landed, tiny_resources):
    """The structural case: whatever shard asset is added, its step meets the lock and believes the
    lease, not the instance, about whether the holder is alive."""
    shard_assets = _shard_assets()
    names = sorted(shard_assets)
    assert {"raw_shards", "normalized_audio", "near_duplicates"} <= set(names)
    foreign_run = uuid.uuid4().hex  # another instance's run: unknown here, and the holder says it ended
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCKS, landed.url, foreign_run, *names],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with dg.instance_for_test() as instance:
            instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
            for name in names:
                result = dg.materialize(
                    [shard_assets[name]],
                    selection=[dg.AssetKey.from_user_string(name)],
                    partition_key="s1",
                    instance=instance,
                    resources=tiny_resources,
                    raise_on_error=False,
                )
                assert not result.success, name
                error = _step_error(result)
                assert f"{name} is being written by another run (pid {holder.pid}" in error, (name, error)
                assert f"run {foreign_run}" in error, name
    finally:
        _stop(holder)
    assert sorted(os.listdir(landed.path("_locks/s1"))) == sorted(f"{name}.lock" for name in names)


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> DataRoot:
    if request.param == "s3":
        return DataRoot(f"{request.getfixturevalue('s3_bucket')}/root")
    return DataRoot(str(tmp_path / "root"))


def test_a_holder_that_froze_past_its_lease_is_taken_over_and_then_refuses_to_write(root):
    """A holder alive but frozen (SIGSTOP: a VM paused, a process swapped out) stops renewing: its
    lock is taken over once the lease ran out, and when it wakes up its first change is refused,
    naming the new holder, before anything is written."""
    frozen = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCKS, root.url, "run-frozen", "raw_shards"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=_env(SPEECHDATA_LOCK_LEASE_S="2"),
    )
    try:
        assert frozen.stdout.readline().strip() == "held"
        with (
            pytest.raises(ShardLocked, match=r"run run-frozen, since .*, renewed \d+ s ago \(lease 2 s\)"),
            shard_write_lock(root, "s1", "raw_shards", run_ended=lambda run_id: True),
        ):
            pass  # renewed, hence alive, though an instance here would call its run (unknown to it) over
        frozen.send_signal(signal.SIGSTOP)
        deadline = 60
        while True:
            try:
                with shard_write_lock(root, "s1", "raw_shards", run_id="run-later") as later:
                    frozen.send_signal(signal.SIGCONT)
                    frozen.stdin.write("write\n")
                    frozen.stdin.flush()
                    answer = frozen.stdout.readline().strip()
                    assert json.loads(root.fs.cat_file(root.path("_locks/s1/raw_shards.lock")))["token"] == later.token
                break
            except ShardLocked:
                deadline -= 1
                assert deadline > 0, "the frozen holder's lease never ran out"
                time.sleep(0.25)
        assert answer.startswith(ShardLockLost.__name__), answer
        assert "raw_shards lock this write was given is now held by" in answer and "late.bin" in answer
        assert not root.exists("shards/s1/late.bin")
        assert frozen.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            frozen.send_signal(signal.SIGCONT)
        _stop(frozen)
