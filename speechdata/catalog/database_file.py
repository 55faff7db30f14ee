"""The catalog's database files: the views readers open, and the state only the refresh opens.

A catalog is two DuckDB files beside each other:

* ``catalog.duckdb``: the views and ``catalog_info`` (a few kilobytes, whatever the corpus size),
  opened read-only by readers (``duckdb.connect(path, read_only=True)``, the CLI);
* ``.catalog.duckdb.state``: the per-file and per-shard state that lets a refresh read only what
  changed (:mod:`~speechdata.catalog.incremental`, :mod:`~speechdata.catalog.accounting_state`,
  :mod:`~speechdata.catalog.quality_state`), which grows with the corpus. No reader opens it. On
  an object-store root it is a local copy of the root's, which the refresh brings up to the root's
  log and puts back as what it changed (:mod:`~speechdata.catalog.state_store`).

A refresh updates the state in place inside one DuckDB transaction (committed whole or, killed,
rolled back from its write-ahead log when the file is next opened), and rebuilds the small views
file into a temp beside it (``._tmp-<12 hex>-catalog.duckdb``: a copy of the current one, or a new
one), which it checkpoints, closes and renames over ``catalog.duckdb`` (``os.replace``). Nothing
that grows with the corpus is copied. So:

* a reader holding the catalog open keeps reading the version it opened, whole, and never makes
  the refresh wait (the refresh takes no lock a reader holds, and never opens ``catalog.duckdb``
  for writing);
* a reader that opens the catalog during a refresh gets the previous version;
* a refresh that fails or is killed leaves the previous ``catalog.duckdb`` untouched (its temp is
  removed by the next refresh) and the state either as it was or a whole refresh ahead, which the
  next refresh publishes;
* refreshes wait for each other (a lock file beside the catalog), never for readers.

After a refresh ``catalog.duckdb`` holds the catalog's own objects and nothing else: a table,
view, macro, sequence, type or schema that is not the catalog's is never carried over (the file is
rebuilt without it), and a view whose definition is not the one the refresh created is created
again; the state file is cleared of anything not its own likewise. The catalog's files (both
databases and their ``.wal``) must be regular files: a symbolic link (which would make a refresh
read, or copy in, a database outside the data root) or anything else is refused with
:class:`CatalogFileRefused`, by the refresh and by readers alike.

The catalog is derived data: everything in it is recomputed from the files under the data root.
A file DuckDB cannot open or whose tables cannot be read (garbage, cut short, written by an
incompatible DuckDB) is therefore rebuilt from scratch, and the refresh says why
(:attr:`RefreshedCatalog.rebuilt_because`); nothing is lost.

Within one process DuckDB shares a database instance between connections to the same path: a
process sees the new version once it has closed its connections to the old one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from speechdata.catalog.accounting_state import REJECTS_BY_PRODUCT_FROM_STATE, SHARD_ACCOUNTING_FROM_STATE
from speechdata.catalog.database_checks import (  # re-exported: raised by refresh and readers
    CatalogFileRefused as CatalogFileRefused,
)
from speechdata.catalog.database_checks import (
    check_catalog_file,
    drop_foreign_objects,
    foreign_objects,
    open_checked,
    unreadable,
    views_digest,
)
from speechdata.catalog.incremental import HOURS_PER_LANGUAGE_FROM_STATE
from speechdata.catalog.listing_state import CHECKED_SHARDS_PER_REFRESH, FULL_LISTING_EVERY, listing_scope
from speechdata.catalog.quality_state import HOURS_LOST, HOURS_LOST_FROM_STATE, SIGNAL_HISTOGRAMS_FROM_STATE
from speechdata.catalog.refresh_lock import fsync_folder, refresh_lock, remove_orphaned_builds
from speechdata.catalog.refresh_memory import RefreshMemory, refresh_memory_from_env, spill_folder
from speechdata.catalog.root_paths import set_root_variable
from speechdata.catalog.state_layout import state_predates_layout
from speechdata.catalog.state_store import LEGACY_STATE_FILE, ObjectStoreState
from speechdata.catalog.view_binding import create_views_over_stand_ins
from speechdata.catalog.views import (
    CATALOG_STATE_TABLES,
    CatalogInputs,
    CatalogSummary,
    list_catalog_inputs,
    sync_catalog_inputs,
    write_catalog_info,
)
from speechdata.io.duckdb_object_store import enable_data_root_reads
from speechdata.io.storage import TEMP_PREFIX, DataRoot

STATE_SUFFIX = ".state"
_PUBLISHED_VIEWS = "catalog_published_views"
"""In the state: the views' definitions digest and the digest of the views as DuckDB stored them in
the ``catalog.duckdb`` the refresh published."""
_PUBLISHED_VIEWS_COLUMNS = "definitions_sha256 VARCHAR, views_sha256 VARCHAR"
_PUBLISHED_TABLES = {"catalog_info"}

ACCOUNTING_ROWS_SHOWN = 100
REFRESH_SUMMARY_QUERIES = {
    "by_language": HOURS_PER_LANGUAGE_FROM_STATE,
    "by_product": REJECTS_BY_PRODUCT_FROM_STATE,
    # The first rows the asset shows and the count per state: the whole table (a row per shard and
    # product line) would be brought into Python on every refresh.
    "accounting": f"{SHARD_ACCOUNTING_FROM_STATE} LIMIT {ACCOUNTING_ROWS_SHOWN}",
    "accounting_states": f"SELECT state, count(*)::BIGINT AS rows FROM ({SHARD_ACCOUNTING_FROM_STATE}) GROUP BY state",
    "signal_histograms": SIGNAL_HISTOGRAMS_FROM_STATE,
    HOURS_LOST: HOURS_LOST_FROM_STATE,
}
"""What ``manifest_catalog`` shows after a refresh, from the refresh's state alone (no file is read,
whatever the corpus size): pass as ``queries`` to :func:`refresh_catalog_file`."""


class CatalogRefreshOutOfMemory(MemoryError):
    """A refresh needed more than its memory limit even spilling: the message names the setting to raise."""


@dataclass(frozen=True)
class RefreshedCatalog:
    summary: CatalogSummary
    reads_through: str
    """How the refresh read the root: ``local``, ``httpfs`` or ``fsspec``."""
    rebuilt_because: str | None = None
    """Why a previous file could not be used and was rebuilt from scratch; ``None`` when the previous
    files (or none) were the starting point."""
    tables: dict[str, pa.Table] = field(default_factory=dict)
    """The results of the ``queries`` asked of the refreshed state before the new catalog was swapped in."""
    dropped: list[str] = field(default_factory=list)
    """Objects found in the catalog's files that are not the catalog's own (``kind name``), left out."""


def state_path_of(database_path: str) -> str:
    """The state database beside the catalog at ``database_path``."""
    folder, name = os.path.split(database_path)
    return os.path.join(folder, f".{name}{STATE_SUFFIX}")


def catalog_files(database_path: str) -> list[str]:
    """Every file a refresh opens or replaces by name: both databases and their write-ahead logs."""
    state = state_path_of(database_path)
    return [database_path, database_path + ".wal", state, state + ".wal"]


def refresh_catalog_file(
    database_path: str,
    root: DataRoot,
    *,
    full: bool = False,
    queries: Mapping[str, str] | None = None,
    shards: Collection[str] | None = None,
    full_listing_every: int | None = FULL_LISTING_EVERY,
    checked_per_refresh: int = CHECKED_SHARDS_PER_REFRESH,
    memory: RefreshMemory | None = None,
) -> RefreshedCatalog:
    """Refresh the catalog at ``database_path`` (a local file) over ``root``: the state beside it in
    place, in one transaction, and the views into a new file swapped in atomically. ``queries``
    (name -> SQL) run on the refreshed state (its tables: :data:`~speechdata.catalog.views.CATALOG_STATE_TABLES`)
    before the swap. On an object-store root the state is a local copy brought up to the root's
    (:meth:`~speechdata.catalog.state_store.ObjectStoreState.fetch`) and put back after the refresh
    as what changed: a delta of the shards listed, or a snapshot (:mod:`~speechdata.catalog.state_store`).

    ``shards``: the shards materialized, re-landed or deleted since the last refresh; only their
    files are stat'ed (by literal path) with ``checked_per_refresh`` known shards in turn (the
    consistency check), and the root is listed whole only on ``full``, on the first refresh of a state
    and, when set, once in ``full_listing_every`` (:func:`~speechdata.catalog.listing_state.listing_scope`).
    None: the caller cannot say what changed, and the root is listed.

    ``memory``: how much the state connection's DuckDB may hold before it spills into a folder of
    the refresh's own beside the catalog (:mod:`~speechdata.catalog.refresh_memory`; default: from
    the environment, 1 GB)."""
    memory = refresh_memory_from_env() if memory is None else memory
    memory.check()
    database_path = os.path.abspath(database_path)
    folder = os.path.dirname(database_path)
    os.makedirs(folder, exist_ok=True)
    state_path = state_path_of(database_path)
    with refresh_lock(database_path):
        for path in catalog_files(database_path):
            check_catalog_file(path)
        remove_orphaned_builds(database_path)
        build = os.path.join(folder, f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{os.path.basename(database_path)}")
        problems, dropped = [], []
        try:
            # A state that may be behind the root's (another worker refreshed since) cannot be
            # brought up to date by the changed shards alone: the root is listed whole then.
            store = None if root.is_local else ObjectStoreState(root, state_path, state_table_columns())
            current = store is None or store.fetch()
            listing = _Listing(root.uri(""), shards if current else None, full_listing_every, checked_per_refresh)
            if store is not None:
                store.begin(listing.shards)
            try:
                refreshed = _refresh_state(
                    state_path, database_path, build, root, listing, full, queries, dropped, memory
                )
            except duckdb.OutOfMemoryException as error:
                raise CatalogRefreshOutOfMemory(memory.out_of_memory(database_path, error)) from error
            except duckdb.Error:
                problem = _state_problem(state_path)
                if problem is None:
                    raise  # the state reads whole: the failure is the files' (a corrupt manifest), said as it is
                _remove(state_path)
                _remove(build)
                problems.append(problem)
                refreshed = _refresh_state(
                    state_path, database_path, build, root, listing, True, queries, dropped, memory
                )
            summary, tables, reads_through, more_problems, scope = refreshed
            problems += more_problems
            if store is not None:
                store.publish(scope)
            # A WAL left beside the old file by a writer of an older kind must not be replayed onto the new one.
            with contextlib.suppress(FileNotFoundError):
                os.remove(database_path + ".wal")
            os.replace(build, database_path)
            fsync_folder(folder)
        finally:
            for leftover in (build, build + ".wal"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
    return RefreshedCatalog(summary, reads_through, "; ".join(problems) or None, tables, dropped)


@dataclass(frozen=True)
class _Listing:
    """What a refresh lists: the root, and the shards the caller says changed (None: unknown)."""

    root_uri: str
    shards: Collection[str] | None
    full_listing_every: int | None
    checked_per_refresh: int

    def inputs(self, state: duckdb.DuckDBPyConnection, full: bool) -> CatalogInputs:
        """The files listed: those of the changed shards, or (:func:`listing_scope` None) the whole root's."""
        scope = listing_scope(
            state,
            self.shards,
            full=full,
            full_listing_every=self.full_listing_every,
            checked_per_refresh=self.checked_per_refresh,
            root_uri=self.root_uri,
        )
        return list_catalog_inputs(self.root_uri, scope)


