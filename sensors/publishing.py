"""Fan-in: refresh a country's Hugging Face dataset when, and only when, its inputs changed.

A country's inputs are the segments its build reads: the rows of that country in the shards meant
for the dataset (``speechdata.hf.segments``: a bridge-tuple shard never feeds it). Each build
records their fingerprint (``input_fingerprint`` on ``hf_dataset``'s materialization); the sensor
fingerprints every country again and requests exactly the countries whose fingerprint differs
from the one last built, at start-up too. A shard re-landed into another country changes both
countries' fingerprints, so the country it left drops its rows; an unrelated shard (another
country, a shard not meant for the dataset, an identical re-indexing) changes none.

Fingerprinting reads only the shards indexed (or given near-duplicate decisions, or aligned: the
alignment scores carry the pseudo-labels of rows landed without text) since the last
tick (``speechdata.hf.segments.country_input_fingerprints`` keeps each shard's fingerprints with its
stamp), and a refresh reads only the shards its country's state has not seen. Shards land in
batches (a drop of many shards, a backfill), so one run per country per *settled* batch is
enough: the sensor looks only when shards were indexed (or had their near duplicates decided, or were aligned) since its cursor, and waits until none has been indexed for
``SPEECHDATA_PUBLISHING_SETTLE_S`` seconds and no ``per_shard_job`` run is queued or starting (a
batch still arriving). So that a steady stream of shards cannot starve the countries, a batch older
than ``SPEECHDATA_PUBLISHING_MAX_WAIT_S`` is compared anyway.
"""

import os
import time

import dagster as dg

from assets.partitions import PER_SHARD_JOB_NAME
from assets.publishing import (
    HF_DATASET_JOB_NAME,
    HF_PUBLISH_JOB_NAME,
    INPUT_FINGERPRINT,
    hf_dataset,
    hf_dataset_job,
    hf_publish_job,
)
from resources.hub import HubPublisherResource
from resources.storage import DataRootResource
from speechdata.hf.segments import EMPTY_INPUT_FINGERPRINT, country_input_fingerprints
from speechdata.io.confinement import require_existing_root
from speechdata.io.layout import is_valid_key

RAW_SHARDS = dg.AssetKey("raw_shards")
NEAR_DUPLICATES = dg.AssetKey("near_duplicates")
ALIGNMENTS = dg.AssetKey("alignments")
SHARD_EVENTS = (RAW_SHARDS, NEAR_DUPLICATES, ALIGNMENTS)
"""What changes a country's inputs: a shard indexed, its near duplicates decided (they are filtered),
or its utterances aligned (those landed without text get their pseudo-labels)."""
COUNTRY_TAG = "speechdata/hf_country"
"""Runs of one country queue behind each other (run queue ``tag_concurrency_limits`` in dagster.yaml):
a country's state database has one writer at a time."""
MAX_RECORDS_PER_TICK = 1000
DEFAULT_SETTLE_S = 60.0
DEFAULT_MAX_WAIT_S = 1800.0


def _seconds_from_env(name: str, default: float) -> float:
    """Read at each tick, so an operator (or a test) can change it without reloading the code."""
    text = os.environ.get(name)
    try:
        value = float(text) if text else default
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0, got {text!r}")
    return value


SENSOR_NAME = "country_dataset_sensor"


