"""Software-defined assets, one module per asset group. Each asset is thin: it reads its inputs
through a resource, calls ``speechdata`` and reports what it wrote.

A group module owns its assets (their checks are declared on them), its jobs, and ends with

* ``defs``: a ``dg.Definitions`` of those assets and jobs;
* ``RESOURCES``: ``{resource key: factory}``, the resources its assets need (factories live beside
  their resource classes in ``resources/``).

Its sensors, if any, live in ``sensors/<module>.py`` with the same two names. The code location
(``dagster_project/definitions.py``) merges every group listed in ``GROUPS`` and every sensor
module. Adding a group: README, "How to add an asset group".
"""

import importlib

from assets.partitions import PER_SHARD_TAGS

GROUPS = (
    "ingest",
    "alignment",
    "features",
    "packaging",
    "catalog",
    "publishing",
    "translation",
    "asr_training",
    "vad",
)
"""The asset group modules, in the order the UI lists them: one line per group."""

GROUP_MODULES = [importlib.import_module(f"assets.{name}") for name in GROUPS]

ALL_ASSETS = [asset for module in GROUP_MODULES for asset in module.defs.assets]


def _partitioned_by(asset, name: str) -> bool:
    partitions = asset.partitions_def
    return partitions is not None and getattr(partitions, "name", None) == name


SHARD_ASSETS = [
    asset for asset in ALL_ASSETS if PER_SHARD_TAGS.items() <= dict(asset.specs_by_key[asset.key].tags).items()
]
"""Every asset of the per-shard job (launched by the landing sensor): those tagged ``PER_SHARD_TAGS``."""

ON_DEMAND_SHARD_ASSETS = [
    asset for asset in ALL_ASSETS if _partitioned_by(asset, "shard") and asset not in SHARD_ASSETS
]
"""Shard-partitioned, but not in the per-shard job: they need inputs landed later (the LLM
segmentation JSONs), so they run from the translation job or a backfill for the shards that have them."""
