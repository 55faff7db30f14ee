"""One shard's state in one place: registered, landed, each shard asset's latest outcome, its ledgers.

What an operator otherwise pieces together from the partitions page, every asset's page and the
catalog. Read from the Dagster instance (``DAGSTER_HOME``) and the data root; nothing is written.
An asset's state is the outcome of the newest run that planned it on the shard: a materialization, a
run in progress, or a failure with the reason people read in the run (the failed step's message, or
"upstream failed" and the run's failure for a step not executed).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import dagster as dg
from dagster._core.events import DagsterEventType

from assets.partitions import shard_partitions
from speechdata.accounting.ledgers import ledger_markdown, shard_ledgers
from speechdata.io import layout
from speechdata.io.confinement import confined_landed_shard, validate_partition_key
from speechdata.io.storage import DataRoot
from speechdata.landing.fingerprint import shard_content_fingerprint

NEVER_MATERIALIZED = "never materialized"
FAILED_RUN_STATUSES = {"FAILURE", "CANCELED"}


@dataclass(frozen=True)
class LandedFile:
    path: str
    """Relative to ``landing/<shard>/``."""
    size_bytes: int


@dataclass(frozen=True)
class Landing:
    present: bool
    complete: bool
    """``_SUCCESS`` is there: the landing sensor may register the shard."""
    files: list[LandedFile] = field(default_factory=list)
    fingerprint: str | None = None
    """:func:`speechdata.landing.fingerprint.shard_content_fingerprint`: what a re-landing changes."""


@dataclass(frozen=True)
class AssetState:
    asset: str
    status: str
    """``materialized``, ``failed``, ``in progress (<run status>)`` or :data:`NEVER_MATERIALIZED`."""
    timestamp: str | None = None
    """UTC, ISO 8601, of the newest event."""
    run_id: str | None = None
    data_version: str | None = None
    code_version: str | None = None
    failure: str | None = None
    """Why the newest run on this shard did not materialize it."""


@dataclass(frozen=True)
class ShardStatus:
    shard: str
    registered: bool
    landing: Landing
    assets: list[AssetState]
    ledgers: dict[str, dict] | None
    """Product -> landed, produced, rejected, balanced, rejects_by_reason; None before landing."""
    ledger_table: str | None = None
    instance: str | None = None
    """The Dagster instance's folder the status was read from."""
    hint: str | None = None
    """For a shard the instance has not registered: how shards get registered (:func:`registration_hint`)."""

    def as_json(self) -> dict:
        return asdict(self)


def shard_asset_keys(definitions: dg.Definitions) -> list[str]:
    """Every asset partitioned by shard, in graph order (upstream first)."""
    graph = definitions.resolve_asset_graph()
    keys = graph.toposorted_asset_keys
    return [
        key.to_user_string()
        for key in keys
        if graph.has(key) and graph.get(key).partitions_def == shard_partitions and graph.get(key).is_materializable
    ]


def shard_status(
    instance: dg.DagsterInstance,
    data_root: DataRoot,
    shard_id: str,
    asset_names: Iterable[str],
    progress: Callable[[Iterable[str]], Iterable[str]] = lambda items: items,
    instance_home: str | None = None,
) -> ShardStatus:
    """The shard's state; ``progress`` wraps the per-asset lookups (a progress bar on a terminal)."""
    validate_partition_key(shard_id)
    landing = landing_of(data_root, shard_id)
    ledgers = shard_ledgers(data_root, shard_id) if landing.present and _has_metadata(data_root, shard_id) else None
    registered = instance.has_dynamic_partition(shard_partitions.name, shard_id)
    return ShardStatus(
        shard=shard_id,
        registered=registered,
        instance=instance_home,
        hint=None if registered else registration_hint(shard_id, landing),
        landing=landing,
        assets=[asset_state(instance, name, shard_id) for name in progress(list(asset_names))],
        ledgers=None
        if ledgers is None
        else {
            product: {
                "landed": ledger.landed,
                "produced": ledger.produced,
                "rejected": ledger.rejected,
                "balanced": ledger.balanced,
                "rejects_by_reason": dict(ledger.rejects_by_reason),
            }
            for product, ledger in ledgers.items()
        },
        ledger_table=None if ledgers is None else ledger_markdown(ledgers),
    )


def registration_hint(shard_id: str, landing: Landing) -> str:
    """How a shard the instance does not know gets registered, from where its landing stands."""
    success = f"{layout.landing_success_marker(shard_id)}"
    sensor = (
        "the landing sensor registers a shard (a key of the 'shard' partitions) at its next tick once "
        f"{success} is there; it runs in the daemon `make dev` starts (UI: Automation, landing_sensor)"
    )
    elsewhere = (
        "If the shard was registered elsewhere, this is another instance: pass --dagster-home or set "
        "$DAGSTER_HOME (make dev: ./.dagster_home; make demo registers its demo shards there too)."
    )
    if landing.present and landing.complete:
        return f"{shard_id} is landed but not registered in this instance: {sensor}. {elsewhere}"
    if landing.present:
        return (
            f"{shard_id} is landing but not complete (no {success} yet), so it is not registered: "
            f"`speechdata land` writes _SUCCESS last, after the contract checks; then {sensor}. {elsewhere}"
        )
    return (
        f"{shard_id} is neither landed nor registered: land it with `speechdata land <folder>` (it is copied "
        f"to landing/{shard_id}/ and checked against the landing contract), then {sensor}. {elsewhere}"
    )


