"""Fan-in: refresh the manifest catalog after any shard manifest changes, without re-running shards."""

import os
import time

import dagster as dg

from assets.catalog import CATALOG_JOB_NAME
from resources.storage import DataRootResource
from speechdata.catalog.refresh_cursor import RefreshCursor, RunOutcome, decide_refresh
from speechdata.io.confinement import require_existing_root

SHARD_MANIFEST = dg.AssetKey("shard_manifest")
RUN_KEY_TAG = "dagster/run_key"
_FAILED = {dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _outcome(instance: dg.DagsterInstance, run_key: str) -> RunOutcome:
    runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
    if not runs:
        return RunOutcome.PENDING
    if runs[0].status == dg.DagsterRunStatus.SUCCESS:
        return RunOutcome.SUCCEEDED
    return RunOutcome.FAILED if runs[0].status in _FAILED else RunOutcome.PENDING


@dg.sensor(
    name="catalog_refresh_sensor",
    job_name=CATALOG_JOB_NAME,
    minimum_interval_seconds=int(os.environ.get("SPEECHDATA_CATALOG_SENSOR_INTERVAL_S", "30")),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests one manifest_catalog refresh per batch of new shard_manifest materializations, "
    "and again when that refresh failed.",
)
def catalog_refresh_sensor(
    context: dg.SensorEvaluationContext, data_root: DataRootResource
) -> dg.SensorResult | dg.SkipReason:
    # A refresh over an unmounted root would publish an empty catalog: fail the tick, naming the root.
    root = data_root.get()
    require_existing_root(root.root, local=root.is_local, what="catalog_refresh_sensor")
    # Changes are storage ids of shard_manifest materializations; the cursor moves past one only
    # once a refresh requested after it succeeded (speechdata.catalog.refresh_cursor).
    cursor = RefreshCursor.from_json(context.cursor)
    records = context.instance.fetch_materializations(SHARD_MANIFEST, limit=1).records
    latest = records[0].storage_id if records else 0
    outcome = _outcome(context.instance, cursor.run_key) if cursor.run_key else None
    decision = decide_refresh(cursor, latest, outcome, now=time.time())
    if decision.run_key is None:
        context.update_cursor(decision.cursor.to_json())
        return dg.SkipReason(decision.reason)
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(run_key=decision.run_key, tags={"speechdata/launched_by": "catalog_refresh_sensor"})
        ],
        cursor=decision.cursor.to_json(),
    )


defs = dg.Definitions(sensors=[catalog_refresh_sensor])
