"""The loader: assembles the code location's ``Definitions`` from the asset groups and sensor modules.

It merges each asset group's ``defs`` (``assets.GROUPS``) and each sensor module's
(``sensors/*.py``) with ``dg.Definitions.merge``, and builds the resources they declare in their
``RESOURCES`` (one factory call per key, so groups share a resource). Nothing here names a group.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from types import ModuleType

import dagster as dg

import assets
import sensors
from dagster_project.execution import executor_from_env
from dagster_project.settings import PROJECT_ROOT, data_root_url, model_profile
from resources.profile import model_profile_resource
from resources.settings import ResourceFactory, ResourceSettings

PLATFORM_RESOURCES: dict[str, ResourceFactory] = {"model_profile": model_profile_resource}
"""Resources no asset reads but the UI shows: which model profile this deployment runs."""


DAGSTER_DEFAULT_RESOURCES = {"io_manager"}
"""Dagster supplies these; the assets return MaterializeResult, so the default IO manager stores nothing."""


def sensor_modules() -> list[ModuleType]:
    """Every module of the ``sensors`` package: each holds the sensors of one group."""
    return [importlib.import_module(f"sensors.{info.name}") for info in pkgutil.iter_modules(sensors.__path__)]


def definition_modules() -> list[ModuleType]:
    return [*assets.GROUP_MODULES, *sensor_modules()]


def resource_factories(modules: Iterable[ModuleType] | None = None) -> dict[str, ResourceFactory]:
    """The union of the modules' ``RESOURCES``, after checking each declares what its definitions need."""
    factories = dict(PLATFORM_RESOURCES)
    for module in definition_modules() if modules is None else modules:
        declared = module.RESOURCES
        needed = _required_resource_keys(module.defs)
        if needed - set(declared):
            raise ValueError(
                f"{module.__name__}: its definitions need resource(s) {sorted(needed - set(declared))} "
                f"that its RESOURCES does not declare (declared: {sorted(declared)})"
            )
        for key, factory in declared.items():
            if factories.setdefault(key, factory) is not factory:
                raise ValueError(f"{module.__name__}: resource {key!r} has a different factory in another group")
    return factories


def _required_resource_keys(defs: dg.Definitions) -> set[str]:
    keys: set[str] = set()
    for definition in [*(defs.assets or []), *(defs.sensors or [])]:
        keys |= set(getattr(definition, "required_resource_keys", set()))
    return keys - DAGSTER_DEFAULT_RESOURCES


def build_resources(data_root: str | None = None, profile: str | None = None) -> dict:
    """Every declared resource, built for ``data_root`` (default ``DATA_ROOT``) and ``profile``
    (default ``SPEECHDATA_PROFILE``)."""
    settings = ResourceSettings(
        data_root_url=data_root or data_root_url(),
        profile=profile or model_profile(),
        model_cache_dir=str(PROJECT_ROOT / ".cache" / "models"),
    )
    return {key: factory(settings) for key, factory in resource_factories().items()}


def build_definitions(data_root: str | None = None, profile: str | None = None) -> dg.Definitions:
    return dg.Definitions.merge(
        *(module.defs for module in definition_modules()),
        dg.Definitions(resources=build_resources(data_root, profile), executor=executor_from_env()),
    )
