"""Test-only: the e2e ``dagster dev``'s daemon looks at backfills, sensors and the run queue every few
seconds instead of every 30, 5 and 5.

Dagster's backfill daemon sleeps ``dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS`` (30 s,
no instance setting changes it) between iterations, so each backfill waited up to 30 s for its runs
to be submitted and up to 30 s more to be marked finished once they were: about two idle minutes
over the UI module's four backfills. The sensor daemon evaluates sensors at most every
``dagster._daemon.sensor.MIN_INTERVAL_LOOP_TIME`` (5 s, whatever a sensor's own minimum interval), so
a landing sensor set to 2 s ticked every 5 and took up to 10 s to register a shard and launch its run;
the run queue is read every ``dequeue_interval_seconds`` (5 s by default), up to 5 s more per run.
``tests/e2e/dagster_dev.py`` puts this folder first on the ``PYTHONPATH`` of ``dagster dev`` with
``SPEECHDATA_E2E_DAEMON_INTERVAL_S`` set; Python imports this module at the start of each of its
processes, and only the daemon's (``python -m dagster._daemon``) changes the intervals, to at most that
value. The backfill, sensor and queue logic the tests check is Dagster's, unchanged; it runs sooner.
"""

import os
import sys

INTERVAL_ENV = "SPEECHDATA_E2E_DAEMON_INTERVAL_S"

if os.environ.get(INTERVAL_ENV) and "dagster._daemon" in sys.orig_argv:
    import dagster._daemon.controller as controller
    import dagster._daemon.sensor as sensor_daemon
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

    interval_s = float(os.environ[INTERVAL_ENV])
    # Read by the backfill loop at each iteration (dagster._daemon.backfill imports it by name then).
    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = interval_s
    # Read by the sensor loop at the end of each iteration (a module global of dagster._daemon.sensor).
    sensor_daemon.MIN_INTERVAL_LOOP_TIME = min(sensor_daemon.MIN_INTERVAL_LOOP_TIME, interval_s)

    # The controller builds the queue daemon with the instance's dequeue interval: cap what it passes.
    _queue_daemon_init = QueuedRunCoordinatorDaemon.__init__

    def _queue_daemon_init_capped(self, interval_seconds, *args, **kwargs):
        _queue_daemon_init(self, min(interval_seconds, interval_s), *args, **kwargs)

    QueuedRunCoordinatorDaemon.__init__ = _queue_daemon_init_capped
