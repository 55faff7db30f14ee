"""[publishing] Per-country Hugging Face dataset splits, built from every shard of the country."""

import dagster as dg

from assets.asset_policy import group_asset, group_of
from assets.catalog import CATALOGUED_SHARDS_CHANGED, catalogued_shards_changed
from assets.ingest import raw_shards
from assets.near_duplicates import near_duplicates
from assets.partitions import country_partitions
from assets.reporting import markdown_rows, unbalanced_ledger_failure, unplotted_check
from resources.hub import HfDatasetSettings, HubPublisherResource
from resources.storage import DataRootResource
from speechdata.accounting.ledger_gate import UnbalancedLedger
from speechdata.hf.accounting import require_balanced_country
from speechdata.hf.assignment import refresh_split_assignments
from speechdata.hf.card import write_dataset_card
from speechdata.hf.dataset import build_country_dataset
from speechdata.hf.missing_splits import missing_split_reasons
from speechdata.hf.publish import publish_country, register_card
from speechdata.hf.published_index import shards_to_report_to_the_catalog, write_published_indexes
from speechdata.hf.state import rows_as_dicts, state_connection
from speechdata.io import layout

UI_POSITION = 6
NO_RECORDING_IN_TWO_SPLITS = "no_recording_in_two_splits"
INPUT_FINGERPRINT = "input_fingerprint"
"""Metadata key: the fingerprint of the segments a build read (``speechdata.hf.segments.segments_fingerprint``).
``country_dataset_sensor`` compares it with the shards' current content to request only changed countries."""


@group_asset(
    partitions_def=country_partitions,
    deps=[
        dg.AssetDep(raw_shards, partition_mapping=dg.AllPartitionMapping()),
        # Near duplicates depend on normalized audio only: publishing never waits for the GPU quality stages.
        dg.AssetDep(near_duplicates, partition_mapping=dg.AllPartitionMapping()),
    ],
    kinds={"duckdb"},
    code_version="hf_split_assignments-v4",
    checks={
        NO_RECORDING_IN_TWO_SPLITS: "Every segment's split is its recording's split: no recording leaks between splits."
    },
)
def hf_split_assignments(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    hf_dataset_settings: HfDatasetSettings,
) -> dg.MaterializeResult:
    """Which split (test / validation / train) each source recording of the country belongs to.

    Whole recordings go to one split by duration share (default 1 % test, 1 % validation, the rest
    train), seeded and stable: a recording once assigned never moves, new recordings are assigned
    so the shares stay near target. Only shards indexed (or given near-duplicate decisions) since the
    last refresh are read: a new shard costs what it holds, whatever the size of the country. Every segment of the country is recorded with its status
    (`pending`, `filtered` with reason, `uploaded`, `error`), identified by `(shard_id, key)`; a
    segment the near-duplicate stage rejected (`shards/<shard>/near_duplicates.parquet`) is
    `filtered` as `near_duplicate`, so the dataset holds only the copy indexed first;
    segments no shard holds any more (a re-landing withdrew them) are forgotten, or marked
    `withdrawn` until `hf_dataset` rewrites their file without them. Tables `recordings` (duration_hours,
    size_mb, split, subset_id), `segments` and `files` in DuckDB at
    `hf/_state/<dataset>/<country>.duckdb`: `duckdb.connect(path, read_only=True)`.
    """
    country = context.partition_key
    root = data_root.get()
    settings = hf_dataset_settings
    summary = refresh_split_assignments(
        root,
        settings.dataset,
        country,
        settings.limits(),
        settings.targets(),
        settings.split_seed,
    )
    context.log.info(
        f"{country}: {summary.segments} segments ({summary.new_segments} new), new recordings {summary.new_recordings}, "
        f"hours by split {summary.hours_by_split}, filtered {summary.filtered_by_reason}"
    )
    state_path = layout.hf_state_database(settings.dataset, country)
    with state_connection(root, state_path) as db:
        leaks = db.execute(
            "SELECT count(*) FROM segments s JOIN recordings r USING (recording_id) WHERE s.split <> r.split"
        ).fetchall()[0][0]
        table = rows_as_dicts(
            db,
            "SELECT split, count(*) AS recordings, round(sum(duration_hours), 4) AS hours "
            "FROM recordings GROUP BY split ORDER BY split",
        )
    checks = [
        dg.AssetCheckResult(
            check_name=NO_RECORDING_IN_TWO_SPLITS, passed=leaks == 0, metadata={"leaking_segments": leaks}
        )
    ]
    return dg.MaterializeResult(
        metadata={
            # Plotted per country on the asset (the check's own plot would mix countries).
            "leaking_segments": leaks,
            "dagster/row_count": sum(summary.recordings_by_split.values()),
            "segments": summary.segments,
            "new_segments": summary.new_segments,
            "shards_read": summary.shards_read,
            "withdrawn_segments": summary.withdrawn,
            "hours": round(sum(summary.hours_by_split.values()), 6),
            **{f"share_{split}": round(share, 6) for split, share in summary.shares.items()},
            "filtered_by_reason": dg.MetadataValue.json(summary.filtered_by_reason),
            "missing_recordings": len(summary.missing_recordings),
            "splits": markdown_rows(table),
            "state_uri": dg.MetadataValue.path(root.uri(state_path)),
            INPUT_FINGERPRINT: summary.input_fingerprint,
            # It writes no file the catalog reads: the catalog's refresh after it lists no shard.
            CATALOGUED_SHARDS_CHANGED: catalogued_shards_changed([]),
        },
        check_results=[unplotted_check(check) for check in checks],
    )


