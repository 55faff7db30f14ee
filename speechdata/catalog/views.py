"""The catalog: DuckDB views and summary tables over every shard manifest and rejects ledger.

``catalog.duckdb`` under the data root holds

* ``samples``: a view over ``manifests/shard=*/part-0.parquet`` (union by name: the landed
  metadata's extra columns differ between shards and are NULL where a shard lacks them);
* ``rejects``: a view over ``shards/*/rejects/*.parquet`` with the ``shard`` taken from the path;
* ``hours_by_language``, ``hours_by_country``, ``hours_by_shard``: summary views (samples,
  hours, mean alignment score); ``product_accounting``: every landed shard's ledger per product
  line of :data:`speechdata.products.PRODUCT_LINES` (:mod:`speechdata.catalog.accounting`); ``catalog_info`` (when and over what the refresh ran);
* ``quality`` and ``quality_decisions``: every shard's quality signals and per-product decisions
  (:mod:`speechdata.catalog.quality`).

Everything but ``catalog_info`` is a view reading the files at query time, so a summary never lags
what it summarizes (a new shard is visible as soon as its manifest is committed, which happens only
after its checks passed). The state tables (:data:`CATALOG_STATE_TABLES`: per-file aggregates,
:mod:`speechdata.catalog.incremental`; per-shard accounting and quality,
:mod:`~speechdata.catalog.accounting_state`, :mod:`~speechdata.catalog.quality_state`) let a refresh
read only the files that changed: :func:`refresh_catalog` keeps them beside the views on its one
connection, the catalog file (:mod:`speechdata.catalog.database_file`) in a state file of its own.
A refresh replaces all of it in one transaction.

* ``words``: every packed sample's aligned words (``shard``, ``key``, ``word_index``, ``word``,
  ``start_ms``, ``end_ms``, ``language``), the same words each bridge sample's ``.json`` carries.

The views name files relative to the data root, prefixed at query time with the connection's
``speechdata_root`` variable (``getvariable('speechdata_root')``), which
:func:`speechdata.io.duckdb_object_store.enable_data_root_reads` sets to the root being read: a
copied or moved root (another disk, another bucket) reads without a refresh. Unset (a plain
``duckdb.connect``), the folder holding the catalog file; the root the catalog was built over is
never read (:mod:`speechdata.catalog.root_paths`).

This module builds the catalog; :mod:`~speechdata.catalog.queries` asks it questions,
:mod:`~speechdata.catalog.exports` writes selections out, :mod:`~speechdata.catalog.cli` is the
``speechdata catalog`` command. Everything takes an open ``duckdb.DuckDBPyConnection``; the caller
owns the connection (a Dagster resource, the CLI, a notebook). For an object-store root the
connection must already be able to read it: :func:`speechdata.io.duckdb_object_store.enable_data_root_reads`
(httpfs with a secret, or the root's fsspec filesystem), and the database file itself is a local
copy put back with :func:`speechdata.io.duckdb_object_store.upload_database`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

import duckdb
import pyarrow as pa

from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.catalog.accounting import product_accounting_sql, product_rejects_sql
from speechdata.catalog.accounting_state import ACCOUNTING_STATE_TABLES, list_accounting_inputs, sync_accounting
from speechdata.catalog.incremental import (
    STATE_TABLES,
    ListedFile,
    clear_state,
    ensure_state_tables,
    has_files,
    list_files,
    one_listing_per_folder,
    summary_totals,
    sync_manifests,
    sync_rejects,
)
from speechdata.catalog.quality import quality_view_definitions
from speechdata.catalog.quality_state import QUALITY_STATE_TABLES, list_quality_inputs, sync_quality
from speechdata.catalog.root_paths import glob_root, set_root_variable, under_root
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.rejects import REJECTS_SCHEMA

CATALOG_FILE = "catalog.duckdb"
"""The catalog database, relative to the data root."""

SUMMARY_VIEWS = ("hours_by_language", "hours_by_country", "hours_by_shard", "product_accounting", "product_rejects")
"""Summaries are views over the live files, so they never lag what they summarize."""
SUMMARY_TABLES = (*SUMMARY_VIEWS, "catalog_info")
_VIEWS_STATE = "catalog_view_definitions"
"""The digest of the views' DDL the last refresh created (re-created only when it changes)."""
CATALOG_STATE_TABLES = (
    STATE_TABLES,
    ACCOUNTING_STATE_TABLES,
    QUALITY_STATE_TABLES,
    {_VIEWS_STATE: "sha256 VARCHAR"},
)
"""Every state table (name -> column definitions), by module."""

