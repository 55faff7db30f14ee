import dagster as dg

from assets import PER_SHARD_JOB_NAME, SHARD_ASSETS
from assets.partitions import shard_partitions

per_shard_job = dg.define_asset_job(
    PER_SHARD_JOB_NAME,
    selection=dg.AssetSelection.assets(*SHARD_ASSETS),
    partitions_def=shard_partitions,
    description="Everything one shard feeds, from its landing validation on. Launched by landing_sensor.",
)

ALL_JOBS = [per_shard_job]
