"""A finished data root for the export tests: sample shards taken through the per-shard graph in process."""

from __future__ import annotations

import dagster as dg

from speechdata.io.storage import DataRoot
from tests.tiny_resources import tiny_resources_for


def build_finished_root(data_root: DataRoot, model_cache_dir: str, shards=(("e1", 1), ("e2", 2))) -> None:
    """Land ``shards`` (shard id, sample generator seed) and materialize every per-shard asset for each."""
    from assets import SHARD_ASSETS
    from assets.partitions import shard_partitions
    from speechdata.testing.shards import build_sample_shard

    resources = tiny_resources_for(data_root.url, model_cache_dir)
    with dg.instance_for_test() as instance:
        for shard_id, seed in shards:
            build_sample_shard(data_root, shard_id, 5, seed=seed, long_recordings=1)
            instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
            result = dg.materialize(SHARD_ASSETS, partition_key=shard_id, instance=instance, resources=resources)
            assert result.success