def _refresh_state(
    state_path: str,
    database_path: str,
    build: str,
    root: DataRoot,
    listing: _Listing,
    full: bool,
    queries: Mapping[str, str] | None,
    dropped: list[str],
    memory: RefreshMemory,
) -> tuple[CatalogSummary, dict[str, pa.Table], str, list[str], frozenset[str] | None]:
    """Bring the state up to the root's files in one transaction (listed whole or for the changed
    shards), then write the views file into ``build``; returns the summary, the ``queries``' tables,
    how the root was read, what was unusable and the shards listed (None: the whole root)."""
    with spill_folder(database_path) as spill:
        # One folder per DuckDB instance: the state's and the views file's each name their own temp files.
        state_config, views_config = (
            memory.config(os.path.join(spill, "state")),
            memory.config(os.path.join(spill, "views")),
        )
        state, state_problem = _open_state(state_path, state_config)
        problems = [state_problem] if state_problem else []
        try:
            reads_through = enable_data_root_reads(state, root)
            state.begin()
            try:
                dropped += [f"state {d}" for d in drop_foreign_objects(state, set(state_table_columns()), set())]
                ensure_catalog_published_record(state)
                full = full or state_problem is not None or state_predates_layout(state)
                # The views' definitions of a scoped listing come from the synced state: sync first.
                summary, inputs = sync_catalog_inputs(state, listing.inputs(state, full), full=full)
                scope = inputs.shards
                recorded = state.execute(f"SELECT definitions_sha256, views_sha256 FROM {_PUBLISHED_VIEWS}").fetchall()
                published_problem, published = _build_published(
                    database_path,
                    build,
                    root,
                    inputs,
                    recorded[0] if len(recorded) == 1 else None,
                    full,
                    dropped,
                    views_config,
                    os.path.join(spill, "binding"),
                )
                problems += [published_problem] if published_problem else []
                state.execute(f"DELETE FROM {_PUBLISHED_VIEWS}")
                state.execute(f"INSERT INTO {_PUBLISHED_VIEWS} VALUES (?, ?)", list(published))
                state.commit()
            except BaseException:
                state.rollback()
                raise
            tables = {name: _arrow(state.sql(sql)) for name, sql in (queries or {}).items()}
        finally:
            state.close()
    return summary, tables, reads_through, problems, scope


