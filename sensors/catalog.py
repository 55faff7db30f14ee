"""Fan-in: refresh the manifest catalog after any shard manifest changes, without re-running shards."""

import os

import dagster as dg

from assets.catalog import CATALOG_JOB_NAME
from resources.storage import DataRootResource, data_root_resource
from speechdata.io.confinement import require_existing_root

SHARD_MANIFEST = dg.AssetKey("shard_manifest")


@dg.sensor(
    name="catalog_refresh_sensor",
    job_name=CATALOG_JOB_NAME,
    minimum_interval_seconds=int(os.environ.get("SPEECHDATA_CATALOG_SENSOR_INTERVAL_S", "30")),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Requests one manifest_catalog refresh per batch of new shard_manifest materializations.",
)
def catalog_refresh_sensor(
    context: dg.SensorEvaluationContext, data_root: DataRootResource
) -> dg.SensorResult | dg.SkipReason:
    # A refresh over an unmounted root would publish an empty catalog: fail the tick, naming the root.
    root = data_root.get()
    require_existing_root(root.root, local=root.is_local, what="catalog_refresh_sensor")
    # The cursor is the storage id of the newest shard_manifest materialization already covered.
    covered = int(context.cursor or 0)
    records = context.instance.fetch_materializations(SHARD_MANIFEST, limit=1).records
    latest = records[0].storage_id if records else 0
    if latest <= covered:
        return dg.SkipReason("no shard manifest changed since the last refresh")
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(run_key=f"catalog-{latest}", tags={"speechdata/launched_by": "catalog_refresh_sensor"})
        ],
        cursor=str(latest),
    )


defs = dg.Definitions(sensors=[catalog_refresh_sensor])
RESOURCES = {"data_root": data_root_resource}
