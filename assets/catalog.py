"""[catalog] The DuckDB catalog over every shard manifest."""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.packaging import shard_manifest
from assets.partitions import country_partitions, language_partitions
from resources.storage import DataRootResource
from speechdata.catalog import NAMED_QUERIES, format_table, refresh_catalog, run_query


@dg.asset(
    deps=[shard_manifest],
    group_name="catalog",
    kinds={"duckdb"},
    owners=["team:speech-data"],
    code_version="manifest_catalog-v1",
)
def manifest_catalog(
    context: dg.AssetExecutionContext, data_root: DataRootResource, catalog: DuckDBResource
) -> dg.MaterializeResult:
    """`catalog.duckdb` in the data root: view `samples` over every shard manifest, view `rejects`
    over every rejects ledger, and tables `hours_by_language`, `hours_by_country`, `hours_by_shard`.

    Refreshed by `catalog_refresh_sensor` whenever any shard's manifest is materialized (no shard
    asset re-runs). Query it with `python -m dagster_project.catalog --named hours_per_language`,
    `python -m dagster_project.catalog "SELECT ..."`, or `duckdb.connect(path, read_only=True)`.
    New countries and languages it finds become `country` / `language` partitions.
    """
    root = data_root.get()
    root.fs.makedirs(root.root, exist_ok=True)  # DuckDB creates the file, not its directory
    with catalog.get_connection() as connection:
        summary = refresh_catalog(connection, root.uri(""))
        by_language = run_query(connection, NAMED_QUERIES["hours_per_language"])
    for partitions, values in ((country_partitions, summary.countries), (language_partitions, summary.languages)):
        known = set(context.instance.get_dynamic_partitions(partitions.name))
        new = sorted(v for v in values if v and v not in known)
        if new:
            context.instance.add_dynamic_partitions(partitions.name, new)
            context.log.info(f"new {partitions.name} partitions: {new}")
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": summary.samples,
            "shards": summary.shards,
            "hours": round(summary.hours, 6),
            "rejected_utterances": summary.rejected_utterances,
            "languages": dg.MetadataValue.json(summary.languages),
            "countries": dg.MetadataValue.json(summary.countries),
            "hours_by_language": dg.MetadataValue.md(f"```\n{format_table(by_language)}\n```"),
        }
    )
