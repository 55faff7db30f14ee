"""The catalog: DuckDB views and summary tables over every shard manifest and rejects ledger.

``catalog.duckdb`` under the data root holds

* ``samples``: a view over ``manifests/shard=*/part-0.parquet`` (union by name: the landed
  metadata's extra columns differ between shards and are NULL where a shard lacks them);
* ``rejects``: a view over ``shards/*/rejects/*.parquet`` with the ``shard`` taken from the path;
* ``hours_by_language``, ``hours_by_country``, ``hours_by_shard``: summary views (samples,
  hours, mean alignment score, ``pseudo_labels``: samples whose text is the aligner's own,
  ``text_source = 'asr'``); ``product_accounting``: every landed shard's ledger per product
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

from speechdata import products
from speechdata.catalog.accounting import LANDED_GLOB
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
    stored_files,
    summary_totals,
    sync_manifests,
    sync_rejects,
)
from speechdata.catalog.listing_state import (
    CHECKED_SHARDS_PER_REFRESH,
    FULL_LISTING_EVERY,
    LISTING_STATE_TABLES,
    listing_scope,
    sync_listed_shards,
)
from speechdata.catalog.quality_state import (
    QUALITY_GLOBS,
    QUALITY_STATE_TABLES,
    QUALITY_TOTAL_TABLES,
    list_quality_inputs,
    sync_quality,
)
from speechdata.catalog.root_paths import glob_root, set_root_variable
from speechdata.catalog.state_layout import STATE_LAYOUT_TABLES, record_state_layout, state_predates_layout
from speechdata.catalog.view_definitions import (
    ALIGNMENTS_GLOB,
    MANIFEST_GLOB,
    REJECTS_GLOB,
    SHARD_FROM_REJECTS_PATH,
    view_definitions,
)
from speechdata.catalog.view_definitions import (
    DUCKDB_TYPES as DUCKDB_TYPES,
)
from speechdata.catalog.view_definitions import (
    MANIFEST_TYPES as MANIFEST_TYPES,
)
from speechdata.catalog.view_definitions import (
    SUMMARY_VIEWS as SUMMARY_VIEWS,
)
from speechdata.catalog.view_definitions import (
    create_views as create_views,
)
from speechdata.catalog.view_definitions import (
    quote_identifier as quote_identifier,
)
from speechdata.io.storage import DataRoot

CATALOG_FILE = "catalog.duckdb"
"""The catalog database, relative to the data root."""

SUMMARY_TABLES = (*SUMMARY_VIEWS, "catalog_info")
_VIEWS_STATE = "catalog_view_definitions"
"""The digest of the views' DDL the last refresh created (re-created only when it changes)."""
CATALOG_STATE_TABLES = (
    STATE_TABLES,
    ACCOUNTING_STATE_TABLES,
    QUALITY_STATE_TABLES,
    QUALITY_TOTAL_TABLES,
    {_VIEWS_STATE: "sha256 VARCHAR"},
    STATE_LAYOUT_TABLES,
    LISTING_STATE_TABLES,
)
"""Every state table (name -> column definitions), by module."""


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
            MANIFEST_GLOB: self.manifests,
            REJECTS_GLOB: self.rejects,
            ALIGNMENTS_GLOB: self.alignments,
        }
        globs = {LANDED: LANDED_GLOB, REJECTS: REJECTS_GLOB}
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
        manifests = list_shard_files(root, MANIFEST_GLOB, scope)
        rejects = list_shard_files(root, REJECTS_GLOB, scope)
        return CatalogInputs(
            root_uri,
            manifests,
            rejects,
            list_accounting_inputs(root, rejects, already_listed={MANIFEST_GLOB: manifests}, shards=scope),
            list_quality_inputs(root, scope),
            [],
            "",
            shards=scope,
            alignments=list_shard_files(root, ALIGNMENTS_GLOB, scope),
        )
    with one_listing_per_folder():
        manifests = list_files(root, MANIFEST_GLOB)
        rejects = list_files(root, REJECTS_GLOB)
        alignments = list_files(root, ALIGNMENTS_GLOB)
        accounting = list_accounting_inputs(root, rejects, already_listed={MANIFEST_GLOB: manifests})
        quality = list_quality_inputs(root)
        # A root such as ``/data/run[1]`` must match itself, not a character class.
        definitions = view_definitions(root, glob_root(root_uri), bool(manifests), bool(rejects), bool(alignments))
    return _with_definitions(
        CatalogInputs(root_uri, manifests, rejects, accounting, quality, [], "", alignments=alignments), definitions
    )


