"""The local multi-node Ray cluster the Ray tests run on (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

NODES = 2


def start_cluster(node: dict, nodes: int = NODES, attempts: int = 3):
    """A cluster of ``nodes`` nodes started with ``node``'s options; a node that misses Ray's fixed
    30 s startup window on a loaded machine is started again."""
    from ray.cluster_utils import Cluster

    for attempt in range(1, attempts + 1):
        cluster = Cluster()
        try:
            cluster.add_node(**node, include_dashboard=False)
            for _ in range(nodes - 1):
                cluster.add_node(**node)
            return cluster
        except Exception:
            cluster.shutdown()
            if attempt == attempts:
                raise
