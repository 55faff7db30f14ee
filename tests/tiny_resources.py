"""The one way tests build resources: every resource the code location binds, for the tiny profile.

The resources come from the code location's own entry point (``dagster_project.definitions.build_resources``),
so a test exercises what a deployment binds; only the model cache (a per-session temporary directory)
and the device (the CPU) differ. A test that needs one resource changed passes it in ``overrides``.
"""

from __future__ import annotations

from typing import Any


def tiny_resources_for(data_root_url: str, model_cache_dir: str | None = None, **overrides: Any) -> dict:
    """Every bound resource for the tiny profile on the data root at ``data_root_url``, models on the
    CPU; ``overrides`` replace resources by key.

    Locally built models are kept in ``model_cache_dir``: pass the session's (the ``model_cache_dir``
    fixture) when the assets load models, so they are built once. Without it, a new empty directory
    is used, which suits assets that load none."""
    import tempfile

    from dagster_project.definitions import build_resources

    if model_cache_dir is None:
        model_cache_dir = tempfile.mkdtemp(prefix="speechdata-test-models-")
    resources = build_resources(data_root_url, profile="tiny")
    for key, resource in resources.items():
        # Every resource that builds models locally names its directory `model_cache_dir`.
        if "model_cache_dir" in getattr(type(resource), "model_fields", {}):
            resources[key] = resource.model_copy(update={"model_cache_dir": model_cache_dir})
    resources["torch_device"] = resources["torch_device"].model_copy(update={"device": "cpu"})
    unknown = set(overrides) - set(resources)
    if unknown:
        raise KeyError(f"no resource is bound under {sorted(unknown)}; bound: {sorted(resources)}")
    return {**resources, **overrides}
