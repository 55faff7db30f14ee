"""The partitions of the code location, and the tag that puts a shard asset into the per-shard job."""

import dagster as dg

shard_partitions = dg.DynamicPartitionsDefinition(name="shard")
"""One key per landed shard, added by the landing sensor."""

country_partitions = dg.DynamicPartitionsDefinition(name="country")
"""Countries seen in landed metadata, added by the landing sensor."""

language_partitions = dg.DynamicPartitionsDefinition(name="language")
"""ISO 639-1 languages seen in landed metadata, added by the landing sensor."""

PER_SHARD_JOB_NAME = "per_shard_job"
PER_SHARD_TAGS = {"speechdata/per_shard_job": "true"}
"""Tags of a shard asset that runs as soon as its shard lands. ``per_shard_job`` (launched by the
landing sensor) selects every asset carrying them, whatever its group: a new group's shard asset
joins the job by carrying the tag. Shard assets that wait for inputs landed later (the translation
group) leave it out and run from their group's own job."""

PER_SHARD_SELECTION = dg.AssetSelection.tag("speechdata/per_shard_job", "true")
