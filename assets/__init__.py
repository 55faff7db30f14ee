"""Software-defined assets, one module per asset group. Each asset is thin: it reads its inputs
through a resource, calls ``speechdata`` and reports what it wrote.

A group module (``assets/<group>.py``, the group's name) declares its assets with
``assets.asset_policy.shard_asset`` / ``group_asset`` (their checks are declared on them), its jobs,
and ends with ``defs``: a ``dg.Definitions`` of those assets and jobs. It also sets
``UI_POSITION``, an int: where the UI lists the group. The code location finds every module of
this package that has a ``defs``, as it finds sensor modules; the resources its assets need are
bound once, in ``dagster_project.loader.RESOURCE_FACTORIES``. Adding a group: README, "How to add an
asset group".
"""

import importlib
import pkgutil
from collections.abc import Iterable
from types import ModuleType

from assets.partitions import PER_SHARD_TAGS


def groups_in_ui_order(modules: Iterable[ModuleType]) -> list[ModuleType]:
    """The modules that have a ``defs`` (the asset groups), sorted by their ``UI_POSITION``.

    A group without an int ``UI_POSITION``, or two groups with the same one, fail the load naming
    the modules: the UI order is never left to import order.
    """
    groups = [module for module in modules if hasattr(module, "defs")]
    unplaced = [module.__name__ for module in groups if not isinstance(getattr(module, "UI_POSITION", None), int)]
    if unplaced:
        raise ValueError(f"asset group module(s) {unplaced} have a `defs` but no int `UI_POSITION`")
    by_position: dict[int, list[str]] = {}
    for module in groups:
        by_position.setdefault(module.UI_POSITION, []).append(module.__name__)
    shared = {position: names for position, names in by_position.items() if len(names) > 1}
    if shared:
        raise ValueError(f"asset groups share a UI_POSITION: {shared}")
    return sorted(groups, key=lambda module: module.UI_POSITION)


def group_modules() -> list[ModuleType]:
    """Every asset group module (a module of this package with a ``defs``), in the order the UI lists them."""
    return groups_in_ui_order(
        importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
    )


GROUP_MODULES = group_modules()

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
