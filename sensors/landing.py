"""The landing sensor: register each shard that finishes landing and run its per-shard job once, in batches.

A tick registers every new complete shard at once, but a run starts only when a batch is full
(``SPEECHDATA_LANDING_BATCH_SHARDS`` shards) or its oldest shard has waited
``SPEECHDATA_LANDING_BATCH_WAIT_S`` seconds: one run then carries several shards through every
per-shard asset, so a steady trickle of landings pays one cold start (code location import, model
loads) per batch instead of one per shard. The waiting shards live in the cursor.
"""

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass

import dagster as dg

from assets.partitions import PER_SHARD_JOB_NAME, country_partitions, language_partitions, shard_partitions
from resources.storage import DataRootResource
from speechdata.hf.segments import PUBLISHED_SHARD_MARKER
from speechdata.io import layout
from speechdata.io.confinement import LandedShardOutsideRoot, confined_landed_shard, require_existing_root
from speechdata.io.regular_files import NotARegularFile
from speechdata.landing.contract import ContractError, partition_values
from speechdata.landing.fingerprint import scan_relandings
from speechdata.landing.scan import list_landing_dirs, scan_landing_zone

DEFAULT_MAX_SHARDS_PER_TICK = int(os.environ.get("SPEECHDATA_MAX_SHARDS_PER_TICK", "50"))
DEFAULT_INTERVAL_SECONDS = int(os.environ.get("SPEECHDATA_LANDING_SENSOR_INTERVAL_S", "30"))
DEFAULT_MAX_FINGERPRINTS_PER_TICK = int(os.environ.get("SPEECHDATA_MAX_FINGERPRINTS_PER_TICK", "500"))
"""Shards hashed per tick at most (only those whose files' identities changed are hashed at all)."""
DEFAULT_BATCH_SHARDS = int(os.environ.get("SPEECHDATA_LANDING_BATCH_SHARDS", "16"))
"""Shards per landing run: a batch this full launches at once."""
DEFAULT_BATCH_WAIT_S = float(os.environ.get("SPEECHDATA_LANDING_BATCH_WAIT_S", "120"))
"""Seconds the oldest waiting shard may wait for its batch to fill before the batch launches anyway."""
REGISTER_ONLY_ENV = "SPEECHDATA_LANDING_REGISTER_ONLY"
if os.environ.get(REGISTER_ONLY_ENV, "0") not in ("0", "1"):
    raise ValueError(f"{REGISTER_ONLY_ENV} must be 0 or 1, got {os.environ[REGISTER_ONLY_ENV]!r}")
DEFAULT_REGISTER_ONLY = os.environ.get(REGISTER_ONLY_ENV, "0") == "1"
"""``1``: register shards and launch nothing (a first import's shards are run around the whole-corpus
near-duplicate pass instead, docs/deploying.md); the shards registered meanwhile are never launched."""
LAUNCHED_BY_TAG = "speechdata/launched_by"
RELANDED_TAG = "speechdata/relanded"
BATCH_SHARDS_TAG = "speechdata/batch_shards"
# Dagster's own tags for a run over a partition range (what a backfill run carries); public names
# of RunRequest.partition_key_range, spelled here because RunRequest takes a range only as tags.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"


@dataclass(frozen=True)
class WaitingShard:
    """A registered shard waiting for its batch: ``fingerprint`` is set when it landed again."""

    shard: str
    since_s: float
    fingerprint: str | None = None

    @property
    def request_key(self) -> str:
        """The shard's part of a run key: the shard, or ``shard@fingerprint`` for a landing again."""
        return self.shard if self.fingerprint is None else f"{self.shard}@{self.fingerprint}"


def pending_from_cursor(cursor: str | None) -> list[WaitingShard]:
    """The shards a previous tick left waiting (none for a cursor written before batching)."""
    if not cursor:
        return []
    try:
        state = json.loads(cursor)
    except json.JSONDecodeError:
        return []
    return [WaitingShard(**entry) for entry in state.get("pending", [])] if isinstance(state, dict) else []


def enqueue(pending: list[WaitingShard], arrivals: list[WaitingShard]) -> list[WaitingShard]:
    """``pending`` plus ``arrivals``; a shard already waiting keeps its place and age, and takes the
    newest fingerprint (its run reads what is landed when it starts, so one run covers both)."""
    by_shard = {entry.shard: entry for entry in pending}
    for arrival in arrivals:
        waiting = by_shard.get(arrival.shard)
        if waiting is None:
            by_shard[arrival.shard] = arrival
        elif arrival.fingerprint is not None:
            by_shard[arrival.shard] = WaitingShard(waiting.shard, waiting.since_s, arrival.fingerprint)
    return list(by_shard.values())