_MANIFEST_GLOB = manifest_path("*")
# Atomic writes leave ``._tmp-*`` files beside a ledger while it is written (and after a crash):
# ``[!.]`` keeps them, half-written, out of the view.
_REJECTS_GLOB = f"{layout.SHARDS}/*/rejects/[!.]*.parquet"
_SHARD_FROM_REJECTS_PATH = r"(?:^|/)shards/([^/]+)/rejects/[^/]+$"
_ALIGNMENTS_GLOB = f"{layout.SHARDS}/*/alignments.parquet"
_SHARD_FROM_ALIGNMENTS_PATH = r"(?:^|/)shards/([^/]+)/alignments\.parquet$"
_WORDS_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.string()),
        pa.field("key", pa.string()),
        pa.field("word_index", pa.int32()),
        pa.field("word", pa.string()),
        pa.field("start_ms", pa.int32()),
        pa.field("end_ms", pa.int32()),
        pa.field("language", pa.string()),
    ]
)

DUCKDB_TYPES = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.int32(): "INTEGER",
    pa.float64(): "DOUBLE",
    pa.float32(): "FLOAT",
}
MANIFEST_TYPES = {f.name: DUCKDB_TYPES[f.type] for f in MANIFEST_COLUMNS}


@dataclass(frozen=True)
class CatalogSummary:
    """What one refresh saw: totals over all shard manifests and rejects ledgers."""

    manifest_files: int
    rejects_files: int
    shards: int
    samples: int
    hours: float
    rejects: int
    """Rows in the rejects ledgers (one utterance can be rejected by more than one stage)."""
    rejected_utterances: int
    """Distinct ``(shard, utt_id)`` pairs among the rejects."""
    languages: list[str] = field(default_factory=list)
    countries: list[str] = field(default_factory=list)
    manifests_read: int = 0
    """Manifests this refresh read: new or changed since the last one (all of them on a full refresh)."""
    manifests_reused: int = 0
    """Manifests whose stored aggregates were still current."""
    manifests_dropped: int = 0
    """Manifests gone since the last refresh (a deleted or re-landed shard)."""
    rejects_files_read: int = 0
    accounting_shards_read: int = 0
    """Shards whose per-product accounting this refresh recounted (any of their files new, changed or gone)."""
    quality_shards_read: int = 0
    """Shards whose quality aggregates (histograms, hours lost) this refresh recounted."""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class CatalogInputs:
    """What one refresh works from: the files under the root it lists, and the views' definitions."""

    root_uri: str
    manifests: dict[str, ListedFile]
    rejects: dict[str, ListedFile]
    accounting: dict[str, dict[str, ListedFile]]
    quality: dict[str, dict[str, ListedFile]]
    definitions: list[tuple[str, str]]
    """(view, SELECT) for every view, in creation order."""
    definitions_sha256: str

    @property
    def view_names(self) -> set[str]:
        return {view for view, _ in self.definitions}


def list_catalog_inputs(root_uri: str) -> CatalogInputs:
    """List the files a refresh of the catalog over ``root_uri`` reads (sizes and fingerprints come
    with the listing: no file is opened here). DuckDB fails on a glob that matches nothing, so with
    no manifests (or no ledgers) yet a view is an empty one with the right columns."""
    root = DataRoot(root_uri)
    with one_listing_per_folder():
        manifests = list_files(root, _MANIFEST_GLOB)
        rejects = list_files(root, _REJECTS_GLOB)
        any_alignments = has_files(root, _ALIGNMENTS_GLOB)
        accounting = list_accounting_inputs(root, rejects, already_listed={_MANIFEST_GLOB: manifests})
        quality = list_quality_inputs(root)
        # A root such as ``/data/run[1]`` must match itself, not a character class.
        definitions = _view_definitions(root, glob_root(root_uri), bool(manifests), bool(rejects), any_alignments)
    digest = hashlib.sha256(json.dumps(definitions).encode("utf-8")).hexdigest()
    return CatalogInputs(root_uri, manifests, rejects, accounting, quality, definitions, digest)


