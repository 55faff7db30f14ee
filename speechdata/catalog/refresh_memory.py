"""How much memory a catalog refresh's DuckDB may hold, and where it spills what does not fit.

A refresh's state connection runs the catalog's big statements (a first import reads every
manifest, ledger and quality file of the corpus through ``INSERT ... SELECT`` over parquet lists,
then groups, joins and sorts them per shard). Left alone, DuckDB sizes its buffer pool at 80 % of
the machine's memory and fills it: the first import at 10 000 h peaked at 4.45 GB. Bounded
(``memory_limit``), DuckDB spills what its operators cannot hold (hash aggregates, joins, sorts,
the rows an insert has not yet written) to ``temp_directory``: a folder of the refresh's own
beside the catalog (``._tmp-<12 hex>-catalog.duckdb.spill``; it also holds the stand-ins the views
are bound over, :mod:`~speechdata.catalog.view_binding`), removed after the refresh and,
after a refresh that was killed, by the next one. ``preserve_insertion_order = false`` lets the
inserts and scans stream without keeping rows in input order: every table of the state is keyed
(and every query that shows rows orders them), so no result depends on that order.

``SPEECHDATA_CATALOG_MEMORY_LIMIT`` (default ``1GB``; any size DuckDB reads, such as ``512MB`` or
``4GB``; ``none``: DuckDB's own default) and ``SPEECHDATA_CATALOG_THREADS`` (default: DuckDB's,
one per core) set both for the code location's ``catalog`` resource and the CLI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import duckdb

from speechdata.io.storage import TEMP_PREFIX

MEMORY_LIMIT_ENV = "SPEECHDATA_CATALOG_MEMORY_LIMIT"
THREADS_ENV = "SPEECHDATA_CATALOG_THREADS"
DEFAULT_MEMORY_LIMIT = "1GB"
"""Under the corpus-scale bound of 2 GB per step with the interpreter and its imports beside it
(docs/performance.md, "The catalog's first import within a memory limit")."""
UNLIMITED = "none"
SPILL_SUFFIX = ".spill"


@dataclass(frozen=True)
class RefreshMemory:
    """The refresh's DuckDB settings: ``memory_limit`` (None: DuckDB's default, 80 % of the
    machine) and ``threads`` (None: DuckDB's default)."""

    memory_limit: str | None = DEFAULT_MEMORY_LIMIT
    threads: int | None = None

    def config(self, spill_folder: str) -> dict[str, str | int | bool]:
        """``duckdb.connect(..., config=...)`` for a refresh connection spilling into ``spill_folder``."""
        config: dict[str, str | int | bool] = {"temp_directory": spill_folder, "preserve_insertion_order": False}
        if self.memory_limit is not None:
            config["memory_limit"] = self.memory_limit
        if self.threads is not None:
            config["threads"] = self.threads
        return config

    def check(self) -> None:
        """A ``ValueError`` naming the settings when DuckDB refuses them (a size it cannot read): said
        before the state is opened, where a refused connection would read as an unreadable state."""
        settings = {key: value for key, value in self.config("").items() if key != "temp_directory"}
        try:
            duckdb.connect(":memory:", config=settings).close()
        except duckdb.Error as error:
            raise ValueError(
                f"catalog refresh memory settings {settings} ({MEMORY_LIMIT_ENV}, {THREADS_ENV}) refused by DuckDB: "
                f"{str(error).strip().splitlines()[0]}"
            ) from error

    def out_of_memory(self, database_path: str, error: Exception) -> str:
        """Why a refresh of the catalog at ``database_path`` failed, and what to set."""
        detail = str(error).strip().splitlines()[0]
        return (
            f"the refresh of {database_path} needed more memory than its limit of {self.memory_limit or 'DuckDB default'} "
            f"({self.threads or 'one per core'} threads) even spilling to disk: {detail}; raise "
            f"{MEMORY_LIMIT_ENV} or lower {THREADS_ENV} (each thread holds its own working memory)"
        )


def refresh_memory_from_env(environ: Mapping[str, str] | None = None) -> RefreshMemory:
    """:class:`RefreshMemory` from ``SPEECHDATA_CATALOG_MEMORY_LIMIT`` and ``SPEECHDATA_CATALOG_THREADS``."""
    environ = os.environ if environ is None else environ
    limit = environ.get(MEMORY_LIMIT_ENV, "").strip() or DEFAULT_MEMORY_LIMIT
    threads = environ.get(THREADS_ENV, "").strip()
    if threads and (not threads.isdigit() or int(threads) < 1):
        raise ValueError(f"{THREADS_ENV}={threads!r}: expected a whole number of threads, at least 1")
    return RefreshMemory(None if limit.lower() == UNLIMITED else limit, int(threads) if threads else None)


def spill_folder_name(database_path: str) -> str:
    """A new spill folder's path beside the catalog at ``database_path`` (not created)."""
    folder, name = os.path.split(database_path)
    return os.path.join(folder, f"{TEMP_PREFIX}{uuid.uuid4().hex[:12]}-{name}{SPILL_SUFFIX}")


@contextlib.contextmanager
def spill_folder(database_path: str) -> Iterator[str]:
    """The refresh's own spill folder beside the catalog, removed with what DuckDB left in it."""
    path = spill_folder_name(database_path)
    os.mkdir(path)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def is_orphaned_spill(entry: str, database_name: str) -> bool:
    """Whether folder entry ``entry`` is a refresh's spill folder for the catalog ``database_name``."""
    return entry.startswith(TEMP_PREFIX) and entry.endswith(f"-{database_name}{SPILL_SUFFIX}")
