import dagster as dg

from assets import ON_DEMAND_SHARD_ASSETS, PER_SHARD_JOB_NAME, SHARD_ASSETS, TRANSLATION_JOB_NAME, manifest_catalog
from assets.partitions import shard_partitions
from sensors.catalog import CATALOG_JOB_NAME
from sensors.publishing import hf_dataset_job, hf_publish_job

per_shard_job = dg.define_asset_job(
    PER_SHARD_JOB_NAME,
    selection=dg.AssetSelection.assets(*SHARD_ASSETS),
    partitions_def=shard_partitions,
    description="Everything one shard feeds, from its landing validation on. Launched by landing_sensor.",
)

manifest_catalog_job = dg.define_asset_job(
    CATALOG_JOB_NAME,
    selection=dg.AssetSelection.assets(manifest_catalog),
    description="Refresh the DuckDB catalog over every shard manifest. Launched by catalog_refresh_sensor.",
)

translation_job = dg.define_asset_job(
    TRANSLATION_JOB_NAME,
    selection=dg.AssetSelection.assets(*ON_DEMAND_SHARD_ASSETS),
    partitions_def=shard_partitions,
    description="Streaming segments, MetricX QE and filtered pairs for a shard whose LLM segmentation has landed.",
)

ALL_JOBS = [per_shard_job, manifest_catalog_job, translation_job, hf_dataset_job, hf_publish_job]
