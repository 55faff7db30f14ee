"""What a catalog refresh lists: the shards it was told changed, a few known shards checked in turn,
or (first refresh of a state, a caller that cannot say what changed, ``full``) the whole root.

A refresh told which shards changed stats those shards' files by their literal paths, a cost that
does not grow with the corpus. A shard deleted or rewritten behind the platform's back (no run told
the catalog) is found by the consistency check that rides along: each scoped refresh also stats the
manifest of :data:`CHECKED_SHARDS_PER_REFRESH` shards the state knows, the next ones in shard order
after the last checked (wrapping round), one ``stat`` each, and a shard whose manifest is gone or not
the one the state recorded is looked at whole with the changed ones. Every known shard is checked
once in ``known / that many`` refreshes, at a fixed cost per refresh. (It replaced a full listing of
the root once in 100 refreshes, whose cost grew with the corpus.) A file other than the manifest
changed by hand with the manifest left as it was is found by ``speechdata catalog --refresh`` (a
full listing) or ``full``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

import duckdb

from speechdata.bridge.manifest import manifest_path
from speechdata.catalog.incremental import ensure_state_tables, list_shard_files, shard_of_path, shard_of_path_sql
from speechdata.io.storage import DataRoot

if TYPE_CHECKING:
    from speechdata.catalog.views import CatalogInputs

LISTED_SHARDS = "catalog_listed_shards"
"""Per per-shard glob the catalog lists, the shards with a file matching it: which globs match
anything (what the views are built from) without listing the corpus."""
LISTING = "catalog_listing"
"""How many scoped refreshes ran since the last full listing (no row: none ever listed the root)."""
CHECKED = "catalog_checked_shards"
"""The last shard the consistency check stat'ed (the next refresh checks the ones after it)."""
LISTING_STATE_TABLES = {
    LISTED_SHARDS: "relative_glob VARCHAR, shard VARCHAR",
    LISTING: "refreshes_since_full_listing BIGINT",
    CHECKED: "last_checked VARCHAR",
}
CHECKED_SHARDS_PER_REFRESH = 16
"""Known shards a scoped refresh stats besides the changed ones (the consistency check)."""
FULL_LISTING_EVERY: int | None = None
"""No periodic full listing by default (the consistency check finds what it found); a number N
lists the whole root once in N scoped refreshes."""


def listing_scope(
    connection: duckdb.DuckDBPyConnection,
    shards: Collection[str] | None,
    *,
    full: bool = False,
    full_listing_every: int | None = FULL_LISTING_EVERY,
    checked_per_refresh: int = CHECKED_SHARDS_PER_REFRESH,
    root_uri: str | None = None,
) -> frozenset[str] | None:
    """The shards a refresh may list alone (the changed ``shards`` and those of the next
    ``checked_per_refresh`` known ones whose manifest under ``root_uri`` is not the recorded one), or None when it must list the whole root: on ``full``, when the caller cannot say
    what changed (``shards`` None), when no refresh listed the root into this state yet, and once in
    ``full_listing_every`` refreshes when that is set. Inside the caller's transaction (the check's
    cursor moves on)."""
    if shards is None or full:
        return None
    ensure_state_tables(connection, LISTING_STATE_TABLES)
    rows = connection.execute(f"SELECT refreshes_since_full_listing FROM {LISTING}").fetchall()
    if len(rows) != 1 or (full_listing_every is not None and rows[0][0] + 1 >= full_listing_every):
        return None
    changed = frozenset(shards)
    if root_uri is None:
        return changed
    return changed | _inconsistent(
        connection, DataRoot(root_uri), _next_checked(connection, changed, checked_per_refresh)
    )


def _next_checked(connection: duckdb.DuckDBPyConnection, changed: frozenset[str], count: int) -> frozenset[str]:
    """The ``count`` known shards after the last checked (in shard order, wrapping), not among ``changed``."""
    if count <= 0:
        return frozenset()
    cursor = connection.execute(f"SELECT max(last_checked) FROM {CHECKED}").fetchone()[0]
    picked = [
        row[0]
        for row in connection.execute(
            f"SELECT shard FROM (SELECT DISTINCT shard FROM {LISTED_SHARDS}) "
            "WHERE shard NOT IN (SELECT unnest(?::VARCHAR[])) "
            "ORDER BY coalesce(shard <= ?, false), shard LIMIT ?",
            [sorted(changed), cursor, count],
        ).fetchall()
    ]
    if picked:
        connection.execute(f"DELETE FROM {CHECKED}")
        connection.execute(f"INSERT INTO {CHECKED} VALUES (?)", [picked[-1]])
    return frozenset(picked)


_MANIFEST_GLOB = manifest_path("*")


def _inconsistent(connection: duckdb.DuckDBPyConnection, root: DataRoot, shards: frozenset[str]) -> frozenset[str]:
    """Those of ``shards`` whose manifest (one stat each) is gone, new or not the one the state recorded."""
    if not shards:
        return frozenset()
    listed = {path: (f.size_bytes, f.fingerprint) for path, f in list_shard_files(root, _MANIFEST_GLOB, shards).items()}
    stored = {
        path: (size, fingerprint)
        for path, size, fingerprint in connection.execute(
            "SELECT path, size_bytes, fingerprint FROM catalog_manifest_files "
            f"WHERE {shard_of_path_sql(_MANIFEST_GLOB)} IN (SELECT unnest(?::VARCHAR[]))",
            [sorted(shards)],
        ).fetchall()
    }
    return frozenset(shard_of_path(_MANIFEST_GLOB, p) for p in {*listed, *stored} if listed.get(p) != stored.get(p))


def sync_listed_shards(connection: duckdb.DuckDBPyConnection, inputs: CatalogInputs) -> dict[str, bool]:
    """Record which shards have a file of each listed glob (those of the scope, or all), count the
    refresh against the next full listing; returns, per glob, whether any shard has a file of it."""
    listed = inputs.listed_by_glob()
    if inputs.shards is None:
        connection.execute(f"DELETE FROM {LISTED_SHARDS}")
        connection.execute(f"DELETE FROM {LISTING}")
        connection.execute(f"INSERT INTO {LISTING} VALUES (0)")
    else:
        connection.execute(
            f"DELETE FROM {LISTED_SHARDS} WHERE shard IN (SELECT unnest(?::VARCHAR[]))", [sorted(inputs.shards)]
        )
        connection.execute(f"UPDATE {LISTING} SET refreshes_since_full_listing = refreshes_since_full_listing + 1")
    rows = sorted({(glob, shard_of_path(glob, path)) for glob, files in listed.items() for path in files})
    if rows:
        connection.execute(
            f"INSERT INTO {LISTED_SHARDS} SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
            [[glob for glob, _ in rows], [shard for _, shard in rows]],
        )
    found = {row[0] for row in connection.execute(f"SELECT DISTINCT relative_glob FROM {LISTED_SHARDS}").fetchall()}
    return {glob: glob in found for glob in listed}