STATE_FILE = LEGACY_STATE_FILE
"""Where an object-store root kept the whole state before it was kept as a snapshot and deltas
(:data:`~speechdata.catalog.state_store.STATE_FOLDER`); read once as a starting point."""


def state_table_columns() -> dict[str, str]:
    """Every table of the state (name -> column definitions)."""
    columns = {name: definition for tables in CATALOG_STATE_TABLES for name, definition in tables.items()}
    return {**columns, _PUBLISHED_VIEWS: _PUBLISHED_VIEWS_COLUMNS}


def ensure_catalog_published_record(connection: duckdb.DuckDBPyConnection) -> None:
    connection.execute(f"CREATE TABLE IF NOT EXISTS {_PUBLISHED_VIEWS} ({_PUBLISHED_VIEWS_COLUMNS})")


def _open_state(state_path: str, config: dict) -> tuple[duckdb.DuckDBPyConnection, str | None]:
    """A connection to the state, in place, with the refresh's memory ``config``; when DuckDB cannot
    open it, to a new empty one and why.

    Its tables are not read whole here (the state grows with the corpus): DuckDB checks each block's
    checksum as it reads it, and a refresh that fails is followed by :func:`_state_problem`."""
    if not os.path.exists(state_path):
        return duckdb.connect(state_path, config=config), None
    try:
        return duckdb.connect(state_path, config=config), None
    except duckdb.Error as error:
        problem = unreadable(state_path, state_path, error)
    _remove(state_path)
    return duckdb.connect(state_path, config=config), problem


