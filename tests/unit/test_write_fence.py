"""A GPU worker changes a shard's files only while its driver still holds the shard's lock.

A resident worker (a Ray actor) outlives the step that handed it a shard: when the step is killed,
the call runs on, and once the step's lock is no longer renewed a later run takes it over and writes the
shard again. The worker's fence (the lock's token, handed over with the shard) makes the outliving
call stop: it does not start, stops at its next progress report, and no file it would move into
place or remove is touched once the lock is another run's. On a local root and on S3 (moto).
"""

import contextlib
import pickle

import pytest

import resources.gpu_worker as gpu_worker
from resources.gpu_worker import ShardJob, ShardWorker
from speechdata.io.shard_lock import ShardLockLost, WriteFence, held_fence, shard_write_lock
from speechdata.io.storage import TEMP_PREFIX, DataRoot, guarded_changes, remove_orphaned_temps_of
from tests.lock_leases import let_lease_lapse

SHARD = "s1"
PRODUCT = "wavlm_features"
FIRST = f"shards/{SHARD}/first.bin"
SECOND = f"shards/{SHARD}/second.bin"
LATER_TEMP = f"shards/{SHARD}/{TEMP_PREFIX}0123456789ab-second.bin"
LOCK = f"_locks/{SHARD}/{PRODUCT}.lock"


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path) -> DataRoot:
    if request.param == "s3":
        return DataRoot(f"{request.getfixturevalue('s3_bucket')}/root")
    return DataRoot(str(tmp_path / "root"))


def take_over(root: DataRoot, stack: contextlib.ExitStack) -> None:
    """A later run takes the lock, as it does once the holder stopped renewing it (a killed step)."""
    if root.exists(LOCK):
        let_lease_lapse(root, LOCK)
    stack.enter_context(shard_write_lock(root, SHARD, PRODUCT, run_id="run-later"))


def write_elsewhere(root: DataRoot, relative: str, data: bytes) -> None:
    root.fs.pipe_file(root.path(relative), data)


def files(root: DataRoot) -> dict[str, bytes]:
    found = {}
    for path in root.fs.find(root.path("shards")):
        found[path.removeprefix(root.path(""))] = root.fs.cat_file(path)
    return found


def a_job(run) -> ShardJob:
    return ShardJob(
        model_key="m",
        load_model=lambda: "model",
        read_inputs=lambda shard_id: None,
        inputs_current=lambda _: True,
        run=run,
    )


def test_the_step_lock_gives_its_fence_while_held_and_the_fence_travels_pickled(root):
    assert held_fence(SHARD) is None
    with shard_write_lock(root, SHARD, PRODUCT, run_id="run-1") as holder:
        fence = held_fence(SHARD)
        assert isinstance(fence, WriteFence) and fence.token == holder.token
        assert held_fence("another-shard") is None
        shipped = pickle.loads(pickle.dumps(fence))
        shipped.check()  # held: passes, read from the lock as a worker elsewhere reads it
    assert held_fence(SHARD) is None
    with pytest.raises(ShardLockLost, match=rf"shard '{SHARD}': the {PRODUCT} lock .* is released") as lost:
        shipped.check()
    # The worker's refusal reaches the step pickled, message and all.
    assert str(pickle.loads(pickle.dumps(lost.value))) == str(lost.value)


def test_a_shard_whose_lock_was_taken_over_before_its_turn_does_not_start(root):
    ran = []
    with shard_write_lock(root, SHARD, PRODUCT, run_id="run-killed"):
        fence = held_fence(SHARD)
    # The step was killed with its call still queued on the worker; a later run took the shard.
    with contextlib.ExitStack() as later:
        take_over(root, later)
        root.write_bytes(FIRST, b"later run")
        with pytest.raises(ShardLockLost, match=r"now held by pid \d+ on .*, run run-later"):
            ShardWorker("w").run_shard(a_job(lambda *args: ran.append(args)), SHARD, fence=fence)
    assert ran == []
    assert files(root) == {FIRST: b"later run"}


def test_a_call_that_outlives_its_step_changes_no_file_of_the_run_that_took_the_shard_over(root):
    later = contextlib.ExitStack()

    def run(model, shard_id, inputs, on_progress):
        root.write_bytes(FIRST, b"killed step, batch 1")
        # Meanwhile the step is killed, its run ends and a later run (in its own process, so its
        # writes are not this worker's to check) writes the shard again.
        take_over(root, later)
        write_elsewhere(root, FIRST, b"later run")
        write_elsewhere(root, LATER_TEMP, b"later run's temp")
        root.write_bytes(SECOND, b"killed step, batch 2")  # refused: no longer this call's shard

    with later, shard_write_lock(root, SHARD, PRODUCT, run_id="run-killed"):
        fence = held_fence(SHARD)
        with pytest.raises(ShardLockLost, match=r"refusing to change .*second\.bin"):
            ShardWorker("w").run_shard(a_job(run), SHARD, fence=fence)
        # Its own temp is gone, the later run's (a writer still at work) is not removed.
        assert files(root) == {
            FIRST: b"later run",
            LATER_TEMP: b"later run's temp",
        }


def test_a_call_that_outlives_its_step_stops_at_its_next_progress_report(root, monkeypatch):
    monkeypatch.setattr(gpu_worker, "FENCE_CHECK_INTERVAL_S", 0.0)
    batches = []
    later = contextlib.ExitStack()

    def run(model, shard_id, inputs, on_progress):
        for batch in range(5):
            batches.append(batch)
            on_progress(batch + 1, 5, 1.0)
            if batch == 1:
                take_over(root, later)

    with later, shard_write_lock(root, SHARD, PRODUCT, run_id="run-killed"):
        fence = held_fence(SHARD)
        with pytest.raises(ShardLockLost):
            ShardWorker("w").run_shard(a_job(run), SHARD, fence=fence)
    assert batches == [0, 1, 2]  # the report after the takeover was its last