def refresh_catalog(connection: duckdb.DuckDBPyConnection, root_uri: str, *, full: bool = False) -> CatalogSummary:
    """(Re)create the views and bring the per-file state up to the files under ``root_uri``, on one
    connection (the state tables beside the views, as a notebook or a test keeps them).

    Incremental by default: only manifests, rejects ledgers and per-shard files that are new or
    changed since the last refresh are read (:mod:`speechdata.catalog.incremental`), and the views
    are re-created only when their definitions change (which globs match nothing, the root).
    ``full=True`` forgets the stored state and reads every file; both give the same catalog.
    Everything is replaced inside one transaction, so a refresh that fails or is killed leaves the
    previous catalog. The catalog file itself (:func:`speechdata.catalog.database_file.refresh_catalog_file`)
    keeps the state in a file of its own, beside the views readers open.
    """
    inputs = list_catalog_inputs(root_uri)
    set_root_variable(connection, root_uri)
    connection.begin()
    try:
        summary = sync_catalog_state(connection, inputs, full=full)
        stored = connection.execute(f"SELECT sha256 FROM {_VIEWS_STATE}").fetchall()
        if full or stored != [(inputs.definitions_sha256,)]:
            create_views(connection, inputs.definitions)
            connection.execute(f"DELETE FROM {_VIEWS_STATE}")
            connection.execute(f"INSERT INTO {_VIEWS_STATE} VALUES (?)", [inputs.definitions_sha256])
        write_catalog_info(connection, inputs)
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    return summary


def ensure_catalog_state(connection: duckdb.DuckDBPyConnection) -> None:
    """Create the state tables that do not exist yet."""
    for tables in CATALOG_STATE_TABLES:
        ensure_state_tables(connection, tables)


def sync_catalog_state(
    connection: duckdb.DuckDBPyConnection, inputs: CatalogInputs, *, full: bool = False
) -> CatalogSummary:
    """Bring the state tables up to ``inputs`` (reading only new and changed files unless ``full``),
    inside the caller's transaction, and sum the totals from them."""
    ensure_catalog_state(connection)
    if full:
        for tables in CATALOG_STATE_TABLES:
            clear_state(connection, tables)
    root_uri = inputs.root_uri
    manifest_counts = sync_manifests(connection, root_uri, inputs.manifests)
    rejects_counts = sync_rejects(connection, root_uri, inputs.rejects, _SHARD_FROM_REJECTS_PATH)
    accounting_shards_read = sync_accounting(connection, root_uri, inputs.accounting, _SHARD_FROM_REJECTS_PATH)
    quality_shards_read = sync_quality(connection, root_uri, inputs.quality)
    return CatalogSummary(
        manifest_files=len(inputs.manifests),
        rejects_files=len(inputs.rejects),
        **summary_totals(connection),
        manifests_read=manifest_counts.read,
        manifests_reused=manifest_counts.reused,
        manifests_dropped=manifest_counts.dropped,
        rejects_files_read=rejects_counts.read,
        accounting_shards_read=accounting_shards_read,
        quality_shards_read=quality_shards_read,
    )


def write_catalog_info(connection: duckdb.DuckDBPyConnection, inputs: CatalogInputs) -> None:
    connection.execute(
        "CREATE OR REPLACE TABLE catalog_info AS SELECT current_timestamp AS refreshed_at, "
        "?::VARCHAR AS data_root, ?::BIGINT AS manifest_files, ?::BIGINT AS rejects_files",
        [inputs.root_uri, len(inputs.manifests), len(inputs.rejects)],
    )


