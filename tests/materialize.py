"""The one way a test materializes shard assets in process, and the shared built roots.

``materialize_shard`` registers the shard's partition (a no-op when it is registered already) and
materializes the selection for it on the given instance, with the tiny resources on the data root
unless the test binds its own. ``land_and_build`` lands a sample shard first.

``copy_built_root`` is how a test that mutates starts from a root built once per module or session:
a copy of a built data root costs milliseconds, building it costs seconds to minutes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from assets.partitions import shard_partitions
from speechdata.io.storage import DataRoot
from speechdata.testing.shards import build_sample_shard
from tests.tiny_resources import tiny_resources_for


def materialize_shard(
    instance: dg.DagsterInstance,
    data_root: DataRoot | None,
    shard_id: str,
    assets: Iterable,
    *,
    resources: Mapping[str, Any] | None = None,
    model_cache_dir: str | None = None,
    **materialize_kwargs,
) -> dg.ExecuteInProcessResult:
    """Register ``shard_id`` and materialize ``assets`` for it; ``materialize_kwargs`` go to
    ``dg.materialize`` (``run_config``, ``raise_on_error``, ``tags``)."""
    instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
    return dg.materialize(
        list(assets),
        partition_key=shard_id,
        instance=instance,
        resources=dict(resources) if resources is not None else tiny_resources_for(data_root.url, model_cache_dir),
        **materialize_kwargs,
    )


def land_and_build(
    instance: dg.DagsterInstance,
    data_root: DataRoot | None,
    shard_id: str,
    assets: Iterable,
    n_utterances: int,
    *,
    landing: Mapping[str, Any] | None = None,
    **materialize_kwargs,
) -> dg.ExecuteInProcessResult:
    """Land a sample shard of ``n_utterances`` (``landing``: ``build_sample_shard``'s keywords), then
    materialize ``assets`` for it (``materialize_shard``'s keywords)."""
    build_sample_shard(data_root, shard_id, n_utterances, **dict(landing or {}))
    return materialize_shard(instance, data_root, shard_id, assets, **materialize_kwargs)


def copy_built_root(built: DataRoot, target: Path) -> DataRoot:
    """A private copy of a local data root built once by a shared fixture, for a test that writes to it."""
    shutil.copytree(built.root, target, symlinks=True)
    return DataRoot(str(target))
