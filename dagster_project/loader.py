"""The loader: assembles the code location's ``Definitions`` from the asset groups and sensor modules.

It merges each asset group's ``defs`` (``assets.GROUP_MODULES``: every module of ``assets`` with a
``defs``) and each sensor module's (``sensors/*.py``) with ``dg.Definitions.merge``, and binds the
resources once, from ``RESOURCE_FACTORIES`` (one factory call per key, so every group shares a
resource). Nothing here names a group.
"""

from __future__ import annotations

import importlib
import pkgutil
import warnings
from collections.abc import Iterable
from types import ModuleType

import dagster as dg

import assets
import sensors
from dagster_project.execution import executor_from_env
from dagster_project.product_graph import check_product_lines
from dagster_project.settings import PROJECT_ROOT, data_root_url, model_profile
from resources.aligner import aligner_resource
from resources.catalog import catalog_resource
from resources.encoders import qwen_resource, wavlm_resource
from resources.gpu_workers import gpu_workers_resource
from resources.hub import hf_dataset_settings_resource, hub_resource
from resources.model_pins import MODEL_BOUND_ASSETS, profile_code_version
from resources.profile import model_profile_resource
from resources.qe import qe_resource
from resources.quality import quality_models_resource
from resources.settings import ResourceFactory, ResourceSettings
from resources.storage import data_root_resource
from resources.text_tokenizer import text_tokenizer_resource
from resources.torch_device import torch_device_resource
from resources.vad import vad_resource
from speechdata.profiles import PROFILE_ENV, Profile, check_profile

RESOURCE_FACTORIES: dict[str, ResourceFactory] = {
    "data_root": data_root_resource,
    "aligner": aligner_resource,
    "text_tokenizer": text_tokenizer_resource,
    "torch_device": torch_device_resource,
    "qwen": qwen_resource,
    "wavlm": wavlm_resource,
    "gpu_workers": gpu_workers_resource,
    "catalog": catalog_resource,
    "hf_dataset_settings": hf_dataset_settings_resource,
    "hub": hub_resource,
    "qe": qe_resource,
    "vad": vad_resource,
    "quality_models": quality_models_resource,
    # No asset reads it, but the UI shows which model profile this deployment runs.
    "model_profile": model_profile_resource,
}
"""Every resource of the code location, ``{resource key: factory}`` (factories live beside their
resource classes in ``resources/``): the one place a resource key is bound."""


DAGSTER_DEFAULT_RESOURCES = {"io_manager"}
"""Dagster supplies these; the assets return MaterializeResult, so the default IO manager stores nothing."""


def sensor_modules() -> list[ModuleType]:
    """Every module of the ``sensors`` package: each holds the sensors of one group."""
    return [importlib.import_module(f"sensors.{info.name}") for info in pkgutil.iter_modules(sensors.__path__)]


def definition_modules() -> list[ModuleType]:
    return [*assets.GROUP_MODULES, *sensor_modules()]


def resource_factories(
    modules: Iterable[ModuleType] | None = None, bound: dict[str, ResourceFactory] | None = None
) -> dict[str, ResourceFactory]:
    """``bound`` (default ``RESOURCE_FACTORIES``), after checking it binds every resource key the
    modules' definitions need: a new asset that needs an unbound resource fails here, at load,
    naming its module, rather than at its first run."""
    factories = RESOURCE_FACTORIES if bound is None else bound
    for module in definition_modules() if modules is None else modules:
        unbound = _required_resource_keys(module.defs) - set(factories)
        if unbound:
            raise ValueError(
                f"{module.__name__}: its definitions need resource(s) {sorted(unbound)} that "
                f"dagster_project.loader.RESOURCE_FACTORIES does not bind (bound: {sorted(factories)})"
            )
    return dict(factories)


def _required_resource_keys(defs: dg.Definitions) -> set[str]:
    keys: set[str] = set()
    for definition in [*(defs.assets or []), *(defs.sensors or [])]:
        keys |= set(getattr(definition, "required_resource_keys", set()))
    return keys - DAGSTER_DEFAULT_RESOURCES


def build_resources(data_root: str | None = None, profile: str | None = None) -> dict:
    """Every bound resource, built for ``data_root`` (default ``DATA_ROOT``) and ``profile``
    (default ``SPEECHDATA_PROFILE``).

    The asset modules' own definitions carry the code versions of the environment's profile; a
    ``profile`` whose models differ from those would run one model and record another, so it is
    refused here: :func:`build_definitions` builds assets and resources for any profile."""
    resolved = check_profile(profile) if profile else model_profile()
    imported_with = model_profile()
    if any(
        profile_code_version(name, resolved) != profile_code_version(name, imported_with) for name in MODEL_BOUND_ASSETS
    ):
        raise ValueError(
            f"build_resources(profile={resolved!r}) under {PROFILE_ENV}={imported_with!r}: the assets imported "
            f"from their modules record the models of {imported_with!r}; set {PROFILE_ENV}={resolved} or "
            f"use build_definitions(profile={resolved!r}), which builds both for one profile"
        )
    return _resources_for(data_root, resolved)


def _resources_for(data_root: str | None, profile: Profile) -> dict:
    settings = ResourceSettings(
        data_root_url=data_root or data_root_url(),
        profile=profile,
        model_cache_dir=str(PROJECT_ROOT / ".cache" / "models"),
    )
    return {key: factory(settings) for key, factory in resource_factories().items()}


def with_profile_code_versions(defs: dg.Definitions, profile: Profile) -> dg.Definitions:
    """``defs`` with every model-bound asset's code version naming the model ``profile`` runs."""

    def rewrite(spec: dg.AssetSpec) -> dg.AssetSpec:
        code_version = profile_code_version(spec.key.to_user_string(), profile)
        return spec if code_version is None else spec.replace_attributes(code_version=code_version)

    with warnings.catch_warnings():
        # map_asset_specs is marked preview; tests/integration/test_model_profile_source.py pins what it does here.
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return defs.map_asset_specs(func=rewrite)


def build_definitions(data_root: str | None = None, profile: str | None = None) -> dg.Definitions:
    """The code location for ``profile`` (default ``SPEECHDATA_PROFILE``): the one place it is read,
    then passed to the resources and to the code versions of the assets whose output depends on a model."""
    check_product_lines(assets.ALL_ASSETS)
    resolved = check_profile(profile) if profile else model_profile()
    return dg.Definitions.merge(
        with_profile_code_versions(dg.Definitions.merge(*(module.defs for module in definition_modules())), resolved),
        dg.Definitions(resources=_resources_for(data_root, resolved), executor=executor_from_env()),
    )
