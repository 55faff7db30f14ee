"""[catalog] The DuckDB catalog over every shard manifest."""

import dagster as dg
from dagster_duckdb import DuckDBResource
from dagster_shared.check import CheckError

from assets.asset_policy import group_asset, group_of
from assets.packaging import shard_manifest
from assets.partitions import add_partition_keys, country_partitions, language_partitions, shard_partitions
from assets.reporting import markdown_rows
from resources.storage import DataRootResource
from speechdata import products
from speechdata.catalog.database_file import REFRESH_SUMMARY_QUERIES, refresh_catalog_file
from speechdata.catalog.display import format_table
from speechdata.catalog.quality import SIGNAL_UNITS
from speechdata.catalog.quality_state import HOURS_LOST
from speechdata.catalog.views import CATALOG_FILE
from speechdata.io.duckdb_object_store import upload_database

UI_POSITION = 5


QUALITY_HISTOGRAM_PREFIX = "quality_histogram"
"""Metadata ``quality_histogram/<language>/<signal>``: the signal's distribution over the language's utterances."""


CATALOGUED_THROUGH = "catalogued_events_through"
"""Metadata: the storage id of the newest materialization of a catalogued asset the refresh covered;
the next refresh looks at the shards materialized after it."""
MAX_CHANGED_SHARDS = 10_000
"""More changed shards than this and the refresh lists the root instead of naming each."""
CATALOGUED_SHARDS_CHANGED = "shards_whose_catalogued_files_changed"
"""Metadata of a catalogued asset not partitioned by shard (a country's ``hf_dataset``): the shards
whose files the catalog reads it wrote, as a list, or :data:`EVERY_SHARD` when it cannot name them
(more than :data:`MAX_CHANGED_SHARDS`). Without it the refresh after it lists the root."""
EVERY_SHARD = "all"


def catalogued_shards_changed(shards: list[str]) -> dg.MetadataValue:
    """The value of :data:`CATALOGUED_SHARDS_CHANGED` for ``shards``: bounded by :data:`MAX_CHANGED_SHARDS`."""
    return dg.MetadataValue.json(sorted(shards) if len(shards) <= MAX_CHANGED_SHARDS else EVERY_SHARD)


def changed_shards(context: dg.AssetExecutionContext) -> tuple[list[str] | None, int]:
    """The shards whose catalogued assets (:func:`speechdata.products.catalogued_assets`) were
    materialized since the last refresh, from the event log, and the storage id this covers; a
    catalogued asset not partitioned by shard (a country's HF dataset) counts with the shards its
    metadata :data:`CATALOGUED_SHARDS_CHANGED` names. None when that cannot be said by shard (no
    earlier refresh recorded one; such an asset's materialization without that list, or saying
    :data:`EVERY_SHARD`): the root is listed."""
    instance = context.instance
    keys = [dg.AssetKey(name) for name in products.catalogued_assets()]
    newest = [instance.fetch_materializations(key, limit=1).records for key in keys]
    through = max((records[0].storage_id for records in newest if records), default=0)
    last = instance.fetch_materializations(context.asset_key, limit=1).records
    covered = last[0].asset_materialization.metadata.get(CATALOGUED_THROUGH) if last else None
    if covered is None:
        return None, through
    graph = _asset_graph(context)
    shards: set[str] = set()
    for key in keys:
        shard_keyed = graph.has(key) and graph.get(key).partitions_def == shard_partitions
        cursor = None
        while True:
            page = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=key, after_storage_id=covered.value, before_storage_id=through + 1),
                limit=1000,
                cursor=cursor,
            )
            for record in page.records:
                named = [record.partition_key] if shard_keyed else _shards_named(record)
                if named is None or None in named:
                    return None, through
                shards.update(named)
            if len(shards) > MAX_CHANGED_SHARDS:
                return None, through
            if not page.has_more:
                break
            cursor = page.cursor
    return sorted(shards), through


def _shards_named(record) -> list[str] | None:
    """The shards a materialization not partitioned by shard says it changed, or None when it names none."""
    value = record.asset_materialization.metadata.get(CATALOGUED_SHARDS_CHANGED)
    named = value.value if value is not None else None
    return named if isinstance(named, list) and all(isinstance(s, str) for s in named) else None


