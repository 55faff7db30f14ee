"""The e2e ``dagster dev``'s shorter daemon intervals (tests/e2e/daemon_interval/sitecustomize.py)
still reach Dagster's backfill loop, sensor loop and run queue: a Dagster upgrade that renames a
constant, or stops reading it where the patch expects, fails here by name instead of silently making
the e2e runs slow again."""

import inspect
import os
import subprocess
import sys

import pytest

from tests.e2e.dagster_dev import DAEMON_INTERVAL_DIR


def test_the_backfill_loop_reads_the_daemon_interval_constant_by_name():
    import dagster._daemon.backfill as backfill
    import dagster._daemon.controller as controller

    assert isinstance(controller.DEFAULT_DAEMON_INTERVAL_SECONDS, (int, float))
    source = inspect.getsource(backfill.execute_backfill_iteration_loop)
    assert "from dagster._daemon.controller import DEFAULT_DAEMON_INTERVAL_SECONDS" in source
    assert "DEFAULT_DAEMON_INTERVAL_SECONDS - loop_duration" in source


def test_the_sensor_loop_and_the_run_queue_read_what_the_patch_changes():
    import dagster._daemon.controller as controller
    import dagster._daemon.sensor as sensor

    assert isinstance(sensor.MIN_INTERVAL_LOOP_TIME, (int, float))
    assert "MIN_INTERVAL_LOOP_TIME - loop_duration" in inspect.getsource(sensor.execute_sensor_iteration_loop)
    # The queue daemon is built with the instance's dequeue interval: the patch caps that argument.
    source = " ".join(inspect.getsource(controller.create_daemon_of_type).split())
    assert "QueuedRunCoordinatorDaemon( interval_seconds=instance.run_coordinator.dequeue_interval_seconds" in source


@pytest.mark.slow  # a new interpreter that imports Dagster
def test_the_daemon_process_gets_the_shorter_interval():
    """``python -m dagster._daemon`` is how dagster dev starts its daemon; ``-c`` stands in for it, with
    that module name on the original command line (what sitecustomize looks at)."""
    script = (
        "import dagster._daemon.controller as c, dagster._daemon.sensor as s\n"
        "from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon as Q\n"
        "print(c.DEFAULT_DAEMON_INTERVAL_SECONDS, s.MIN_INTERVAL_LOOP_TIME, Q(interval_seconds=5).interval_seconds)"
    )
    env = {**os.environ, "PYTHONPATH": str(DAEMON_INTERVAL_DIR), "SPEECHDATA_E2E_DAEMON_INTERVAL_S": "2"}
    daemon = subprocess.run(
        [sys.executable, "-c", script, "dagster._daemon"], env=env, capture_output=True, text=True, check=True
    )
    assert [float(value) for value in daemon.stdout.split()] == [2.0, 2.0, 2.0]