def landing_of(data_root: DataRoot, shard_id: str) -> Landing:
    """The landed files and their fingerprint; a shard whose folder leaves the data root raises."""
    confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)
    folder = layout.landing_dir(shard_id)
    if not data_root.exists(folder):
        return Landing(present=False, complete=False)
    absolute = data_root.path(folder).rstrip("/")
    files = [
        LandedFile(path=path[len(absolute) + 1 :], size_bytes=int(info.get("size") or 0))
        for path, info in sorted(data_root.fs.find(absolute, detail=True).items())
    ]
    return Landing(
        present=True,
        complete=data_root.exists(layout.landing_success_marker(shard_id)),
        files=files,
        fingerprint=shard_content_fingerprint(data_root, shard_id),
    )


def _has_metadata(data_root: DataRoot, shard_id: str) -> bool:
    return data_root.exists(layout.landing_metadata(shard_id))


def asset_state(instance: dg.DagsterInstance, asset: str, shard_id: str) -> AssetState:
    """The outcome of the newest run that planned the asset on this shard, else its newest materialization.

    Open-source event storage keeps no failed-materialization records, so a failure is read as Dagster's
    UI reads it: a run planned the partition, did not materialize it, and failed (or is still going).
    """
    records_filter = dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[shard_id])
    materialized = instance.fetch_materializations(records_filter, limit=1).records
    newest_planned = instance.get_latest_planned_materialization_info(dg.AssetKey(asset), shard_id)
    newest_materialized = materialized[0] if materialized else None
    if newest_planned and (newest_materialized is None or newest_planned.storage_id > newest_materialized.storage_id):
        run = instance.get_run_by_id(newest_planned.run_id)
        if run is not None and run.status.value in FAILED_RUN_STATUSES:
            return AssetState(
                asset=asset,
                status="failed",
                timestamp=_run_time(instance, run.run_id),
                run_id=run.run_id,
                failure=failure_reason(instance, asset, run.run_id, run.status.value),
            )
        if run is not None and not run.is_finished:
            return AssetState(
                asset=asset,
                status=f"in progress ({run.status.value})",
                timestamp=_run_time(instance, run.run_id),
                run_id=run.run_id,
            )
    if newest_materialized is None:
        return AssetState(asset=asset, status=NEVER_MATERIALIZED)
    tags = newest_materialized.asset_materialization.tags or {}
    return AssetState(
        asset=asset,
        status="materialized",
        timestamp=_utc(newest_materialized.timestamp),
        run_id=newest_materialized.run_id,
        data_version=tags.get("dagster/data_version"),
        code_version=tags.get("dagster/code_version"),
    )


def failure_reason(instance: dg.DagsterInstance, asset: str, run_id: str, run_status: str) -> str:
    """What the run says about this asset: its step's failure message, else the run's failure."""
    step_message = _step_failure_message(instance, run_id, asset)
    if step_message is not None:
        return step_message
    run_message = _run_failure_message(instance, run_id)
    prefix = "run canceled" if run_status == "CANCELED" else "not executed, upstream failed"
    return f"{prefix}: {run_message}" if run_message else prefix


def _step_failure_message(instance: dg.DagsterInstance, run_id: str, asset: str) -> str | None:
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE):
        event = entry.dagster_event
        if event is None or event.step_key != asset:
            continue
        data = event.step_failure_data
        if data.user_failure_data is not None and data.user_failure_data.description:
            return data.user_failure_data.description
        if data.error is not None:
            return data.error.message.strip()
    return None


def _run_failure_message(instance: dg.DagsterInstance, run_id: str) -> str | None:
    for entry in instance.all_logs(run_id, of_type=DagsterEventType.RUN_FAILURE):
        event = entry.dagster_event
        error = getattr(event.event_specific_data, "error", None) if event is not None else None
        return error.message.strip() if error is not None else (entry.user_message or None)
    return None


def _run_time(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """When the run ended, else when it started, else when it was created."""
    [record] = instance.get_run_records(dg.RunsFilter(run_ids=[run_id]), limit=1) or [None]
    if record is None:
        return None
    return _utc(record.end_time or record.start_time or record.create_timestamp.timestamp())


def _utc(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC).isoformat(timespec="seconds")


def status_text(status: ShardStatus) -> str:
    """The status for a person: registration, landing, one table of assets, the ledger table."""
    landing = status.landing
    if landing.present:
        size = sum(f.size_bytes for f in landing.files)
        landed = (
            f"{'complete (_SUCCESS)' if landing.complete else 'incomplete (no _SUCCESS yet)'}, "
            f"{len(landing.files)} files, {size} bytes, fingerprint {landing.fingerprint}"
        )
    else:
        landed = f"no (nothing at {layout.landing_dir(status.shard)}/)"
    lines = [f"shard {status.shard}"]
    if status.instance:
        lines.append(f"instance: {status.instance}")
    lines += [
        f"registered: {'yes' if status.registered else 'no'} (dynamic partition '{shard_partitions.name}')",
        f"landed: {landed}",
    ]
    if status.hint:
        lines.append(f"hint: {status.hint}")
    lines += [f"  {f.path}  {f.size_bytes}" for f in landing.files]
    lines += ["", "| asset | status | time (UTC) | run | data version | code version |", "|---|---|---|---|---|---|"]
    for state in status.assets:
        shown = state.status if state.failure is None else f"{state.status}: {state.failure}"
        cells = [state.asset, shown, state.timestamp, state.run_id, state.data_version, state.code_version]
        lines.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    if status.ledgers is None:
        ledgers = "(no landed metadata yet)"
    else:
        ledgers = status.ledger_table if status.ledgers else "(no product has outputs for this shard yet)"
    lines += ["", "ledgers:", ledgers]
    return "\n".join(lines)


def _cell(value: str | None) -> str:
    return "-" if value is None else value.replace("|", "\\|").replace("\n", " ")
