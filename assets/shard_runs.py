"""One step, one or many shards: a sensor run brings one shard, a backfill run up to its policy's k.

Every shard-partitioned asset materializes through :func:`materialize_shards`, so the same code
serves both: it computes each shard of ``context.partition_keys`` in turn (a model loaded by the
caller before the loop serves all of them), then records one materialization per shard with that
shard's own metadata, and one evaluation per shard of each asset check (its numbers as text, so the
UI never charts several shards' check figures as one series: ``assets.reporting.unplotted_check``).
"""

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

import dagster as dg

# Dagster builds this pointer itself only for single-partition steps; in a partition-range step we
# give each shard's check evaluation its shard's materialization so the UI shows it as current.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from assets.reporting import unplotted_check
from speechdata.io.confinement import validate_partition_key
from speechdata.io.env import backfill_shards_per_run
from speechdata.io.shard_lock import shard_write_lock
from speechdata.io.storage import owned_temps

SHARDS_PER_RUN = backfill_shards_per_run()
"""k (``SPEECHDATA_BACKFILL_SHARDS_PER_RUN``): a backfill of n shards runs ceil(n / k) runs, each
carrying its k shards through every shard asset.

Creating a run over a range of ``shard`` partitions reads every registered shard key once per asset
and check of the run (Dagster 1.13 resolves the range against the whole key list to log its planned
events), so with 100 000 shards registered a run's creation costs seconds whatever its size: only
larger runs spread that over more shards (docs/deploying.md "Run shape at 100 000 shards",
``bench_backfill_launch --compare``). GPU assets load their models once per k shards; CPU assets use
the same k, since every step of a run is a process that imports the code location and assets with
different policies cannot share a run."""

GPU_SHARDS_PER_RUN = CPU_SHARDS_PER_RUN = SHARDS_PER_RUN
SHARD_BACKFILL_POLICY = dg.BackfillPolicy.multi_run(max_partitions_per_run=SHARDS_PER_RUN)
"""Every shard asset's policy (``assets.asset_policy.shard_asset`` applies it)."""

# Backfill policies are beta in Dagster 1.13 (pinned); say so once here rather than once per asset.
warnings.filterwarnings("ignore", message=".*`backfill_policy`.*", category=dg.BetaWarning)

T = TypeVar("T")

ShardEvents = Iterator[dg.MaterializeResult | dg.AssetCheckEvaluation | dg.Output]


@dataclass
class ShardResult:
    """What one shard's materialization reports: its metadata and its asset check results."""

    metadata: dict[str, object]
    checks: list[dg.AssetCheckResult] = field(default_factory=list)


class ShardFailure(dg.Failure):
    """A shard that cannot be materialized, with the verdicts of the asset's own checks on it.

    Raised by a shard's build (e.g. metadata that breaks the landing contract): the step still fails,
    but the checks named in ``checks`` are recorded as failed with the reason, on that partition,
    instead of reading as "execution failed" beside it. The description is the run's failure message
    (the runs list and the run page show it) and the metadata names the shard; the steps of the
    assets downstream are not executed (Dagster logs "dependencies failed"), never failed themselves.
    """

    def __init__(self, shard_id: str, description: str, metadata: dict, checks: list[dg.AssetCheckResult]):
        super().__init__(description=description, metadata={"shard": shard_id, **metadata})
        self.shard_id = shard_id
        self.checks = checks


def load_model_for_step(context: dg.AssetExecutionContext, identity: str, load: Callable[[], T]) -> tuple[T, float]:
    """``load()`` once for every shard of the step; returns the model and the seconds it took."""
    started = time.perf_counter()
    model = load()
    load_s = time.perf_counter() - started
    context.log.info(f"{identity} loaded in {load_s:.1f} s for {len(context.partition_keys)} shards")
    return model, load_s