@dg.sensor(
    name=SENSOR_NAME,
    jobs=[hf_dataset_job, hf_publish_job],
    minimum_interval_seconds=int(os.environ.get("SPEECHDATA_PUBLISHING_SENSOR_INTERVAL_S", "60")),
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="One hf_dataset (and, with a Hub repo configured, hf_hub_upload) run per country whose input "
    "fingerprint differs from its last build, once the batch of shard events has settled.",
)
def country_dataset_sensor(
    context: dg.SensorEvaluationContext, hub: HubPublisherResource, data_root: DataRootResource
) -> dg.SensorResult | dg.SkipReason:
    # A country refresh over an unmounted root would publish a country with no shards: fail the tick.
    root = data_root.get()
    require_existing_root(root.root, local=root.is_local, what=SENSOR_NAME)
    # The cursor is the storage id of the newest raw_shards or near_duplicates materialization covered.
    covered = int(context.cursor or 0)
    # Storage ids are one sequence over the event log: the oldest MAX_RECORDS_PER_TICK of both assets.
    records = sorted(
        (
            record
            for asset_key in SHARD_EVENTS
            for record in context.instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=asset_key, after_storage_id=covered),
                limit=MAX_RECORDS_PER_TICK,
                ascending=True,
            ).records
        ),
        key=lambda record: record.storage_id,
    )[:MAX_RECORDS_PER_TICK]
    if not records:
        return dg.SkipReason("no shard indexed since the last tick")
    settle_s = _seconds_from_env("SPEECHDATA_PUBLISHING_SETTLE_S", DEFAULT_SETTLE_S)
    max_wait_s = _seconds_from_env("SPEECHDATA_PUBLISHING_MAX_WAIT_S", DEFAULT_MAX_WAIT_S)
    now = time.time()
    newest_age_s, oldest_age_s = now - records[-1].timestamp, now - records[0].timestamp
    shard_runs_pending = bool(
        context.instance.get_run_records(
            dg.RunsFilter(
                job_name=PER_SHARD_JOB_NAME,
                statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING],
            ),
            limit=1,
        )
    )
    # Shards, not events: each shard has a raw_shards and a near_duplicates event, and every re-run more.
    shard_count = len({record.partition_key for record in records})
    if oldest_age_s < max_wait_s and (newest_age_s < settle_s or shard_runs_pending):
        # The cursor stays: the next tick sees this batch again, with whatever joined it.
        return dg.SkipReason(
            f"{shard_count} shard(s) indexed, batch still settling "
            f"(last {newest_age_s:.0f} s ago, settle {settle_s:.0f} s"
            f"{', per_shard_job runs queued' if shard_runs_pending else ''})"
        )
    latest = records[-1].storage_id
    # Only valid keys become partitions (the landing contract checked them; the key validator decides).
    countries = {
        c for c in changed_countries(context.instance, country_input_fingerprints(root)) if is_valid_key("country", c)
    }
    known = set(context.instance.get_dynamic_partitions("country"))
    # A country run still waiting in the queue reads every shard when it starts: a second is redundant.
    waiting = {
        record.dagster_run.tags.get(COUNTRY_TAG)
        for record in context.instance.get_run_records(
            dg.RunsFilter(
                statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED],
                tags={"speechdata/launched_by": SENSOR_NAME},
            )
        )
    }
    if not countries - waiting:
        return dg.SensorResult(
            skip_reason=f"{shard_count} shard(s) indexed; no country's inputs changed since its last build",
            cursor=str(latest),
        )
    job_name = HF_PUBLISH_JOB_NAME if hub.enabled else HF_DATASET_JOB_NAME
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                job_name=job_name,
                partition_key=country,
                run_key=f"hf-{country}-{latest}",
                # Shard runs go first: a country refresh is cheap to delay and takes in every shard landed by then.
                tags={"speechdata/launched_by": SENSOR_NAME, COUNTRY_TAG: country, "dagster/priority": "-1"},
            )
            for country in sorted(countries - waiting)
        ],
        dynamic_partitions_requests=[dg.AddDynamicPartitionsRequest("country", sorted(countries - known))]
        if countries - known
        else [],
        cursor=str(latest),
    )


def last_built_fingerprints(instance: dg.DagsterInstance) -> dict[str, str | None]:
    """Per registered country: the input fingerprint its latest ``hf_dataset`` build recorded
    (None when it was never built, or built before fingerprints were recorded)."""
    built: dict[str, str | None] = {}
    for country in instance.get_dynamic_partitions("country"):
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=hf_dataset.key, asset_partitions=[country]), limit=1, ascending=False
        ).records
        value = records[0].asset_materialization.metadata.get(INPUT_FINGERPRINT) if records else None
        built[country] = value.value if value is not None else None
    return built


def changed_countries(instance: dg.DagsterInstance, current: dict[str, str]) -> set[str]:
    """The countries whose inputs differ from what was last built: a country with segments never
    built with them, and a built country whose segments changed or are all gone (its rows withdrawn)."""
    built = last_built_fingerprints(instance)
    candidates = set(current) | {country for country, fingerprint in built.items() if fingerprint is not None}
    return {country for country in candidates if current.get(country, EMPTY_INPUT_FINGERPRINT) != built.get(country)}


defs = dg.Definitions(sensors=[country_dataset_sensor])