def _view_definitions(
    root: DataRoot, location: str, any_manifests: bool, any_rejects: bool, any_alignments: bool
) -> list[tuple[str, str]]:
    """(view, SELECT) for every view, in creation order; the same text means the same view."""
    if any_manifests:
        samples_sql = (
            f"SELECT * FROM read_parquet({under_root(_MANIFEST_GLOB, location)}, "
            "union_by_name = true, hive_partitioning = false)"
        )
    else:
        samples_sql = _empty_select(MANIFEST_COLUMNS)
    if any_rejects:
        rejects_sql = (
            f"SELECT regexp_extract(filename, {_sql_literal(_SHARD_FROM_REJECTS_PATH)}, 1) AS shard, "
            "utt_id, stage, reason, detail "
            f"FROM read_parquet({under_root(_REJECTS_GLOB, location)}, "
            "union_by_name = true, hive_partitioning = false, filename = true)"
        )
    else:
        rejects_sql = _empty_select(pa.schema([pa.field("shard", pa.string()), *REJECTS_SCHEMA]))
    if any_alignments:
        words_sql = (
            'SELECT s.shard, a.utt_id AS key, a."index" AS word_index, a.text AS word, a.start_ms, a.end_ms, '
            "s.language "
            f"FROM read_parquet({under_root(_ALIGNMENTS_GLOB, location)}, hive_partitioning = false, filename = true) AS a "
            "JOIN samples AS s ON s.key = a.utt_id "
            f"AND s.shard = regexp_extract(a.filename, {_sql_literal(_SHARD_FROM_ALIGNMENTS_PATH)}, 1) "
            "WHERE a.level = 'word'"
        )
    else:
        words_sql = _empty_select(_WORDS_SCHEMA)
    definitions = [("samples", samples_sql), ("rejects", rejects_sql), ("words", words_sql)]
    for group in ("language", "country"):
        definitions.append(
            (
                f"hours_by_{group}",
                f"SELECT {group}, count(*) AS samples, sum(duration_s) / 3600.0 AS hours, "
                "avg(alignment_score) AS mean_alignment_score, count(DISTINCT shard) AS shards "
                f"FROM samples GROUP BY {group} ORDER BY hours DESC, {group}",
            )
        )
    definitions.append(("hours_by_shard", _HOURS_BY_SHARD))
    definitions.append(("product_accounting", product_accounting_sql(root, location)))
    definitions.append(("product_rejects", product_rejects_sql()))
    definitions += quality_view_definitions(root, location)
    return definitions


def create_views(connection: duckdb.DuckDBPyConnection, definitions: list[tuple[str, str]]) -> None:
    old_tables = {r[0] for r in connection.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    for view in set(SUMMARY_VIEWS) & old_tables:  # catalogs refreshed before summaries became views
        connection.execute(f"DROP TABLE {view}")
    for view, sql in definitions:
        connection.execute(f"CREATE OR REPLACE VIEW {view} AS {sql}")


_HOURS_BY_SHARD = """
    WITH packed AS (
        SELECT shard, count(*) AS samples, sum(duration_s) / 3600.0 AS hours,
               avg(alignment_score) AS mean_alignment_score
        FROM samples GROUP BY shard
    ), rejected AS (
        SELECT shard, count(DISTINCT utt_id) AS rejected_utterances FROM rejects GROUP BY shard
    )
    SELECT coalesce(packed.shard, rejected.shard) AS shard,
           coalesce(packed.samples, 0) AS samples,
           coalesce(packed.hours, 0.0) AS hours,
           packed.mean_alignment_score,
           coalesce(rejected.rejected_utterances, 0) AS rejected_utterances
    FROM packed FULL OUTER JOIN rejected ON packed.shard = rejected.shard
    ORDER BY shard
    """


def _sql_literal(text: str) -> str:
    """A SQL string literal (for DDL, where DuckDB takes no parameters; never for user values)."""
    return "'" + text.replace("'", "''") + "'"


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _empty_select(schema: pa.Schema) -> str:
    columns = ", ".join(f"CAST(NULL AS {DUCKDB_TYPES[f.type]}) AS {quote_identifier(f.name)}" for f in schema)
    return f"SELECT {columns} WHERE false"
