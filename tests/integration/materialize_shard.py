"""Materialize every per-shard asset of one shard, in this process: the subprocess the crash test kills.

python -m tests.integration.materialize_shard <data_root> <shard_id> <model_cache_dir> [ASSETS]

``ASSETS``: asset keys separated by commas, or ``every-shard-asset`` for every shard-partitioned
asset of the code location (the per-shard job's and the on-demand ones); default the per-shard job's.
"""

import sys

import dagster as dg

from assets import ON_DEMAND_SHARD_ASSETS, SHARD_ASSETS
from assets.partitions import shard_partitions
from tests.tiny_resources import tiny_resources_for

EVERY_SHARD_ASSET = "every-shard-asset"


def selected(names: str | None) -> list:
    if names is None:
        return SHARD_ASSETS
    everything = SHARD_ASSETS + ON_DEMAND_SHARD_ASSETS
    if names == EVERY_SHARD_ASSET:
        return everything
    wanted = set(names.split(","))
    return [asset for asset in everything if asset.key.to_user_string() in wanted]


def main(root: str, shard_id: str, model_cache_dir: str, names: str | None = None) -> int:
    resources = tiny_resources_for(root, model_cache_dir)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
        result = dg.materialize(selected(names), partition_key=shard_id, instance=instance, resources=resources)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