def test_a_fenced_shard_writes_as_an_unfenced_one_while_its_lock_is_held(root):
    root.write_bytes(f"shards/{SHARD}/{TEMP_PREFIX}0123456789ab-first.bin", b"a killed attempt's temp")

    def run(model, shard_id, inputs, on_progress):
        assert remove_orphaned_temps_of(root.fs, root.path(FIRST)) == 1
        root.write_bytes(FIRST, b"one")
        root.write_bytes(SECOND, b"two")
        return "done"

    with shard_write_lock(root, SHARD, PRODUCT, run_id="run-1"):
        outcome = ShardWorker("w").run_shard(a_job(run), SHARD, fence=held_fence(SHARD))
    assert outcome.result == "done"
    assert files(root) == {FIRST: b"one", SECOND: b"two"}


def test_a_guard_refuses_moving_a_file_into_place_and_removing_another_writers_temp(tmp_path):
    root = DataRoot(str(tmp_path))
    temp = f"shards/{SHARD}/{TEMP_PREFIX}0123456789ab-first.bin"
    root.write_bytes(temp, b"temp")
    refused = []

    def refuse(path: str) -> None:
        refused.append(path.removeprefix(root.path("")))
        raise PermissionError(path)

    with guarded_changes(refuse):
        with pytest.raises(PermissionError):
            root.write_bytes(SECOND, b"two")
        with pytest.raises(PermissionError):
            remove_orphaned_temps_of(root.fs, root.path(FIRST))
    assert refused == [SECOND, temp]
    assert files(root) == {temp: b"temp"}
    assert remove_orphaned_temps_of(root.fs, root.path(FIRST)) == 1  # outside the block: unguarded
    assert files(root) == {}


def test_an_attempt_the_step_gave_up_on_changes_nothing_once_the_shard_went_to_a_later_attempt(root):
    """The step lost contact with the worker of its first attempt and resubmitted the shard: the
    first attempt, still running out of reach, is refused from then on; the later one writes."""
    later_attempt = []

    def run(model, shard_id, inputs, on_progress):
        root.write_bytes(FIRST, b"first attempt")
        later_attempt.append(step.next_attempt())  # meanwhile: the step resubmits the shard
        root.write_bytes(SECOND, b"first attempt")

    with shard_write_lock(root, SHARD, PRODUCT, run_id="run-1"):
        step = held_fence(SHARD)
        first = step.next_attempt()
        with pytest.raises(ShardLockLost, match="still its step's, which gave the shard to a later attempt"):
            ShardWorker("lost").run_shard(a_job(run), SHARD, fence=first)
        [second] = later_attempt
        ShardWorker("w").run_shard(a_job(lambda *_: root.write_bytes(SECOND, b"second attempt")), SHARD, fence=second)
        assert files(root) == {FIRST: b"first attempt", SECOND: b"second attempt"}
        assert root.exists(second.attempt_path)
    assert not root.exists(second.attempt_path)  # the step's attempts end with its lock


def test_a_step_whose_lock_was_taken_over_leaves_the_later_holders_attempt_alone(root):
    with contextlib.ExitStack() as later:
        with shard_write_lock(root, SHARD, PRODUCT, run_id="run-killed"):
            step = held_fence(SHARD)
            take_over(root, later)
            theirs = held_fence(SHARD).next_attempt()
            with pytest.raises(ShardLockLost):
                step.next_attempt()
        theirs.check()  # the killed step's exit removed neither their lock nor their attempt


def test_a_takeover_alone_refuses_the_previous_holders_attempts(root):
    """An attempt's fence reads only the attempt file: taking the lock over removes it, so the old
    attempt is refused before the new holder has submitted anything."""
    with contextlib.ExitStack() as later, shard_write_lock(root, SHARD, PRODUCT, run_id="run-killed"):
        attempt = held_fence(SHARD).next_attempt()
        attempt.check()
        take_over(root, later)
        with pytest.raises(ShardLockLost, match=r"now held by .*, run run-later"):
            attempt.check()


def test_the_ray_runner_sends_each_submission_with_a_fresh_attempt_of_the_steps_fence(root, monkeypatch):
    import ray

    from resources.gpu_workers import RayShardRunner

    sent = []

    class Actor:
        class run_shard:  # noqa: N801 - Ray's ``actor.method.remote(...)`` shape
            @staticmethod
            def remote(job, shard_id, next_shard_id, on_progress, fence):
                sent.append(fence)
                return f"outcome of {shard_id}"

    class Pool:
        settings = type("Settings", (), {"shard_attempts": 1})

        def pick(self, model_key):
            return 0

        def actor(self, index):
            return Actor()

    monkeypatch.setattr(ray, "get", lambda call: call)  # the fake actor's call is its result
    runner = RayShardRunner([SHARD], a_job(None), Pool(), log=None)
    with shard_write_lock(root, SHARD, PRODUCT, run_id="run-1") as holder:
        assert runner.run(SHARD) == f"outcome of {SHARD}"
        runner.run(SHARD)  # resubmitted
        first, second = sent
        assert first.token == second.token == holder.token and first.attempt != second.attempt
        second.check()
        with pytest.raises(ShardLockLost, match="later attempt"):
            first.check()
