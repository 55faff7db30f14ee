"""The e2e ``dagster dev``'s shorter backfill interval (tests/e2e/daemon_interval/sitecustomize.py)
still reaches Dagster's backfill loop: a Dagster upgrade that renames the constant, or stops reading
it at each loop start, fails here by name instead of silently making the e2e backfills slow again."""

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


@pytest.mark.slow  # a new interpreter that imports Dagster
def test_the_daemon_process_gets_the_shorter_interval():
    """``python -m dagster._daemon`` is how dagster dev starts its daemon; ``-c`` stands in for it, with
    that module name on the original command line (what sitecustomize looks at)."""
    script = "import dagster._daemon.controller as c; print(c.DEFAULT_DAEMON_INTERVAL_SECONDS)"
    env = {**os.environ, "PYTHONPATH": str(DAEMON_INTERVAL_DIR), "SPEECHDATA_E2E_DAEMON_INTERVAL_S": "2"}
    daemon = subprocess.run(
        [sys.executable, "-c", script, "dagster._daemon"], env=env, capture_output=True, text=True, check=True
    )
    assert float(daemon.stdout.strip()) == 2.0
