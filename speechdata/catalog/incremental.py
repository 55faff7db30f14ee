"""Per-file state that lets a catalog refresh read only the manifests and rejects ledgers that changed.

A refresh used to re-read every manifest to summarize the catalog (9 ms each: 3 minutes at 20 000
shards, after every shard). The catalog now keeps, per file and keyed by its path relative to the
data root, what a refresh needs from it:

* ``catalog_manifest_files`` (``path``, ``size_bytes``, ``fingerprint``, ``samples``) and
  ``catalog_manifest_groups``: the manifest's samples, seconds of audio and alignment-score sum and
  count per (``shard``, ``language``, ``country``);
* ``catalog_rejects_files`` (``path``, ``size_bytes``, ``fingerprint``, ``rejects``) and
  ``catalog_rejected_ids``: the ledger's distinct rejected ``(shard, utt_id)``;
* ``catalog_rejected_shards`` (``shard``, ``rejected_utterances``): per shard, its distinct rejected
  utterances over all its ledgers, recounted for the shards whose ledgers a refresh read or forgot,
  so that the total is a sum over one row per shard, not a DISTINCT over every rejected utterance
  of the corpus at each refresh.

A refresh lists the files (sizes and fingerprints come with the listing), reads only those that are
new or whose size or fingerprint changed, and drops the rows of files that are gone (a re-landed or
deleted shard). The totals a refresh reports (:class:`~speechdata.catalog.views.CatalogSummary`) and
the per-language hours the asset shows are sums over these small tables. A full refresh empties
them first and reads everything, so the two paths share one code path and give the same tables.
The views stay views over the live files: nothing here changes what a query of them returns.
"""

from __future__ import annotations

import contextlib
import contextvars
import fnmatch
import glob
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import duckdb

from speechdata.catalog.root_paths import glob_root
from speechdata.io import layout
from speechdata.io.duckdb_object_store import duckdb_location
from speechdata.io.storage import DataRoot, escape_glob

STATE_TABLES = {
    "catalog_manifest_files": "path VARCHAR, size_bytes BIGINT, fingerprint VARCHAR, samples BIGINT",
    "catalog_manifest_groups": (
        "path VARCHAR, shard VARCHAR, language VARCHAR, country VARCHAR, samples BIGINT, "
        "duration_s DOUBLE, alignment_score_sum DOUBLE, alignment_scores BIGINT"
    ),
    "catalog_rejects_files": "path VARCHAR, size_bytes BIGINT, fingerprint VARCHAR, rejects BIGINT",
    "catalog_rejected_ids": "path VARCHAR, shard VARCHAR, utt_id VARCHAR",
    "catalog_rejected_shards": "shard VARCHAR, rejected_utterances BIGINT",
}
"""Per-file state, each table keyed (or grouped) by the file's path relative to the data root."""
_CHILD_TABLE = {"catalog_manifest_files": "catalog_manifest_groups", "catalog_rejects_files": "catalog_rejected_ids"}


@dataclass(frozen=True)
class ListedFile:
    path: str
    """Relative to the data root."""
    size_bytes: int
    fingerprint: str
    """Changes when the file is rewritten: an object store's ETag, else the inode and mtime (an
    atomic rewrite is a rename, so a new inode even within the mtime's resolution)."""


@dataclass(frozen=True)
class SyncCounts:
    read: int
    reused: int
    dropped: int


def list_files(root: DataRoot, relative_glob: str) -> dict[str, ListedFile]:
    """Every file matching ``relative_glob`` under the root, by relative path, with size and fingerprint."""
    if root.is_local:
        return {p: _stat(root, p) for p in _local_glob(root, relative_glob)}
    found = root.fs.glob(f"{escape_glob(root.root)}/{relative_glob}", detail=True)
    prefix = root.root.rstrip("/") + "/"
    listed = {}
    for full_path, info in found.items():
        if not full_path.startswith(prefix):
            raise ValueError(f"listing {relative_glob} returned {full_path}, outside the data root {root.root}")
        relative = full_path[len(prefix) :]
        listed[relative] = ListedFile(relative, int(info.get("size") or 0), _fingerprint(info))
    return listed


def shard_segment(relative_glob: str) -> tuple[int, str]:
    """(index of the path segment naming the shard, the text before the shard's name in it) of a
    per-shard glob: its first wildcard segment, ``*`` or ``<prefix>*`` (``shards/*/...``,
    ``manifests/shard=*/...``); a glob of another form cannot be narrowed to one shard."""
    for index, part in enumerate(relative_glob.split("/")):
        if glob.has_magic(part):
            prefix = part[:-1]
            if not part.endswith("*") or glob.has_magic(prefix):
                raise ValueError(f"{relative_glob}: its first wildcard segment {part!r} is not '*' or '<prefix>*'")
            return index, prefix
    raise ValueError(f"{relative_glob} has no wildcard segment naming the shard")


