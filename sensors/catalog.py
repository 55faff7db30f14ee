"""Fan-in: refresh the manifest catalog after any shard manifest changes, without re-running shards."""

import dagster as dg

CATALOG_JOB_NAME = "manifest_catalog_job"
SHARD_MANIFEST = dg.AssetKey("shard_manifest")


@dg.sensor(
    name="catalog_refresh_sensor",
    job_name=CATALOG_JOB_NAME,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests one manifest_catalog refresh per batch of new shard_manifest materializations.",
)
def catalog_refresh_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
    # The cursor is the storage id of the newest shard_manifest materialization already covered.
    covered = int(context.cursor or 0)
    event = context.instance.get_latest_materialization_event(SHARD_MANIFEST)
    latest = event.storage_id if event is not None else 0
    if latest <= covered:
        return dg.SkipReason("no shard manifest changed since the last refresh")
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_key=f"catalog-{latest}", tags={"speechdata/launched_by": "catalog_refresh_sensor"})],
        cursor=str(latest),
    )
