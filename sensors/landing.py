"""The landing sensor: register each shard that finishes landing and run its per-shard job once."""

import json
import os
import time

import dagster as dg

from assets.partitions import PER_SHARD_JOB_NAME, country_partitions, language_partitions, shard_partitions
from resources.storage import DataRootResource
from speechdata.io import layout
from speechdata.io.confinement import LandedShardOutsideRoot, confined_landed_shard, require_existing_root
from speechdata.landing.contract import ContractError, partition_values
from speechdata.landing.fingerprint import scan_relandings
from speechdata.landing.scan import list_landing_dirs, scan_landing_zone

DEFAULT_MAX_SHARDS_PER_TICK = int(os.environ.get("SPEECHDATA_MAX_SHARDS_PER_TICK", "50"))
DEFAULT_INTERVAL_SECONDS = int(os.environ.get("SPEECHDATA_LANDING_SENSOR_INTERVAL_S", "30"))
DEFAULT_MAX_FINGERPRINTS_PER_TICK = int(os.environ.get("SPEECHDATA_MAX_FINGERPRINTS_PER_TICK", "500"))
"""Shards hashed per tick at most (only those whose files' identities changed are hashed at all)."""
LAUNCHED_BY_TAG = "speechdata/launched_by"
RELANDED_TAG = "speechdata/relanded"


def build_landing_sensor(
    max_shards_per_tick: int = DEFAULT_MAX_SHARDS_PER_TICK,
    minimum_interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
    max_fingerprints_per_tick: int = DEFAULT_MAX_FINGERPRINTS_PER_TICK,
) -> dg.SensorDefinition:
    @dg.sensor(
        name="landing_sensor",
        job_name=PER_SHARD_JOB_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Registers every shard under landing/ that has its _SUCCESS marker as a `shard` partition "
            "(plus any new `country`/`language` values in its metadata) and launches per_shard_job "
            "for it once; a registered shard whose content fingerprint changed (landed again) is requested "
            f"again under run key <shard>@<fingerprint>. At most {max_shards_per_tick} shards per tick. "
            "A data root that does not exist fails the tick."
        ),
    )
    def landing_sensor(context: dg.SensorEvaluationContext, data_root: DataRootResource) -> dg.SensorResult:
        # The registered `shard` partitions are the durable record of what was requested, so a tick
        # only touches directories it has never registered, however many shards have landed.
        started = time.perf_counter()
        root = data_root.get()
        # An unmounted volume lists as "nothing landed": a green tick that would hide the outage.
        require_existing_root(root.root, local=root.is_local, what="landing_sensor")
        registered = set(context.instance.get_dynamic_partitions(shard_partitions.name))
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
            path = root.path(layout.landing_metadata(shard_id))
            try:
                confined_landed_shard(root.root, shard_id, local=root.is_local)
            except LandedShardOutsideRoot as exc:
                # Registered and requested all the same: raw_shards fails it by name, where it shows.
                outside_root.append(shard_id)
                context.log.error(f"{shard_id}: landed shard leaves the data root, nothing of it is read: {exc}")
                continue
            try:
                with root.fs.open(path, "rb") as handle:
                    countries, languages = partition_values(handle, path)
            except (ContractError, FileNotFoundError) as exc:
                # raw_shards will fail this shard with the same message; register it so that shows in the UI.
                context.log.warning(f"{shard_id}: cannot read country/language values: {exc}")
                continue
            new_countries.update(set(countries) - known_countries)
            new_languages.update(set(languages) - known_languages)

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
        return dg.SensorResult(
            run_requests=[
                dg.RunRequest(
                    run_key=shard_id,
                    partition_key=shard_id,
                    tags={LAUNCHED_BY_TAG: "landing_sensor"},
                )
                for shard_id in scan.complete
            ]
            + [
                dg.RunRequest(
                    run_key=f"{shard_id}@{fingerprint}",
                    partition_key=shard_id,
                    tags={LAUNCHED_BY_TAG: "landing_sensor", RELANDED_TAG: "true"},
                )
                for shard_id, fingerprint in relandings.relanded
            ],
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
                }
            ),
        )

    return landing_sensor


landing_sensor = build_landing_sensor()

defs = dg.Definitions(sensors=[landing_sensor])