def batches_due(
    pending: list[WaitingShard], now_s: float, batch_shards: int, wait_s: float
) -> tuple[list[list[WaitingShard]], list[WaitingShard]]:
    """``(batches to launch now, shards still waiting)``: every full batch, oldest first, then the
    partial rest once its oldest shard has waited ``wait_s``."""
    batches = []
    rest = list(pending)
    while len(rest) >= batch_shards:
        batches.append(rest[:batch_shards])
        rest = rest[batch_shards:]
    if rest and now_s - min(entry.since_s for entry in rest) >= wait_s:
        batches.append(rest)
        rest = []
    return batches, rest


def contiguous_runs(batch: list[WaitingShard], position: dict[str, int]) -> list[list[WaitingShard]]:
    """The batch cut into runs of shards adjacent in the ``shard`` partition order, each one run over
    a partition range. Shards registered in one tick are adjacent, so a batch of new shards is one
    range; a shard landed again sits where it was first registered and may make a run of its own."""
    ordered = sorted(batch, key=lambda entry: position[entry.shard])
    runs: list[list[WaitingShard]] = []
    for entry in ordered:
        if runs and position[entry.shard] == position[runs[-1][-1].shard] + 1:
            runs[-1].append(entry)
        else:
            runs.append([entry])
    return runs


def batch_run_request(shards: list[WaitingShard]) -> dg.RunRequest:
    """One run of ``per_shard_job`` over adjacent shards. The run key is derived from its shards
    (and fingerprints), so the same batch is never started twice."""
    tags = {LAUNCHED_BY_TAG: "landing_sensor", BATCH_SHARDS_TAG: str(len(shards))}
    if any(entry.fingerprint is not None for entry in shards):
        tags[RELANDED_TAG] = "true"
    if len(shards) == 1:
        return dg.RunRequest(run_key=shards[0].request_key, partition_key=shards[0].shard, tags=tags)
    first, last = shards[0].shard, shards[-1].shard
    digest = hashlib.sha256("\n".join(entry.request_key for entry in shards).encode()).hexdigest()[:16]
    return dg.RunRequest(
        run_key=f"{first}..{last}#{len(shards)}:{digest}",
        tags={**tags, RANGE_START_TAG: first, RANGE_END_TAG: last},
    )


def _left_to_launch(pending: list[WaitingShard], register_only: bool, log) -> list[WaitingShard]:
    """``pending``; none when registering only: a first import runs its shards itself (around the
    batch pass), so none is kept waiting and turning the setting off later launches nothing for them."""
    if not register_only:
        return pending
    if pending:
        log.info(f"{len(pending)} shards registered, no run launched ({REGISTER_ONLY_ENV}=1)")
    return []