@group_asset(
    partitions_def=country_partitions,
    deps=[hf_split_assignments],
    kinds={"huggingface", "parquet"},
    code_version="hf_dataset-v8",
)
def hf_dataset(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    hf_dataset_settings: HfDatasetSettings,
) -> dg.MaterializeResult:
    """The country's config of the Hugging Face dataset, in the Hub's parquet layout.

    Files: `hf/<dataset>/<country>/{test,validation,train_<n>}-NNNNN-of-NNNNN-<content hash>.parquet` and the card
    `hf/<dataset>/README.md` whose `configs` list every country's splits. Load with
    `datasets.load_dataset("<data root>/hf/<dataset>", "<country>")`. Rows: the published dataset's features
    (audio as 16-bit FLAC at the country's rate, key, transcripts, CER, WER, times, indices).
    Each split is written in parts, one per shard (`...-shard-<part>-...`): a new shard adds its
    parts and no other file is rewritten; train subsets fill to `max_split_size_gb` across builds; a
    part holding segments a re-landing withdrew, or near duplicates found after they were written,
    is rewritten without them. Each row is identified by `(shard_id, key)`. Nothing is written while
    the `hf` ledger of a changed shard does not balance: the run fails naming the shard and its
    unaccounted utterances. Each changed shard then gets `shards/<shard>/hf/published-<country>.parquet`
    (what the dataset holds of it) and `shards/<shard>/rejects/hf_dataset.parquet` (what the states
    filtered out, with the reason): the `hf` ledger and the catalog's `product_accounting` count these.
    The card is assembled from each country's stored summary, never by opening dataset files. Metadata
    `missing_splits` says why a promised split (test, validation, train) has no file, and
    `input_fingerprint` names the segments built from: `country_dataset_sensor` requests the country
    again only when its shards' rows differ from it. Metadata `shards_whose_catalogued_files_changed`
    names the shards whose published index and rejects were written since a recorded build last
    named them (a failed build's too), so the catalog's next refresh reads those shards alone. Only
    shards with ASR transcripts feed a country (docs/hf-splits.md, "What is published").
    """
    country = context.partition_key
    root = data_root.get()
    options = hf_dataset_settings.options()
    input_fingerprint = _assigned_input_fingerprint(context.instance, country)
    try:
        ledgers = require_balanced_country(root, options.dataset, country)
    except UnbalancedLedger as exc:
        # The dataset's files stay as they were, but the shards' published indexes say what the state
        # holds now, so the catalog shows the same unbalanced shard as this failure.
        write_published_indexes(root, options.dataset, country)
        raise unbalanced_ledger_failure(exc, scope=country) from exc
    summary = build_country_dataset(root, country, options)
    write_dataset_card(
        root,
        options.dataset,
        license=hf_dataset_settings.license,
        license_name=hf_dataset_settings.license_name,
        license_link=hf_dataset_settings.license_link,
        pretty_name=hf_dataset_settings.pretty_name,
    )
    register_card(root, options.dataset, country)
    published_by_shard = write_published_indexes(root, options.dataset, country)
    for split_files in summary.written:
        context.log.info(
            f"{country}: wrote {split_files.split}: {split_files.rows} rows in {len(split_files.files)} files, {split_files.bytes / 1e6:.1f} MB"
        )
    if summary.errors:
        context.log.warning(
            f"{country}: {len(summary.errors)} segments could not be cut, e.g. {next(iter(summary.errors.values()))}"
        )
    with state_connection(root, layout.hf_state_database(options.dataset, country)) as db:
        # Named in this materialization, so the catalog's next refresh reads these shards, not the
        # whole root; kept in the state until a recorded build names them (a failed one names none).
        for_the_catalog = shards_to_report_to_the_catalog(
            db, _latest_recorded_run(context.instance, country), context.run.run_id
        )
        by_status = dict(db.execute("SELECT status, count(*) FROM segments GROUP BY status ORDER BY status").fetchall())
        files = rows_as_dicts(
            db, "SELECT path_in_repo, split, rows, round(bytes / 1e6, 2) AS mb, status FROM files ORDER BY path_in_repo"
        )
    dataset_dir = layout.hf_dataset_dir(options.dataset)
    missing_splits = missing_split_reasons(
        root, options.dataset, country, {r["split"] for r in files if r["split"] and r["status"] != "deleted"}
    )
    if missing_splits:
        context.log.warning(f"{country}: splits missing: {missing_splits}")
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": sum(r["rows"] for r in files if r["split"]),
            "sample_rate": summary.sample_rate or 0,
            "splits_written": dg.MetadataValue.json([s.split for s in summary.written]),
            "splits_unchanged": dg.MetadataValue.json(summary.unchanged),
            "segments_by_status": dg.MetadataValue.json(by_status),
            "cut_errors": len(summary.errors),
            "recording_already_published": summary.already_published,
            "rewritten_for_withdrawal": dg.MetadataValue.json(summary.rewritten_for_withdrawal),
            "shards_balanced": len(ledgers),
            "shards_indexed": len(published_by_shard),
            "audio_hours_written": round(summary.audio_seconds / 3600.0, 6),
            "max_recording_buffer_mb": round(summary.max_recording_buffer_bytes / 1e6, 3),
            "files": markdown_rows(files),
            "missing_splits": dg.MetadataValue.json(missing_splits),
            "dataset_uri": dg.MetadataValue.path(root.uri(dataset_dir)),
            "load_with": dg.MetadataValue.md(
                f'```python\ndatasets.load_dataset("{root.uri(dataset_dir)}", "{country}")\n```'
            ),
            **({INPUT_FINGERPRINT: input_fingerprint} if input_fingerprint else {}),
            CATALOGUED_SHARDS_CHANGED: catalogued_shards_changed(for_the_catalog),
        }
    )


