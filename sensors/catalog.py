"""Fan-in: refresh the manifest catalog after any file it summarizes changes, without re-running shards."""

import os
import time

import dagster as dg

from assets.catalog import CATALOG_JOB_NAME
from resources.storage import DataRootResource
from speechdata import products
from speechdata.catalog.refresh_cursor import RefreshCursor, RunOutcome, decide_refresh
from speechdata.io.confinement import require_existing_root


def catalogued_assets() -> tuple[dg.AssetKey, ...]:
    """Assets whose files the catalog's accounting and views read (each product line's output asset
    and its ``catalog_assets``, :func:`speechdata.products.catalogued_assets`): a materialization of
    any of them asks for a refresh, so ``shard_accounting`` is current after a translation or
    publishing run as well as after a shard's manifest. Read from the registry at each tick."""
    return tuple(dg.AssetKey(name) for name in products.catalogued_assets())


RUN_KEY_TAG = "dagster/run_key"
_FAILED = {dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _outcome(instance: dg.DagsterInstance, run_key: str) -> RunOutcome:
    runs = instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: run_key}), limit=1)
    if not runs:
        return RunOutcome.PENDING
    if runs[0].status == dg.DagsterRunStatus.SUCCESS:
        return RunOutcome.SUCCEEDED
    return RunOutcome.FAILED if runs[0].status in _FAILED else RunOutcome.PENDING


def _latest_materialization(instance: dg.DagsterInstance, key: dg.AssetKey) -> int:
    records = instance.fetch_materializations(key, limit=1).records
    return records[0].storage_id if records else 0


@dg.sensor(
    name="catalog_refresh_sensor",
    job_name=CATALOG_JOB_NAME,
    minimum_interval_seconds=int(os.environ.get("SPEECHDATA_CATALOG_SENSOR_INTERVAL_S", "30")),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests one manifest_catalog refresh per batch of new materializations of the assets the "
    "catalog summarizes (each product line's output asset and the assets its catalog views read: "
    "speechdata.products), and again when that refresh failed.",
)
def catalog_refresh_sensor(
    context: dg.SensorEvaluationContext, data_root: DataRootResource
) -> dg.SensorResult | dg.SkipReason:
    # A refresh over an unmounted root would publish an empty catalog: fail the tick, naming the root.
    root = data_root.get()
    require_existing_root(root.root, local=root.is_local, what="catalog_refresh_sensor")
    # Changes are storage ids of the catalogued assets' materializations (one event log, so ids of
    # different assets compare); the cursor moves past one only once a refresh requested after it
    # succeeded (speechdata.catalog.refresh_cursor).
    cursor = RefreshCursor.from_json(context.cursor)
    latest = max((_latest_materialization(context.instance, key) for key in catalogued_assets()), default=0)
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