def shard_glob(relative_glob: str, shard: str) -> str:
    """``relative_glob`` narrowed to one shard: its shard segment (:func:`shard_segment`) names it literally."""
    if not layout.is_valid_shard_id(shard):
        raise ValueError(
            f"catalog refresh: {shard!r} is not a shard id (a changed shard names a folder under the root)"
        )
    index, prefix = shard_segment(relative_glob)
    parts = relative_glob.split("/")
    parts[index] = prefix + shard
    return "/".join(parts)


def list_shard_files(root: DataRoot, relative_glob: str, shards: Iterable[str]) -> dict[str, ListedFile]:
    """:func:`list_files` of ``relative_glob`` for these shards only: a literal path is one stat (one
    HEAD on an object store), a pattern inside the shard's folder lists that folder alone."""
    listed: dict[str, ListedFile] = {}
    for shard in sorted(set(shards)):
        listed.update(list_files(root, shard_glob(relative_glob, shard)))
    return listed


def shard_of_path(relative_glob: str, path: str) -> str:
    """The shard a relative ``path`` matched by ``relative_glob`` belongs to (as :func:`shard_of_path_sql`)."""
    index, prefix = shard_segment(relative_glob)
    return path.split("/")[index][len(prefix) :]


def shard_of_path_sql(relative_glob: str, column: str = "path") -> str:
    """SQL for the shard a stored relative ``column`` (matched by ``relative_glob``) belongs to."""
    index, prefix = shard_segment(relative_glob)
    return f"substr(split_part({column}, '/', {index + 1}), {len(prefix) + 1})"


@dataclass(frozen=True)
class ShardScope:
    """The shards a scoped refresh looked at, and how to tell a stored file of the glob ``relative_glob``
    belongs to one of them: only those files' rows are compared with the (scoped) listing."""

    shards: frozenset[str]
    relative_glob: str

    def where(self) -> tuple[str, list]:
        return f" WHERE {shard_of_path_sql(self.relative_glob)} IN (SELECT unnest(?::VARCHAR[]))", [sorted(self.shards)]


_KNOWN_MATCHES: contextvars.ContextVar[Mapping[str, bool] | None] = contextvars.ContextVar(
    "catalog_known_matches", default=None
)


@contextlib.contextmanager
def known_matches(matches: Mapping[str, bool]) -> Iterator[None]:
    """Within the block, :func:`has_files` of a glob in ``matches`` answers from it, without listing:
    a scoped refresh knows from its state which per-shard globs match a file of any shard."""
    token = _KNOWN_MATCHES.set(matches)
    try:
        yield
    finally:
        _KNOWN_MATCHES.reset(token)


def has_files(root: DataRoot, relative_glob: str) -> bool:
    """Whether anything under the root matches ``relative_glob``."""
    known = _KNOWN_MATCHES.get()
    if known is not None and relative_glob in known:
        return known[relative_glob]
    if root.is_local:
        return next(_local_glob_iter(root, relative_glob), None) is not None
    return bool(root.fs.glob(f"{escape_glob(root.root)}/{relative_glob}"))


_FOLDERS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("catalog_listed_folders", default=None)


@contextlib.contextmanager
def one_listing_per_folder() -> Iterator[None]:
    """Within the block, a local root's folders are each listed once, whatever the globs asked:
    a refresh's dozen globs over ``shards/*/...`` read each shard folder once instead of trying each
    name in each folder per glob (three system calls per glob and shard). What the block sees is
    the folders as they were when first listed in it."""
    token = _FOLDERS.set({})
    try:
        yield
    finally:
        _FOLDERS.reset(token)


def _folder_entries(folders: dict, base: str, relative: str) -> dict[str, tuple[bool, bool]]:
    """name -> (is a folder, is a file) of the folder at ``relative`` (links followed, as glob does)."""
    if relative not in folders:
        entries = {}
        with (
            contextlib.suppress(FileNotFoundError, NotADirectoryError, PermissionError),
            os.scandir(f"{base}/{relative}" if relative else base) as listing,
        ):
            for entry in listing:
                try:
                    entries[entry.name] = (entry.is_dir(), entry.is_file())
                except OSError:
                    continue
        folders[relative] = entries
    return folders[relative]