def _latest_recorded_run(instance: dg.DagsterInstance, country: str) -> str | None:
    """The run of the country's latest recorded ``hf_dataset`` materialization: the shards it named
    reached the event log, and so the catalog."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=hf_dataset.key, asset_partitions=[country]), limit=1, ascending=False
    ).records
    return records[0].run_id if records else None


def _assigned_input_fingerprint(instance: dg.DagsterInstance, country: str) -> str | None:
    """The input fingerprint of the country's latest split assignment: the segments this build writes from.

    A country's runs queue one at a time, so the latest ``hf_split_assignments`` is the one this run's
    state holds; a shard landing since then is not in it, and its country is requested again."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=hf_split_assignments.key, asset_partitions=[country]), limit=1, ascending=False
    ).records
    value = records[0].asset_materialization.metadata.get(INPUT_FINGERPRINT) if records else None
    return value.value if value is not None else None


@group_asset(
    partitions_def=country_partitions, deps=[hf_dataset], kinds={"huggingface"}, code_version="hf_hub_upload-v1"
)
def hf_hub_upload(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    hf_dataset_settings: HfDatasetSettings,
    hub: HubPublisherResource,
) -> dg.MaterializeResult:
    """The country's files on the Hugging Face Hub (`hub.repo_id`), uploaded resumably.

    One commit per split; per-file status in the country's state database. A re-run uploads only
    what the Hub lacks. Needs `SPEECHDATA_HF_REPO_ID` and `HF_TOKEN`; the token is never logged.
    """
    if not hub.enabled:
        raise dg.Failure(
            description="Publishing is off: set SPEECHDATA_HF_REPO_ID (and HF_TOKEN) to name the Hub repo."
        )
    country = context.partition_key
    root = data_root.get()
    dataset = hf_dataset_settings.dataset
    summary = publish_country(
        root,
        dataset,
        country,
        hub.api(),
        hub.repo_id,
        revision=hub.revision,
        private=hub.private,
        policy=hub.retry_policy(),
        log=context.log.info,
    )
    if summary.errors:
        raise dg.Failure(
            description=f"{len(summary.errors)} files of {country} failed to upload; re-run to resume.",
            metadata={"errors": dg.MetadataValue.json(summary.errors)},
        )
    return dg.MaterializeResult(
        metadata={
            "repo_id": hub.repo_id,
            "files_committed": len(summary.committed),
            "files_already_on_hub": len(summary.already_on_hub),
            "files_deleted": len(summary.deleted),
            "commits": summary.commits,
            "mb_uploaded": round(summary.bytes_uploaded / 1e6, 3),
        }
    )


# --- the group: its definitions (assembled by dagster_project/loader.py)

HF_DATASET_JOB_NAME = "hf_dataset_job"
HF_PUBLISH_JOB_NAME = "hf_publish_job"

hf_dataset_job = dg.define_asset_job(
    HF_DATASET_JOB_NAME,
    selection=dg.AssetSelection.groups(group_of(__name__)) - dg.AssetSelection.assets(hf_hub_upload),
    description="Assign new recordings to splits and write the country's HF dataset. Launched by country_dataset_sensor.",
)

hf_publish_job = dg.define_asset_job(
    HF_PUBLISH_JOB_NAME,
    selection=dg.AssetSelection.groups(group_of(__name__)),
    description="hf_dataset_job, then upload what the Hub lacks. Launched by country_dataset_sensor when a Hub repo is set.",
)

defs = dg.Definitions(assets=[hf_split_assignments, hf_dataset, hf_hub_upload], jobs=[hf_dataset_job, hf_publish_job])
