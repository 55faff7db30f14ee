"""Materialize every per-shard asset of one shard, in this process: the subprocess the crash test kills.

python -m tests.integration.materialize_shard <data_root> <shard_id> <model_cache_dir>
"""

import sys

import dagster as dg

from assets import SHARD_ASSETS
from assets.partitions import shard_partitions
from tests.tiny_resources import tiny_resources_for


def main(root: str, shard_id: str, model_cache_dir: str) -> int:
    resources = tiny_resources_for(root, model_cache_dir)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
        result = dg.materialize(SHARD_ASSETS, partition_key=shard_id, instance=instance, resources=resources)
    return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