def _cached_glob(folders: dict, base: str, relative_glob: str) -> list[str]:
    """``glob.glob``'s matches of ``relative_glob`` under ``base`` that are files, relative, from the
    listed folders (a wildcard never matches a name starting with a dot, as in glob)."""
    parts = relative_glob.split("/")
    prefixes = [""]
    for position, part in enumerate(parts):
        last = position == len(parts) - 1
        found = []
        for prefix in prefixes:
            entries = _folder_entries(folders, base, prefix)
            if glob.has_magic(part):
                names = [n for n in entries if fnmatch.fnmatchcase(n, part) and not n.startswith(".")]
            else:
                names = [part] if part in entries else []
            for name in names:
                is_dir, is_file = entries[name]
                if is_file if last else is_dir:
                    found.append(f"{prefix}/{name}" if prefix else name)
        prefixes = found
    return sorted(prefixes)


def _local_glob_iter(root: DataRoot, relative_glob: str):
    # fsspec's glob of ``shards/*/x.parquet`` lists and stats every file of every shard folder;
    # the standard library's lists ``shards`` and tries the one literal name in each.
    base = root.root.rstrip("/")
    folders = _FOLDERS.get()
    if folders is not None:
        yield from _cached_glob(folders, base, relative_glob)
        return
    for path in glob.iglob(f"{glob.escape(base)}/{relative_glob}"):
        if os.path.isfile(path):
            yield path[len(base) + 1 :]


def _local_glob(root: DataRoot, relative_glob: str) -> list[str]:
    return sorted(_local_glob_iter(root, relative_glob))


def _stat(root: DataRoot, relative: str) -> ListedFile:
    stat = os.stat(root.path(relative))
    return ListedFile(relative, stat.st_size, f"ino:{stat.st_ino}:mtime_ns:{stat.st_mtime_ns}")


def _fingerprint(info: dict) -> str:
    for key in ("ETag", "etag", "md5", "generation"):
        if info.get(key):
            return f"{key}:{info[key]}"
    return f"ino:{info.get('ino')}:mtime:{info.get('mtime') or info.get('LastModified') or info.get('updated')}"


def ensure_state_tables(connection: duckdb.DuckDBPyConnection, tables: dict[str, str] = STATE_TABLES) -> None:
    """Create the state ``tables`` (name -> column definitions) that do not exist yet."""
    for table, columns in tables.items():
        connection.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")


def clear_state(connection: duckdb.DuckDBPyConnection, tables: dict[str, str] = STATE_TABLES) -> None:
    for table in tables:
        connection.execute(f"DELETE FROM {table}")


def _changed(
    connection: duckdb.DuckDBPyConnection, table: str, listed: dict[str, ListedFile], scope: ShardScope | None = None
) -> tuple[list[str], list[str], int]:
    """(paths to read: new or changed, paths to forget: changed or gone, how many are gone); with a
    ``scope``, only the stored files of its shards are compared (the listing covers those alone)."""
    where, parameters = scope.where() if scope is not None else ("", [])
    stored = {
        path: (size, fingerprint)
        for path, size, fingerprint in connection.execute(
            f"SELECT path, size_bytes, fingerprint FROM {table}{where}", parameters
        ).fetchall()
    }
    to_read = sorted(p for p, f in listed.items() if stored.get(p) != (f.size_bytes, f.fingerprint))
    gone = [p for p in stored if p not in listed]
    return to_read, sorted({*gone, *(p for p in to_read if p in stored)}), len(gone)


def _forget(connection: duckdb.DuckDBPyConnection, table: str, paths: list[str]) -> None:
    if paths:
        for name in (table, _CHILD_TABLE[table]):
            connection.execute(f"DELETE FROM {name} WHERE path IN (SELECT unnest(?::VARCHAR[]))", [paths])


FILES_PER_READ = 256
"""Files one ``read_parquet`` of a refresh reads at most. DuckDB opens every file of the list (its
metadata, for ``union_by_name``) before it reads a row, in memory its ``memory_limit`` does not
bound: read in batches, that memory is a batch's, not the corpus's (docs/performance.md, "The
catalog's first import within a memory limit")."""


def in_batches(items: list[str], size: int | None = None) -> Iterator[list[str]]:
    """``items`` in lists of at most ``size`` (default :data:`FILES_PER_READ`), in order."""
    size = size or FILES_PER_READ
    for start in range(0, len(items), size):
        yield items[start : start + size]


SHARDS_PER_RECOUNT = 256
"""Shards whose accounting or quality a refresh recounts in one go (a first import: every shard, in
turns). Their counts group and join per shard, so a turn's are its shards' alone; DuckDB's hash
tables for them do not all spill, and under a memory limit a recount of the whole corpus at once
fails where turns of this many shards succeed (docs/performance.md, "The catalog's first import
within a memory limit")."""


