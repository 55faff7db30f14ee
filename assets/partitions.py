"""The partitions of the code location, and the tag that puts a shard asset into the per-shard job."""

from collections.abc import Iterable

import dagster as dg

from speechdata.io.layout import KEY_KINDS, is_valid_key, validate_key

shard_partitions = dg.DynamicPartitionsDefinition(name="shard")
"""One key per landed shard, added by the landing sensor."""

country_partitions = dg.DynamicPartitionsDefinition(name="country")
"""Countries seen in landed metadata, added by the landing sensor."""

language_partitions = dg.DynamicPartitionsDefinition(name="language")
"""ISO 639-1 languages seen in landed metadata, added by the landing sensor."""

PARTITION_KEY_KINDS = {
    shard_partitions.name: "shard",
    country_partitions.name: "country",
    language_partitions.name: "language",
}
"""The key kind (``speechdata.io.layout.KEY_KINDS``) of each partitions definition: the one validator
every key of it passes, where it enters (sensor, asset, CLI) and where it becomes a path."""


def key_kind_of(partitions_def: dg.PartitionsDefinition) -> str:
    """The key kind of ``partitions_def``; a definition with none is refused by name."""
    kind = PARTITION_KEY_KINDS.get(getattr(partitions_def, "name", None) or "")
    if kind is None or kind not in KEY_KINDS:
        raise ValueError(
            f"partitions definition {partitions_def!r} has no key kind: add it to PARTITION_KEY_KINDS "
            "(assets/partitions.py) so its keys are validated before any asset uses them as paths"
        )
    return kind


def validate_partition_keys(kind: str, keys: Iterable[str]) -> list[str]:
    """Every key, each valid for ``kind``; the first that is not raises ``InvalidKey`` naming it."""
    return [validate_key(kind, key) for key in keys]


def add_partition_keys(
    instance: dg.DagsterInstance, partitions_def: dg.DynamicPartitionsDefinition, values
) -> list[str]:
    """Add the new ``values`` of ``partitions_def`` the instance does not have yet; values that are not
    valid keys of its kind are left out (they would fail every asset of the partition). Returns the
    keys added."""
    kind = key_kind_of(partitions_def)
    known = set(instance.get_dynamic_partitions(partitions_def.name))
    new = sorted({value for value in values if value and value not in known and is_valid_key(kind, value)})
    if new:
        instance.add_dynamic_partitions(partitions_def.name, new)
    return new


PER_SHARD_JOB_NAME = "per_shard_job"
PER_SHARD_TAGS = {"speechdata/per_shard_job": "true"}
"""Tags of a shard asset that runs as soon as its shard lands. ``per_shard_job`` (launched by the
landing sensor) selects every asset carrying them, whatever its group: a new group's shard asset
joins the job by carrying the tag. Shard assets that wait for inputs landed later (the translation
group) leave it out and run from their group's own job."""

PER_SHARD_SELECTION = dg.AssetSelection.tag("speechdata/per_shard_job", "true")