def materialize_shards(
    context: dg.AssetExecutionContext, build: Callable[[str], ShardResult], data_version: str | None = None
) -> ShardEvents:
    """Run ``build(shard_id)`` for every shard of the step, then report each shard separately.

    ``data_version``: recorded on every shard's materialization (e.g. the digest of a policy passed
    as run config), so a change marks what reads the asset stale even when its code did not change.

    A shard that raises fails the step: no shard of the step is recorded as materialized, so the
    backfill marks them all failed and a retry redoes them all (their files are replaced, never
    appended), which neither skips nor duplicates a shard.
    """
    shards = list(context.partition_keys)
    asset = context.asset_key.to_user_string()
    for shard_id in shards:  # a hand-added key like ``../../x`` fails here, before anything is written
        validate_partition_key(shard_id)
    results: dict[str, ShardResult] = {}
    started = time.monotonic()
    for position, shard_id in enumerate(shards, 1):
        context.log.info(f"{asset}: shard {position}/{len(shards)} {shard_id} started")
        try:
            data_root = _data_root(context)
            with (
                shard_write_lock(data_root, shard_id, asset, context.run.run_id, run_ended_in(context)),
                # Under the lock: a killed earlier run's temps of this shard's product are removed
                # once this run's writes are done.
                owned_temps(data_root.fs, f"{shard_id}/{asset}") if data_root else contextlib.nullcontext(),
            ):
                results[shard_id] = build(shard_id)
        except Exception as exc:
            context.log.error(
                f"{asset}: shard {shard_id} ({position}/{len(shards)}) failed; no shard of this step is "
                f"recorded, a retry redoes {shards}"
            )
            if isinstance(exc, ShardFailure) and exc.checks:
                yield from _check_evaluations(context, {shard_id: ShardResult(metadata={}, checks=exc.checks)})
            raise
        context.log.info(
            f"{asset}: shard {position}/{len(shards)} {shard_id} done, {time.monotonic() - started:.1f} s into the step"
        )
    for shard_id, result in results.items():
        context.add_asset_metadata({**result.metadata, "shards_in_step": len(shards)}, partition_key=shard_id)
    yield dg.MaterializeResult(data_version=dg.DataVersion(data_version) if data_version else None)
    yield from _check_evaluations(context, results)


def _data_root(context: dg.AssetExecutionContext):
    resource = getattr(context.resources, "data_root", None)
    return resource.get() if resource is not None else None


def run_ended_in(context: dg.AssetExecutionContext) -> Callable[[str], bool]:
    """Whether a lock holder's run is known to this instance and over: asked only of a lock without
    a lease (from a version before leases). A run this instance does not know is not over: it may be
    another instance's (a separate ``DAGSTER_HOME``) and still writing."""
    return lambda run_id: (run := context.instance.get_run_by_id(run_id)) is not None and run.is_finished


def _check_evaluations(context: dg.AssetExecutionContext, results: dict[str, ShardResult]) -> ShardEvents:
    specs = context.assets_def.check_specs_by_output_name
    output_by_name = {spec.name: output for output, spec in specs.items()}
    blocking = {spec.name: spec.blocking for spec in specs.values()}
    selected = {key.name for key in context.selected_asset_check_keys}
    for shard_id, result in results.items():
        target = _latest_materialization(context, shard_id)
        for check in map(unplotted_check, result.checks):
            if check.check_name not in selected:
                continue
            yield dg.AssetCheckEvaluation(
                asset_key=context.asset_key,
                check_name=check.check_name,
                passed=check.passed,
                metadata=check.metadata,
                description=check.description,
                partition=shard_id,
                blocking=blocking[check.check_name],
                target_materialization_data=target,
            )
    # The evaluations above are the checks' results; the checks' outputs still have to be yielded.
    for name in sorted(selected):
        yield dg.Output(None, output_name=output_by_name[name])


def _latest_materialization(context: dg.AssetExecutionContext, shard_id: str):
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=context.asset_key, asset_partitions=[shard_id]), limit=1
    ).records
    if not records:
        return None
    record = records[0]
    return AssetCheckEvaluationTargetMaterializationData(
        storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
    )