def into_temp_table(index: int, table: str) -> str:
    """The statement head that fills temp ``table`` from the ``index``-th batch of files: the first
    creates it (the columns the read gives), the others insert into it."""
    return f"CREATE OR REPLACE TEMP TABLE {table} AS " if index == 0 else f"INSERT INTO {table} "


def locations_of(root_uri: str, paths: list[str]) -> list[str]:
    """DuckDB's names of ``paths`` relative to the root, glob-escaped (DuckDB expands each list item)."""
    base = glob_root(root_uri)
    return [f"{base}/{escape_glob(p)}" for p in paths]


def _locations(root_uri: str, paths: list[str]) -> tuple[list[str], int]:
    """:func:`locations_of` and the length of the root prefix DuckDB's ``filename`` column carries,
    to get the relative path back."""
    return locations_of(root_uri, paths), len(duckdb_location(root_uri)) + 1


def _record_files(
    connection: duckdb.DuckDBPyConnection,
    table: str,
    listed: dict[str, ListedFile],
    paths: list[str],
    read_rows: str,
    counts_sql: str,
) -> None:
    """Record the files at ``paths`` (read into the temp table ``read_rows``, one ``path`` per row)
    in ``table``, with their counts from ``counts_sql`` (over ``read_rows``). Only the rows read
    now are checked and looked at: the state already recorded is not scanned."""
    unmatched = connection.execute(
        f"SELECT count(*) FROM {read_rows} WHERE path NOT IN (SELECT unnest(?::VARCHAR[]))", [paths]
    ).fetchone()[0]
    if unmatched:  # the filename DuckDB reported did not map back onto a listed path
        raise RuntimeError(f"catalog refresh: {unmatched} rows of {_CHILD_TABLE[table]} name no listed file")
    # Lists as parameters, not a registered Arrow table: registering one imports pandas.
    connection.execute(
        f"INSERT INTO {table} SELECT l.path, l.size_bytes, l.fingerprint, coalesce(c.n, 0) "
        "FROM (SELECT unnest(?::VARCHAR[]) AS path, unnest(?::BIGINT[]) AS size_bytes, "
        "unnest(?::VARCHAR[]) AS fingerprint) AS l "
        f"LEFT JOIN ({counts_sql}) AS c ON c.path = l.path",
        [paths, [listed[p].size_bytes for p in paths], [listed[p].fingerprint for p in paths]],
    )


def sync_manifests(
    connection: duckdb.DuckDBPyConnection,
    root_uri: str,
    listed: dict[str, ListedFile],
    scope: ShardScope | None = None,
) -> SyncCounts:
    """Bring the manifest state up to ``listed``: read new and changed manifests, forget the others'
    rows (with a ``scope``: only of its shards; ``reused`` then counts every other stored manifest)."""
    to_read, to_forget, gone = _changed(connection, "catalog_manifest_files", listed, scope)
    _forget(connection, "catalog_manifest_files", to_forget)
    if to_read:
        locations, prefix_chars = _locations(root_uri, to_read)
        # Grouped by path among others: a batch's groups are its own files'.
        for index, batch in enumerate(in_batches(locations)):
            connection.execute(
                into_temp_table(index, "_catalog_read_groups")
                + "SELECT substr(filename, ?) AS path, shard, language, country, count(*) AS samples, "
                "sum(duration_s) AS duration_s, sum(alignment_score) AS alignment_score_sum, "
                "count(alignment_score) AS alignment_scores "
                "FROM read_parquet(?, union_by_name = true, hive_partitioning = false, filename = true) "
                "GROUP BY ALL",
                [prefix_chars + 1, batch],
            )
        try:
            _record_files(
                connection,
                "catalog_manifest_files",
                listed,
                to_read,
                "_catalog_read_groups",
                "SELECT path, sum(samples) AS n FROM _catalog_read_groups GROUP BY path",
            )
            connection.execute("INSERT INTO catalog_manifest_groups SELECT * FROM _catalog_read_groups")
        finally:
            connection.execute("DROP TABLE IF EXISTS _catalog_read_groups")
    return SyncCounts(len(to_read), stored_files(connection, "catalog_manifest_files") - len(to_read), gone)