def build_landing_sensor(
    max_shards_per_tick: int = DEFAULT_MAX_SHARDS_PER_TICK,
    minimum_interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
    max_fingerprints_per_tick: int = DEFAULT_MAX_FINGERPRINTS_PER_TICK,
    batch_shards: int = DEFAULT_BATCH_SHARDS,
    batch_wait_s: float = DEFAULT_BATCH_WAIT_S,
    clock=time.time,
    register_only: bool = DEFAULT_REGISTER_ONLY,
) -> dg.SensorDefinition:
    """``clock``: seconds since the epoch, the time a shard's wait is measured in (tests pass their own).
    ``register_only``: register the shards, launch no run (``SPEECHDATA_LANDING_REGISTER_ONLY=1``)."""
    if batch_shards < 1:
        raise ValueError(f"SPEECHDATA_LANDING_BATCH_SHARDS must be at least 1, got {batch_shards}")

    @dg.sensor(
        name="landing_sensor",
        job_name=PER_SHARD_JOB_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Registers every shard under landing/ that has its _SUCCESS marker as a `shard` partition "
            "(plus any new `country`/`language` values in its metadata) at once, and launches per_shard_job "
            f"for it once, in batches: a run starts when {batch_shards} shards wait or the oldest has waited "
            f"{batch_wait_s:g} s, over a partition range of adjacent shards. A registered shard whose content "
            "fingerprint changed (landed again) joins a batch again, its run key carrying <shard>@<fingerprint>. "
            f"At most {max_shards_per_tick} shards registered per tick. A data root that does not exist fails the tick."
            + (f" {REGISTER_ONLY_ENV}=1: registers only, launches no run." if register_only else "")
        ),
    )
    def landing_sensor(context: dg.SensorEvaluationContext, data_root: DataRootResource) -> dg.SensorResult:
        # The registered `shard` partitions and the cursor's waiting batch are the durable record of
        # what was requested, so a tick only touches directories it has never registered.
        started = time.perf_counter()
        root = data_root.get()
        # An unmounted volume lists as "nothing landed": a green tick that would hide the outage.
        require_existing_root(root.root, local=root.is_local, what="landing_sensor")
        registered_in_order = context.instance.get_dynamic_partitions(shard_partitions.name)
        registered = set(registered_in_order)
        landed = list_landing_dirs(root)
        scan = scan_landing_zone(root, registered, max_shards_per_tick, landed)
        # Re-landing: each registered shard's content fingerprint against the one last requested;
        # only shards whose files' identities changed are hashed.
        relandings = scan_relandings(
            root,
            landed,
            registered | set(scan.complete),
            max_relanded=max_shards_per_tick,
            max_hashed=max_fingerprints_per_tick,
        )
        outside_root: list[str] = []

        known_countries = set(context.instance.get_dynamic_partitions(country_partitions.name))
        known_languages = set(context.instance.get_dynamic_partitions(language_partitions.name))
        new_countries: set[str] = set()
        new_languages: set[str] = set()
        for shard_id in scan.complete:
            try:
                confined_landed_shard(root.root, shard_id, local=root.is_local)
            except LandedShardOutsideRoot as exc:
                # Registered and requested all the same: raw_shards fails it by name, where it shows.
                outside_root.append(shard_id)
                context.log.error(f"{shard_id}: landed shard leaves the data root, nothing of it is read: {exc}")
                continue
            path = root.path(layout.landing_metadata(shard_id))
            try:
                with root.fs.open(path, "rb") as handle:
                    countries, languages = partition_values(handle, path, countries_only_where=PUBLISHED_SHARD_MARKER)
            except (ContractError, FileNotFoundError, NotARegularFile) as exc:
                # raw_shards will fail this shard with the same message; register it so that shows in the UI.
                context.log.warning(f"{shard_id}: cannot read country/language values: {exc}")
                continue
            # The contract checked them; the key validator has the last word on what becomes a partition.
            new_countries.update(c for c in set(countries) - known_countries if layout.is_valid_key("country", c))
            new_languages.update(v for v in set(languages) - known_languages if layout.is_valid_key("language", v))

        if scan.invalid_names:
            context.log.warning(
                f"landing/ holds {len(scan.invalid_names)} directories whose names are not shard ids "
                f"({layout.SHARD_ID_PATTERN.pattern}), never registered: {scan.invalid_names[:5]}"
            )
        context.log.info(
            f"{len(scan.complete)} new complete shards, {len(scan.still_landing)} still landing, "
            f"{len(registered)} already registered; scan took {time.perf_counter() - started:.3f} s"
        )
        partition_requests = []
        if scan.complete:
            partition_requests.append(shard_partitions.build_add_request(scan.complete))
        if new_countries:
            partition_requests.append(country_partitions.build_add_request(sorted(new_countries)))
        if new_languages:
            partition_requests.append(language_partitions.build_add_request(sorted(new_languages)))
        relanded = [shard_id for shard_id, _ in relandings.relanded]
        if relanded:
            context.log.info(f"{len(relanded)} registered shards landed again: {relanded[:5]}")
        now_s = clock()
        arrivals = [WaitingShard(shard_id, now_s) for shard_id in scan.complete] + [
            WaitingShard(shard_id, now_s, fingerprint) for shard_id, fingerprint in relandings.relanded
        ]
        pending = enqueue(pending_from_cursor(context.cursor), arrivals)
        pending = _left_to_launch(pending, register_only, context.log)
        # A waiting shard deleted from the partitions by hand has nothing left to run.
        pending = [entry for entry in pending if entry.shard in registered or entry.shard in scan.complete]
        batches, still_waiting = batches_due(pending, now_s, batch_shards, batch_wait_s)
        # The daemon adds this tick's shards, in this order, after the ones registered before.
        position = {shard_id: i for i, shard_id in enumerate([*registered_in_order, *scan.complete])}
        run_requests = [batch_run_request(run) for batch in batches for run in contiguous_runs(batch, position)]
        if run_requests or still_waiting:
            context.log.info(
                f"{sum(len(batch) for batch in batches)} shards launched in {len(run_requests)} runs; "
                f"{len(still_waiting)} waiting for a batch of {batch_shards} or {batch_wait_s:g} s"
            )
        return dg.SensorResult(
            run_requests=run_requests,
            dynamic_partitions_requests=partition_requests,
            cursor=json.dumps(
                {
                    "registered": len(registered) + len(scan.complete),
                    "still_landing": len(scan.still_landing),
                    "more_waiting": scan.more_complete,
                    "relanded": len(relanded),
                    "fingerprinted": relandings.hashed,
                    "fingerprints_waiting": relandings.more_waiting,
                    "outside_root": outside_root[:20],
                    "pending": [asdict(entry) for entry in still_waiting],
                }
            ),
        )

    return landing_sensor


landing_sensor = build_landing_sensor()

defs = dg.Definitions(sensors=[landing_sensor])