def _state_problem(state_path: str) -> str | None:
    """Why the state (closed) is unusable, after a refresh over it failed; None when it reads whole
    (the failure came from elsewhere: a data file, the root)."""
    connection, problem = open_checked(state_path, state_path)
    if connection is not None:
        connection.close()
    return problem


def _remove(path: str) -> None:
    for leftover in (path, path + ".wal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(leftover)


def _build_published(
    database_path: str,
    build: str,
    root: DataRoot,
    inputs: CatalogInputs,
    recorded: tuple[str, str] | None,
    full: bool,
    dropped: list[str],
    config: dict,
    binding_folder: str,
) -> tuple[str | None, tuple[str, str]]:
    """Write the views file into ``build``: a copy of the current one when it holds nothing but the
    catalog's objects, else a new one; its views created again unless they are, as DuckDB stored
    them, those the last refresh published. Returns why the current file was unusable (or None) and
    the (definitions, views) digests to record. ``config``: the refresh's memory settings;
    ``binding_folder``: where the views are bound over one empty stand-in file per glob instead of
    every file of the corpus (:mod:`~speechdata.catalog.view_binding`), inside the refresh's spill
    folder."""
    problem, connection = None, None
    if os.path.exists(database_path):
        # Small (views and catalog_info): the state that grows with the corpus is in a file of its own.
        # The WAL is not copied: the catalog is checkpointed before it is published, so one beside it is not ours.
        shutil.copyfile(database_path, build)
        connection, problem = open_checked(build, database_path, config)
        if connection is not None:
            foreign = foreign_objects(connection, _PUBLISHED_TABLES, inputs.view_names)
            if foreign:
                # Rebuilt rather than cleaned: whatever was planted leaves no bytes behind either.
                dropped += [f"{os.path.basename(database_path)} {f}" for f in foreign]
                connection.close()
                connection = None
        if connection is None:
            _remove(build)
    fresh = connection is None
    if fresh:
        connection = duckdb.connect(build, config=config)
    try:
        enable_data_root_reads(connection, root)
        set_root_variable(connection, inputs.root_uri)
        connection.begin()
        if fresh or full or recorded != (inputs.definitions_sha256, views_digest(connection)):
            create_views_over_stand_ins(
                connection, inputs.definitions, root, inputs.root_uri, inputs.listed_by_glob(), binding_folder
            )
        write_catalog_info(connection, inputs)
        connection.commit()
        published = (inputs.definitions_sha256, views_digest(connection))
        connection.execute("CHECKPOINT")
    finally:
        connection.close()
    return problem, published


def _arrow(relation) -> pa.Table:
    return relation.to_arrow_table() if hasattr(relation, "to_arrow_table") else relation.fetch_arrow_table()