def _asset_graph(context: dg.AssetExecutionContext):
    """Every asset of the code location (to tell the shard-partitioned catalogued assets); a run
    outside one (``dg.materialize``) knows the assets it was given: the graph its job was selected
    from, not the job's own (which holds the selected assets and their parents alone)."""
    try:
        return context.repository_def.asset_graph
    except CheckError:  # no repository: Dagster's own invariant, not an error of ours
        graph = context.job_def.asset_layer.asset_graph
        return getattr(graph, "source_asset_graph", graph)


class CatalogRefreshConfig(dg.Config):
    full: bool = False
    """Re-read every manifest and rejects ledger instead of only those changed since the last refresh."""


@group_asset(
    deps=[shard_manifest],
    kinds={"duckdb"},
    code_version="manifest_catalog-v4",
)
def manifest_catalog(
    context: dg.AssetExecutionContext,
    config: CatalogRefreshConfig,
    data_root: DataRootResource,
    catalog: DuckDBResource,
) -> dg.MaterializeResult:
    """`catalog.duckdb` in the data root: view `samples` over every shard manifest, view `rejects`
    over every rejects ledger, summary views `hours_by_language`, `hours_by_country`, `hours_by_shard`,
    and `product_accounting` / `product_rejects`: every landed shard's ledger per product line.

    Refreshed by `catalog_refresh_sensor` whenever any shard's manifest is materialized (no shard
    asset re-runs). Query it with `speechdata catalog --named hours_per_language`,
    `speechdata catalog "SELECT ..."`, or `duckdb.connect(path, read_only=True)`.
    A refresh reads only the manifests, ledgers and per-shard indexes changed since the last one
    (config `full: true`: all of them), and stats only the files of the shards whose catalogued
    assets were materialized since (from the event log, a country's `hf_dataset` naming the shards
    it wrote in `shards_whose_catalogued_files_changed`; the whole root is listed on the first
    refresh, when a catalogued asset not partitioned by shard changed without naming its shards:
    metadata `listed`); its metadata says how many were read and reused, and its
    accounting tables come from the per-shard state the refresh keeps. Per landed language, metadata
    `quality_histogram/<language>/<signal>` shows the distribution of `snr_db`, `bandwidth_hz`,
    `speech_share` and `cer` (view `quality`), and `hours_lost_per_reason_per_language` what each
    product's quality filter left out (docs/quality.md, "Where it shows"). The refresh builds a new file
    and swaps it in: readers keep the version they opened and never make it wait. A catalog file
    DuckDB cannot read is rebuilt from scratch (metadata `rebuilt_because` says why).
    New countries and languages it finds become `country` / `language` partitions. On an object-store
    data root the views read `s3://...` through DuckDB's httpfs (or the root's fsspec filesystem) and
    the database is built locally and uploaded whole.
    """
    root = data_root.get()
    # Only the shards materialized since the last refresh are looked at (the root is still listed
    # whole on the first refresh, on `full`, and periodically: speechdata.catalog.views.listing_scope).
    shards, catalogued_through = changed_shards(context)
    # Built into a new file and swapped in whole: readers keep the version they opened and never block it.
    refreshed = refresh_catalog_file(
        catalog.database,
        root,
        full=config.full,
        shards=shards,
        # From the stored per-manifest and per-shard state: the named queries would re-read every shard.
        queries=REFRESH_SUMMARY_QUERIES,
    )
    summary, read_through = refreshed.summary, refreshed.reads_through
    by_language, accounting = refreshed.tables["by_language"], refreshed.tables["accounting"]
    by_product = refreshed.tables["by_product"].to_pylist()
    ledgers_by_state = {r["state"]: r["rows"] for r in refreshed.tables["accounting_states"].to_pylist()}
    if refreshed.rebuilt_because:
        context.log.warning(f"catalog rebuilt from scratch: {refreshed.rebuilt_because}")
    if refreshed.dropped:
        context.log.warning(f"left out of the catalog, not its own: {', '.join(refreshed.dropped)}")
    if not root.is_local:
        # DuckDB writes local files only: the resource's file is this worker's copy, the bucket gets it whole.
        upload_database(root, catalog.database, CATALOG_FILE)
    for partitions, values in ((country_partitions, summary.countries), (language_partitions, summary.languages)):
        new = add_partition_keys(context.instance, partitions, values)
        if new:
            context.log.info(f"new {partitions.name} partitions: {new}")
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": summary.samples,
            CATALOGUED_THROUGH: catalogued_through,
            # What the refresh listed: the changed shards' own paths, or the whole root.
            "listed": "whole root" if summary.listed_shards is None else f"{summary.listed_shards} changed shards",
            "shards": summary.shards,
            "hours": round(summary.hours, 6),
            "manifests_read": summary.manifests_read,
            "manifests_reused": summary.manifests_reused,
            "manifests_dropped": summary.manifests_dropped,
            "accounting_shards_recounted": summary.accounting_shards_read,
            "quality_shards_recounted": summary.quality_shards_read,
            "rejected_utterances": summary.rejected_utterances,
            "languages": dg.MetadataValue.json(summary.languages),
            "countries": dg.MetadataValue.json(summary.countries),
            "hours_by_language": dg.MetadataValue.md(f"```\n{format_table(by_language)}\n```"),
            "rejects_by_product": dg.MetadataValue.md(
                "| product | reason | utterances | shards |\n|---|---|---|---|\n"
                + "\n".join(
                    f"| {r['product']} | {r['reason']} | {r['utterances']} | {r['shards']} |" for r in by_product
                )
            ),
            **{f"rejects/{r['product']}/{r['reason']}": int(r["utterances"]) for r in by_product},
            "unbalanced_ledgers": ledgers_by_state.get("unbalanced", 0),
            "ledgers_not_built": ledgers_by_state.get("not built", 0),
            "shard_accounting": dg.MetadataValue.md(
                f"```\n{format_table(accounting, max_rows=100, total_rows=sum(ledgers_by_state.values()))}\n```"
            ),
            "catalog_uri": dg.MetadataValue.path(root.uri(CATALOG_FILE)),
            "rebuilt_because": refreshed.rebuilt_because or "",
            "left_out_not_its_own": dg.MetadataValue.json(refreshed.dropped),
            "duckdb_reads_through": read_through,
            **quality_metadata(
                refreshed.tables["signal_histograms"].to_pylist(), refreshed.tables[HOURS_LOST].to_pylist()
            ),
        }
    )


