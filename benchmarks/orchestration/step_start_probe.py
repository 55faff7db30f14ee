"""A trivial asset whose first line records when it ran: how long a step takes to reach user code.

The module imports the code location first, as a step process of the real code location does
(the multiprocess executor's step process loads the job from its module before running it), so
a step started in a fresh process pays that import here too.
"""

from __future__ import annotations

import time

import dagster as dg

import dagster_project.definitions  # noqa: F401  (what a real step process imports before its first line)

PROBE_JOB = "step_start_probe_job"


@dg.asset
def step_start_probe() -> dg.MaterializeResult:
    """Nothing but the time its first line ran (Unix seconds, the event log's clock)."""
    return dg.MaterializeResult(metadata={"first_line_unix_s": dg.FloatMetadataValue(time.time())})


def _probe_job(executor: dg.ExecutorDefinition) -> dg.JobDefinition:
    return dg.Definitions(
        assets=[step_start_probe], jobs=[dg.define_asset_job(PROBE_JOB, executor_def=executor)]
    ).resolve_job_def(PROBE_JOB)


def in_process_probe_job() -> dg.JobDefinition:
    return _probe_job(dg.in_process_executor)


def multiprocess_probe_job() -> dg.JobDefinition:
    return _probe_job(dg.multiprocess_executor)
