"""The one way a test materializes shard assets in process.

``materialize_shard`` registers the shard's partition (a no-op when it is registered already) and
materializes the selection for it on the given instance, with the tiny resources on the data root
unless the test binds its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg

from assets.partitions import shard_partitions
from speechdata.io.storage import DataRoot
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
    ``dg.materialize`` (``run_config``, ``raise_on_error``, ``tags``). ``data_root`` may be None when
    ``resources`` are given."""
    instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
    return dg.materialize(
        list(assets),
        partition_key=shard_id,
        instance=instance,
        resources=dict(resources) if resources is not None else tiny_resources_for(data_root.url, model_cache_dir),
        **materialize_kwargs,
    )
