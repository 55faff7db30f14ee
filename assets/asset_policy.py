"""The one place the code location's asset policy is declared.

Every asset of a group module is declared with :func:`shard_asset` (partitioned by shard) or
:func:`group_asset` (anything else). They apply what all assets share: the group (the name of the
module that declares the asset, so a group is exactly one module), the owners, and for shard assets
the shard partitions, the per-shard job's tags, the backfill policy and the per-shard check specs,
plus the `gpu` pool and its Kubernetes op tags for GPU steps. An asset passes only what is its own:
its kinds, code version, deps, checks, and whether it needs a GPU or waits for later inputs.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterable

import dagster as dg

from assets.gpu_pool import GPU_OP_TAGS, GPU_POOL
from assets.partitions import PER_SHARD_TAGS, key_kind_of, shard_partitions, validate_partition_keys
from assets.shard_runs import SHARD_BACKFILL_POLICY

OWNERS = ["team:speech-data"]

AssetDecorator = Callable[[Callable[..., object]], dg.AssetsDefinition]


def group_of(module_name: str) -> str:
    """The group of an asset declared in ``assets.<group>``."""
    return module_name.rsplit(".", 1)[-1]


def shard_asset(
    *,
    kinds: Iterable[str],
    code_version: str,
    deps: Iterable[dg.CoercibleToAssetDep] = (),
    checks: dict[str, str] | None = None,
    gpu: bool = False,
    in_per_shard_job: bool = True,
) -> AssetDecorator:
    """A shard-partitioned asset that materializes through ``materialize_shards``.

    ``code_version``: bump it whenever the same inputs would give other output bytes, so every
    partition built before shows stale (what changed belongs in the commit, not in a comment).
    ``checks``: ``{check name: description}``, blocking checks evaluated once per shard.
    ``gpu``: the step runs in the `gpu` pool and asks Kubernetes for one GPU.
    ``in_per_shard_job``: False for assets whose inputs land later than the shard (the landing
    sensor's per-shard job leaves them out; their group's own job runs them).
    """

    return lambda compute: _declare(
        compute,
        checks,
        shard_partitions,
        deps=list(deps),
        partitions_def=shard_partitions,
        tags=PER_SHARD_TAGS if in_per_shard_job else None,
        kinds=set(kinds),
        pool=GPU_POOL if gpu else None,
        op_tags=GPU_OP_TAGS if gpu else None,
        code_version=code_version,
        backfill_policy=SHARD_BACKFILL_POLICY,
    )


def group_asset(
    *,
    kinds: Iterable[str],
    code_version: str,
    deps: Iterable[dg.CoercibleToAssetDep] = (),
    checks: dict[str, str] | None = None,
    partitions_def: dg.PartitionsDefinition | None = None,
) -> AssetDecorator:
    """An asset that is not a per-shard product (a catalog, a per-country or per-language product,
    a dataset over every shard). ``checks``: ``{check name: description}``, blocking checks
    evaluated once per materialization, per partition when ``partitions_def`` is given.

    Partitioned by shard it would carry no backfill policy: a shard backfill selecting it would run
    it one shard per run and the UI's backfill dialog would list a second policy. Refused, by name.
    """
    if partitions_def is not None and partitions_def == shard_partitions:
        raise ValueError(
            "group_asset(partitions_def=shard_partitions): declare a shard-partitioned asset with shard_asset, "
            "which gives it the shard backfill policy every shard asset shares"
        )

    return lambda compute: _declare(
        compute,
        checks,
        # A partitioned asset's checks are evaluated per partition (the country, the language): each
        # evaluation names its partition, as the shard assets' do.
        partitions_def,
        deps=list(deps),
        partitions_def=partitions_def,
        kinds=set(kinds),
        code_version=code_version,
    )


def _declare(
    compute: Callable[..., object],
    checks: dict[str, str] | None,
    checks_partitioned_by: dg.PartitionsDefinition | None,
    **asset_args,
) -> dg.AssetsDefinition:
    name = compute.__name__
    partitions_def = asset_args.get("partitions_def")
    if partitions_def is not None:
        compute = _validating_partition_keys(compute, partitions_def)
    return dg.asset(
        name=name,
        group_name=group_of(compute.__module__),
        owners=OWNERS,
        check_specs=_blocking_checks(name, checks, checks_partitioned_by),
        **asset_args,
    )(compute)


def _validating_partition_keys(
    compute: Callable[..., object], partitions_def: dg.PartitionsDefinition
) -> Callable[..., object]:
    """``compute``, run only once every partition key of the step is a valid key of its kind.

    A key added by hand (the UI's "Add partition", GraphQL, ``add_dynamic_partitions``) reaches an
    asset without passing the sensor's checks; refused here, before the asset reads or writes
    anything, every partitioned asset of the code location inherits the check. The kind is named
    when the asset is declared (:func:`assets.partitions.key_kind_of`), so a partitions definition
    with no key kind fails at import.
    """
    kind = key_kind_of(partitions_def)
    if inspect.isgeneratorfunction(compute):

        @functools.wraps(compute)
        def validated_generator(context, *args, **kwargs):
            validate_partition_keys(kind, context.partition_keys)
            yield from compute(context, *args, **kwargs)

        return validated_generator

    @functools.wraps(compute)
    def validated(context, *args, **kwargs):
        validate_partition_keys(kind, context.partition_keys)
        return compute(context, *args, **kwargs)

    return validated


def _blocking_checks(
    asset: str, descriptions: dict[str, str] | None, partitions_def: dg.PartitionsDefinition | None
) -> list[dg.AssetCheckSpec] | None:
    if not descriptions:
        return None
    with warnings.catch_warnings():
        # Partitioned checks are a preview in Dagster 1.13; the pinned version is the one tested here.
        warnings.simplefilter("ignore", dg.PreviewWarning)
        return [
            dg.AssetCheckSpec(name, asset=asset, blocking=True, description=text, partitions_def=partitions_def)
            for name, text in descriptions.items()
        ]
