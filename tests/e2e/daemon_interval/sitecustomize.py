"""Test-only: the e2e ``dagster dev``'s daemon looks at backfills every few seconds instead of every 30.

Dagster's backfill daemon sleeps ``dagster._daemon.controller.DEFAULT_DAEMON_INTERVAL_SECONDS`` (30 s,
no instance setting changes it) between iterations, so each backfill waited up to 30 s for its runs
to be submitted and up to 30 s more to be marked finished once they were: about two idle minutes
over the UI module's four backfills. ``tests/e2e/dagster_dev.py`` puts this folder first on the
``PYTHONPATH`` of ``dagster dev`` with ``SPEECHDATA_E2E_DAEMON_INTERVAL_S`` set; Python imports this
module at the start of each of its processes, and only the daemon's (``python -m dagster._daemon``)
changes the interval. The backfill logic the tests check is Dagster's, unchanged; it runs sooner.
"""

import os
import sys

INTERVAL_ENV = "SPEECHDATA_E2E_DAEMON_INTERVAL_S"

if os.environ.get(INTERVAL_ENV) and "dagster._daemon" in sys.orig_argv:
    import dagster._daemon.controller as controller

    # Read by the backfill loop at each iteration (dagster._daemon.backfill imports it by name then).
    controller.DEFAULT_DAEMON_INTERVAL_SECONDS = float(os.environ[INTERVAL_ENV])
