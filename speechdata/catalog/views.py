"""The catalog: DuckDB views and summary tables over every shard manifest and rejects ledger.

``catalog.duckdb`` under the data root holds

* ``samples``: a view over ``manifests/shard=*/part-0.parquet`` (union by name: the landed
  metadata's extra columns differ between shards and are NULL where a shard lacks them);
* ``rejects``: a view over ``shards/*/rejects/*.parquet`` with the ``shard`` taken from the path;
* ``hours_by_language``, ``hours_by_country``, ``hours_by_shard``: summary views (samples,
  hours, mean alignment score, ``pseudo_labels``: samples whose text is the aligner's own, ``text_source = 'asr'``); ``product_accounting``: every landed shard's ledger per product
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
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, replace

import duckdb
import pyarrow as pa

from speechdata import products
from speechdata.accounting.rejects import REJECTS_SCHEMA
from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.catalog.accounting import LANDED_GLOB, product_accounting_sql, product_rejects_sql
from speechdata.catalog.accounting_state import (
    ACCOUNTING_STATE_TABLES,
    LANDED,
    REJECTS,
    list_accounting_inputs,
    sync_accounting,
)
from speechdata.catalog.incremental import (
    STATE_TABLES,
    ListedFile,
    ShardScope,
    clear_state,
    ensure_state_tables,
    known_matches,
    list_files,
    list_shard_files,
    one_listing_per_folder,
    shard_of_path,
    stored_files,
    summary_totals,
    sync_manifests,
    sync_rejects,
)
from speechdata.catalog.quality import quality_view_definitions
from speechdata.catalog.quality_state import QUALITY_GLOBS, QUALITY_STATE_TABLES, list_quality_inputs, sync_quality
from speechdata.catalog.root_paths import glob_root, set_root_variable, under_root
from speechdata.io import layout
from speechdata.io.storage import DataRoot

CATALOG_FILE = "catalog.duckdb"
"""The catalog database, relative to the data root."""

SUMMARY_VIEWS = ("hours_by_language", "hours_by_country", "hours_by_shard", "product_accounting", "product_rejects")
"""Summaries are views over the live files, so they never lag what they summarize."""
SUMMARY_TABLES = (*SUMMARY_VIEWS, "catalog_info")
_VIEWS_STATE = "catalog_view_definitions"
"""The digest of the views' DDL the last refresh created (re-created only when it changes)."""
_LISTED_SHARDS = "catalog_listed_shards"
"""Per per-shard glob the catalog lists, the shards with a file matching it: which globs match
anything (what the views are built from) without listing the corpus."""
_LISTING = "catalog_listing"
"""How many scoped refreshes ran since the last full listing (no row: none ever listed the root)."""
LISTING_STATE_TABLES = {
    _LISTED_SHARDS: "relative_glob VARCHAR, shard VARCHAR",
    _LISTING: "refreshes_since_full_listing BIGINT",
}
FULL_LISTING_EVERY = 100
"""A refresh told which shards changed still lists the whole root once in this many refreshes: a
shard deleted or rewritten behind the platform's back is found within that many."""
CATALOG_STATE_TABLES = (
    STATE_TABLES,
    ACCOUNTING_STATE_TABLES,
    QUALITY_STATE_TABLES,
    {_VIEWS_STATE: "sha256 VARCHAR"},
    LISTING_STATE_TABLES,
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
    listed_shards: int | None = None
    """How many shards' files the refresh stat'ed by name (a refresh told which changed); None: it
    listed the whole root."""

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
    """(view, SELECT) for every view, in creation order (of a scoped listing: empty until
    :func:`sync_catalog_state` decided them from the state)."""
    definitions_sha256: str
    shards: frozenset[str] | None = None
    """The shards listed, when the listing was scoped to them; None: the whole root was listed."""
    alignments: dict[str, ListedFile] = field(default_factory=dict)
    manifest_files: int | None = None
    """Manifests under the root (of a scoped listing: from the state, once synced); None: ``len(manifests)``."""
    rejects_files: int | None = None

    @property
    def manifest_file_count(self) -> int:
        return len(self.manifests) if self.manifest_files is None else self.manifest_files

    @property
    def rejects_file_count(self) -> int:
        return len(self.rejects) if self.rejects_files is None else self.rejects_files

    def listed_by_glob(self) -> dict[str, dict[str, ListedFile]]:
        """Every per-shard glob listed, with its files (several sources may share a glob)."""
        by_glob: dict[str, dict[str, ListedFile]] = {
            _MANIFEST_GLOB: self.manifests,
            _REJECTS_GLOB: self.rejects,
            _ALIGNMENTS_GLOB: self.alignments,
        }
        globs = {LANDED: LANDED_GLOB, REJECTS: _REJECTS_GLOB}
        globs.update({line.name: line.output_glob for line in products.product_lines()})
        for name, files in self.accounting.items():
            by_glob.setdefault(globs[name], {}).update(files)
        for name, files in self.quality.items():
            by_glob.setdefault(QUALITY_GLOBS[name], {}).update(files)
        return by_glob

    @property
    def view_names(self) -> set[str]:
        return {view for view, _ in self.definitions}


def list_catalog_inputs(root_uri: str, shards: Collection[str] | None = None) -> CatalogInputs:
    """List the files a refresh of the catalog over ``root_uri`` reads (sizes and fingerprints come
    with the listing: no file is opened here). DuckDB fails on a glob that matches nothing, so with
    no manifests (or no ledgers) yet a view is an empty one with the right columns.

    ``shards``: list those shards' files alone, by their literal paths (:func:`~speechdata.catalog.incremental.list_shard_files`),
    a cost that does not grow with the corpus; the views' definitions (which globs match anything)
    are then decided from the state by :func:`sync_catalog_state`."""
    root = DataRoot(root_uri)
    if shards is not None:
        scope = frozenset(shards)
        manifests = list_shard_files(root, _MANIFEST_GLOB, scope)
        rejects = list_shard_files(root, _REJECTS_GLOB, scope)
        return CatalogInputs(
            root_uri,
            manifests,
            rejects,
            list_accounting_inputs(root, rejects, already_listed={_MANIFEST_GLOB: manifests}, shards=scope),
            list_quality_inputs(root, scope),
            [],
            "",
            shards=scope,
            alignments=list_shard_files(root, _ALIGNMENTS_GLOB, scope),
        )
    with one_listing_per_folder():
        manifests = list_files(root, _MANIFEST_GLOB)
        rejects = list_files(root, _REJECTS_GLOB)
        alignments = list_files(root, _ALIGNMENTS_GLOB)
        accounting = list_accounting_inputs(root, rejects, already_listed={_MANIFEST_GLOB: manifests})
        quality = list_quality_inputs(root)
        # A root such as ``/data/run[1]`` must match itself, not a character class.
        definitions = _view_definitions(root, glob_root(root_uri), bool(manifests), bool(rejects), bool(alignments))
    return _with_definitions(
        CatalogInputs(root_uri, manifests, rejects, accounting, quality, [], "", alignments=alignments), definitions
    )


def _with_definitions(inputs: CatalogInputs, definitions: list[tuple[str, str]]) -> CatalogInputs:
    digest = hashlib.sha256(json.dumps(definitions).encode("utf-8")).hexdigest()
    return replace(inputs, definitions=definitions, definitions_sha256=digest)


def listing_scope(
    connection: duckdb.DuckDBPyConnection,
    shards: Collection[str] | None,
    *,
    full: bool = False,
    full_listing_every: int = FULL_LISTING_EVERY,
) -> frozenset[str] | None:
    """The shards a refresh may list alone, or None when it must list the whole root: on ``full``,
    when the caller cannot say what changed (``shards`` None), when no refresh listed the root
    into this state yet, and once in ``full_listing_every`` refreshes (a shard deleted by hand)."""
    if shards is None or full:
        return None
    ensure_catalog_state(connection)
    rows = connection.execute(f"SELECT refreshes_since_full_listing FROM {_LISTING}").fetchall()
    if len(rows) != 1 or rows[0][0] + 1 >= full_listing_every:
        return None
    return frozenset(shards)


def refresh_catalog(
    connection: duckdb.DuckDBPyConnection,
    root_uri: str,
    *,
    full: bool = False,
    shards: Collection[str] | None = None,
    full_listing_every: int = FULL_LISTING_EVERY,
) -> CatalogSummary:
    """(Re)create the views and bring the per-file state up to the files under ``root_uri``, on one
    connection (the state tables beside the views, as a notebook or a test keeps them).

    Incremental by default: only manifests, rejects ledgers and per-shard files that are new or
    changed since the last refresh are read (:mod:`speechdata.catalog.incremental`), and the views
    are re-created only when their definitions change (which globs match nothing, the root).
    ``full=True`` forgets the stored state and reads every file; both give the same catalog.
    ``shards``: the shards materialized, re-landed or deleted since the last refresh; only their
    files are looked at (:func:`listing_scope` says when the whole root is listed all the same).
    Everything is replaced inside one transaction, so a refresh that fails or is killed leaves the
    previous catalog. The catalog file itself (:func:`speechdata.catalog.database_file.refresh_catalog_file`)
    keeps the state in a file of its own, beside the views readers open.
    """
    set_root_variable(connection, root_uri)
    connection.begin()
    try:
        scope = listing_scope(connection, shards, full=full, full_listing_every=full_listing_every)
        summary, inputs = sync_catalog_inputs(connection, list_catalog_inputs(root_uri, scope), full=full)
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
    inside the caller's transaction, and sum the totals from them. Inputs listed for some shards
    (:attr:`CatalogInputs.shards`) bring those shards' state up to date and leave every other's."""
    return sync_catalog_inputs(connection, inputs, full=full)[0]


def sync_catalog_inputs(
    connection: duckdb.DuckDBPyConnection, inputs: CatalogInputs, *, full: bool = False
) -> tuple[CatalogSummary, CatalogInputs]:
    """:func:`sync_catalog_state`, and the inputs completed from the state (a scoped listing's views'
    definitions and file counts: what a full listing of the root would give)."""
    ensure_catalog_state(connection)
    scope = inputs.shards
    if full and scope is not None:
        raise ValueError("a full refresh lists the whole root: list_catalog_inputs without shards")
    if full:
        for tables in CATALOG_STATE_TABLES:
            clear_state(connection, tables)
    root_uri = inputs.root_uri
    manifest_counts = sync_manifests(
        connection, root_uri, inputs.manifests, None if scope is None else ShardScope(scope, _MANIFEST_GLOB)
    )
    rejects_counts = sync_rejects(
        connection,
        root_uri,
        inputs.rejects,
        _SHARD_FROM_REJECTS_PATH,
        None if scope is None else ShardScope(scope, _REJECTS_GLOB),
    )
    accounting_shards_read = sync_accounting(
        connection, root_uri, inputs.accounting, _SHARD_FROM_REJECTS_PATH, shards=scope
    )
    quality_shards_read = sync_quality(connection, root_uri, inputs.quality, shards=scope)
    matches = _sync_listed_shards(connection, inputs)
    if scope is not None:
        root = DataRoot(root_uri)
        with known_matches(matches):
            definitions = _view_definitions(
                root,
                glob_root(root_uri),
                matches[_MANIFEST_GLOB],
                matches[_REJECTS_GLOB],
                matches[_ALIGNMENTS_GLOB],
            )
        inputs = replace(
            _with_definitions(inputs, definitions),
            manifest_files=stored_files(connection, "catalog_manifest_files"),
            rejects_files=stored_files(connection, "catalog_rejects_files"),
        )
    summary = CatalogSummary(
        manifest_files=inputs.manifest_file_count,
        rejects_files=inputs.rejects_file_count,
        **summary_totals(connection),
        manifests_read=manifest_counts.read,
        manifests_reused=manifest_counts.reused,
        manifests_dropped=manifest_counts.dropped,
        rejects_files_read=rejects_counts.read,
        accounting_shards_read=accounting_shards_read,
        quality_shards_read=quality_shards_read,
        listed_shards=None if scope is None else len(scope),
    )
    return summary, inputs


def _sync_listed_shards(connection: duckdb.DuckDBPyConnection, inputs: CatalogInputs) -> dict[str, bool]:
    """Record which shards have a file of each listed glob (those of the scope, or all), count the
    refresh against the next full listing; returns, per glob, whether any shard has a file of it."""
    listed = inputs.listed_by_glob()
    if inputs.shards is None:
        connection.execute(f"DELETE FROM {_LISTED_SHARDS}")
        connection.execute(f"DELETE FROM {_LISTING}")
        connection.execute(f"INSERT INTO {_LISTING} VALUES (0)")
    else:
        connection.execute(
            f"DELETE FROM {_LISTED_SHARDS} WHERE shard IN (SELECT unnest(?::VARCHAR[]))", [sorted(inputs.shards)]
        )
        connection.execute(f"UPDATE {_LISTING} SET refreshes_since_full_listing = refreshes_since_full_listing + 1")
    rows = sorted({(glob, shard_of_path(glob, path)) for glob, files in listed.items() for path in files})
    if rows:
        connection.execute(
            f"INSERT INTO {_LISTED_SHARDS} SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
            [[glob for glob, _ in rows], [shard for _, shard in rows]],
        )
    found = {row[0] for row in connection.execute(f"SELECT DISTINCT relative_glob FROM {_LISTED_SHARDS}").fetchall()}
    return {glob: glob in found for glob in listed}


def write_catalog_info(connection: duckdb.DuckDBPyConnection, inputs: CatalogInputs) -> None:
    connection.execute(
        "CREATE OR REPLACE TABLE catalog_info AS SELECT current_timestamp AS refreshed_at, "
        "?::VARCHAR AS data_root, ?::BIGINT AS manifest_files, ?::BIGINT AS rejects_files",
        [inputs.root_uri, inputs.manifest_file_count, inputs.rejects_file_count],
    )


def _view_definitions(
    root: DataRoot, location: str, any_manifests: bool, any_rejects: bool, any_alignments: bool
) -> list[tuple[str, str]]:
    """(view, SELECT) for every view, in creation order; the same text means the same view."""
    if any_manifests:
        # Unioned by name with an empty select of every manifest column: a root whose manifests were
        # all written before a column existed (text_source, asr_confidence) still has it, as NULL,
        # so the summaries that read it never fail there.
        samples_sql = (
            f"SELECT * FROM read_parquet({under_root(_MANIFEST_GLOB, location)}, "
            f"union_by_name = true, hive_partitioning = false) UNION ALL BY NAME {_empty_select(MANIFEST_COLUMNS)}"
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
                "avg(alignment_score) AS mean_alignment_score, count(DISTINCT shard) AS shards, "
                f"{_PSEUDO_LABELS} FROM samples GROUP BY {group} ORDER BY hours DESC, {group}",
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


_PSEUDO_LABELS = "count(*) FILTER (WHERE text_source = 'asr') AS pseudo_labels"
"""Packed samples whose text is the aligner's pseudo-label (landed without text): a column of every hours view."""

_HOURS_BY_SHARD = f"""
    WITH packed AS (
        SELECT shard, count(*) AS samples, sum(duration_s) / 3600.0 AS hours,
               avg(alignment_score) AS mean_alignment_score, {_PSEUDO_LABELS}
        FROM samples GROUP BY shard
    ), rejected AS (
        SELECT shard, count(DISTINCT utt_id) AS rejected_utterances FROM rejects GROUP BY shard
    )
    SELECT coalesce(packed.shard, rejected.shard) AS shard,
           coalesce(packed.samples, 0) AS samples,
           coalesce(packed.hours, 0.0) AS hours,
           packed.mean_alignment_score,
           coalesce(rejected.rejected_utterances, 0) AS rejected_utterances,
           coalesce(packed.pseudo_labels, 0) AS pseudo_labels
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
