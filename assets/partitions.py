import dagster as dg

shard_partitions = dg.DynamicPartitionsDefinition(name="shard")
"""One key per landed shard, added by the landing sensor."""

country_partitions = dg.DynamicPartitionsDefinition(name="country")
"""Countries seen in landed metadata, added by the landing sensor."""

language_partitions = dg.DynamicPartitionsDefinition(name="language")
"""ISO 639-1 languages seen in landed metadata, added by the landing sensor."""