def _with_definitions(inputs: CatalogInputs, definitions: list[tuple[str, str]]) -> CatalogInputs:
    digest = hashlib.sha256(json.dumps(definitions).encode("utf-8")).hexdigest()
    return replace(inputs, definitions=definitions, definitions_sha256=digest)


def refresh_catalog(
    connection: duckdb.DuckDBPyConnection,
    root_uri: str,
    *,
    full: bool = False,
    shards: Collection[str] | None = None,
    full_listing_every: int | None = FULL_LISTING_EVERY,
    checked_per_refresh: int = CHECKED_SHARDS_PER_REFRESH,
) -> CatalogSummary:
    """(Re)create the views and bring the per-file state up to the files under ``root_uri``, on one
    connection (the state tables beside the views, as a notebook or a test keeps them).

    Incremental by default: only manifests, rejects ledgers and per-shard files that are new or
    changed since the last refresh are read (:mod:`speechdata.catalog.incremental`), and the views
    are re-created only when their definitions change (which globs match nothing, the root).
    ``full=True`` forgets the stored state and reads every file; both give the same catalog.
    ``shards``: the shards materialized, re-landed or deleted since the last refresh; only their
    files are looked at, and a few known shards in turn (:mod:`~speechdata.catalog.listing_state`
    says which, and when the whole root is listed all the same).
    Everything is replaced inside one transaction, so a refresh that fails or is killed leaves the
    previous catalog. The catalog file itself (:func:`speechdata.catalog.database_file.refresh_catalog_file`)
    keeps the state in a file of its own, beside the views readers open.
    """
    set_root_variable(connection, root_uri)
    connection.begin()
    try:
        full = full or state_predates_layout(connection)
        scope = listing_scope(
            connection,
            shards,
            full=full,
            full_listing_every=full_listing_every,
            checked_per_refresh=checked_per_refresh,
            root_uri=root_uri,
        )
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
    scope = inputs.shards
    if state_predates_layout(connection):
        if scope is not None:
            raise ValueError(
                "the catalog state predates its layout: refresh it in full (list_catalog_inputs without shards)"
            )
        full = True
    ensure_catalog_state(connection)
    if full and scope is not None:
        raise ValueError("a full refresh lists the whole root: list_catalog_inputs without shards")
    if full:
        for tables in CATALOG_STATE_TABLES:
            clear_state(connection, tables)
    root_uri = inputs.root_uri
    manifest_counts = sync_manifests(
        connection, root_uri, inputs.manifests, None if scope is None else ShardScope(scope, MANIFEST_GLOB)
    )
    rejects_counts = sync_rejects(
        connection,
        root_uri,
        inputs.rejects,
        SHARD_FROM_REJECTS_PATH,
        None if scope is None else ShardScope(scope, REJECTS_GLOB),
    )
    accounting_shards_read = sync_accounting(
        connection, root_uri, inputs.accounting, SHARD_FROM_REJECTS_PATH, shards=scope
    )
    quality_shards_read = sync_quality(connection, root_uri, inputs.quality, shards=scope)
    matches = sync_listed_shards(connection, inputs)
    record_state_layout(connection)
    if scope is not None:
        root = DataRoot(root_uri)
        with known_matches(matches):
            definitions = view_definitions(
                root,
                glob_root(root_uri),
                matches[MANIFEST_GLOB],
                matches[REJECTS_GLOB],
                matches[ALIGNMENTS_GLOB],
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


def write_catalog_info(connection: duckdb.DuckDBPyConnection, inputs: CatalogInputs) -> None:
    connection.execute(
        "CREATE OR REPLACE TABLE catalog_info AS SELECT current_timestamp AS refreshed_at, "
        "?::VARCHAR AS data_root, ?::BIGINT AS manifest_files, ?::BIGINT AS rejects_files",
        [inputs.root_uri, inputs.manifest_file_count, inputs.rejects_file_count],
    )