def quality_metadata(signal_histograms: list[dict], hours_lost: list[dict]) -> dict[str, dg.MetadataValue]:
    """A histogram per language and main signal (the rows of
    :data:`~speechdata.catalog.quality_state.SIGNAL_HISTOGRAMS_FROM_STATE`, binned by DuckDB), and the
    hours each product's quality filter lost."""
    by_histogram: dict[tuple[str, str], list[dict]] = {}
    for row in signal_histograms:
        by_histogram.setdefault((row["language"], row["signal"]), []).append(row)
    metadata: dict[str, dg.MetadataValue] = {
        f"{QUALITY_HISTOGRAM_PREFIX}/{language}/{signal}": binned_histogram(rows, SIGNAL_UNITS[signal])
        for (language, signal), rows in by_histogram.items()
    }
    lost = [{**row, "hours": round(row["hours"], 4)} for row in hours_lost]
    metadata[HOURS_LOST] = markdown_rows(lost)
    return metadata


def binned_histogram(rows: list[dict], unit: str, width: int = 30) -> dg.MetadataValue:
    """One histogram's ranges (``range_start``, ``range_end``, ``utterances``, and the totals
    ``values_counted``, ``missing``, ``low``, ``high`` on every row) as a markdown table with a bar
    per range, in the form of :func:`assets.reporting.markdown_histogram`."""
    first = rows[0]
    counted, missing = first["values_counted"], first["missing"]
    if not counted:
        return dg.MetadataValue.md(f"_no values_ ({missing} null)" if missing else "_no values_")
    ranges = [r for r in rows if r["position"] is not None]
    top = max(r["utterances"] for r in ranges) or 1
    lines = [f"| {unit} | count | |", "|---|---|---|"]
    for r in ranges:
        bar = "#" * round(width * r["utterances"] / top)
        lines.append(f"| {r['range_start']:.3g} to {r['range_end']:.3g} | {r['utterances']} | `{bar}` |")
    footer = f"\n\n{counted} values, min {first['low']:.3g}, max {first['high']:.3g}" + (
        f", {missing} null" if missing else ""
    )
    return dg.MetadataValue.md("\n".join(lines) + footer)


# --- the group: its definitions (assembled by dagster_project/loader.py)

CATALOG_JOB_NAME = "manifest_catalog_job"

manifest_catalog_job = dg.define_asset_job(
    CATALOG_JOB_NAME,
    selection=dg.AssetSelection.groups(group_of(__name__)),
    description="Refresh the DuckDB catalog over every shard manifest. Launched by catalog_refresh_sensor.",
)

defs = dg.Definitions(assets=[manifest_catalog], jobs=[manifest_catalog_job])