def stored_files(connection: duckdb.DuckDBPyConnection, table: str) -> int:
    """How many files the state holds in ``table`` (after a sync: as many as a full listing finds)."""
    return int(connection.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def sync_rejects(
    connection: duckdb.DuckDBPyConnection,
    root_uri: str,
    listed: dict[str, ListedFile],
    shard_from_path: str,
    scope: ShardScope | None = None,
) -> SyncCounts:
    """Bring the rejects-ledger state up to ``listed`` (``shard_from_path``: the regex the view uses;
    ``scope``: as :func:`sync_manifests`)."""
    to_read, to_forget, gone = _changed(connection, "catalog_rejects_files", listed, scope)
    recount = _shards_of_rejects(connection, to_forget)
    _forget(connection, "catalog_rejects_files", to_forget)
    if to_read:
        locations, prefix_chars = _locations(root_uri, to_read)
        for index, batch in enumerate(in_batches(locations)):
            connection.execute(
                into_temp_table(index, "_catalog_read_rejects")
                + "SELECT substr(filename, ?) AS path, regexp_extract(filename, ?, 1) AS shard, utt_id "
                "FROM read_parquet(?, union_by_name = true, hive_partitioning = false, filename = true)",
                [prefix_chars + 1, shard_from_path, batch],
            )
        try:
            connection.execute(
                "INSERT INTO catalog_rejected_ids SELECT DISTINCT path, shard, utt_id "
                "FROM _catalog_read_rejects WHERE utt_id IS NOT NULL"
            )
            _record_files(
                connection,
                "catalog_rejects_files",
                listed,
                to_read,
                "_catalog_read_rejects",
                "SELECT path, count(*) AS n FROM _catalog_read_rejects GROUP BY path",
            )
        finally:
            connection.execute("DROP TABLE IF EXISTS _catalog_read_rejects")
    _count_rejected_shards(connection, recount | _shards_of_rejects(connection, to_read))
    return SyncCounts(len(to_read), stored_files(connection, "catalog_rejects_files") - len(to_read), gone)


def _shards_of_rejects(connection: duckdb.DuckDBPyConnection, paths: list[str]) -> set[str]:
    """The shards the stored rejected utterances of these ledgers belong to."""
    if not paths:
        return set()
    rows = connection.execute(
        "SELECT DISTINCT shard FROM catalog_rejected_ids WHERE path IN (SELECT unnest(?::VARCHAR[]))", [paths]
    ).fetchall()
    return {row[0] for row in rows}


def _count_rejected_shards(connection: duckdb.DuckDBPyConnection, shards: set[str]) -> None:
    """``catalog_rejected_shards`` of these shards recounted from their stored rejected utterances."""
    if not shards:
        return
    chosen = sorted(shards)
    connection.execute("DELETE FROM catalog_rejected_shards WHERE shard IN (SELECT unnest(?::VARCHAR[]))", [chosen])
    connection.execute(
        "INSERT INTO catalog_rejected_shards SELECT shard, count(DISTINCT utt_id) FROM catalog_rejected_ids "
        "WHERE shard IN (SELECT unnest(?::VARCHAR[])) GROUP BY shard",
        [chosen],
    )


def summary_totals(connection: duckdb.DuckDBPyConnection) -> dict:
    """The refresh's totals from the state alone (no file is read)."""
    shards, samples, duration_s = connection.execute(
        "SELECT count(DISTINCT shard), coalesce(sum(samples), 0), coalesce(sum(duration_s), 0.0) "
        "FROM catalog_manifest_groups WHERE samples > 0"
    ).fetchone()
    rejects = connection.execute("SELECT coalesce(sum(rejects), 0) FROM catalog_rejects_files").fetchone()[0]
    # Distinct (shard, utt_id) pairs: each shard's distinct utterances, summed.
    rejected = connection.execute(
        "SELECT coalesce(sum(rejected_utterances), 0) FROM catalog_rejected_shards"
    ).fetchone()[0]

    def distinct(column: str) -> list[str]:
        sql = f"SELECT DISTINCT {column} FROM catalog_manifest_groups WHERE {column} IS NOT NULL ORDER BY {column}"
        return [row[0] for row in connection.execute(sql).fetchall()]

    return {
        "shards": int(shards),
        "samples": int(samples),
        "hours": float(duration_s) / 3600.0,
        "rejects": int(rejects),
        "rejected_utterances": int(rejected),
        "languages": distinct("language"),
        "countries": distinct("country"),
    }


HOURS_PER_LANGUAGE_FROM_STATE = """
    SELECT language, sum(samples)::BIGINT AS samples, sum(duration_s) / 3600.0 AS hours,
           sum(alignment_score_sum) / nullif(sum(alignment_scores), 0) AS mean_alignment_score
    FROM catalog_manifest_groups GROUP BY language ORDER BY hours DESC, language"""
"""The named query ``hours_per_language`` from the state: the same rows without reading a manifest
(the mean is the sum over the count, as ``avg``; it may differ from ``avg`` in the last bits)."""
