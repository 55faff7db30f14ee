"""Per-shard accounting kept in the catalog, so that a refresh recounts only the shards that changed.

The ``product_accounting`` and ``product_rejects`` views read every shard's landing metadata,
product indexes, manifest and rejects ledgers at each query, a cost that grows with the shard count,
and ``manifest_catalog`` showed both after every shard (docs/performance.md has the figures). The
catalog now also keeps their rows per shard:

* ``catalog_accounting_shards`` (``shard``, ``inputs_sha256``): the digest of the path, size and
  fingerprint of every file the shard's accounting reads;
* ``catalog_product_accounting``: the ``product_accounting`` rows of the shard;
* ``catalog_product_rejects`` (``shard``, ``product``, ``reason``, ``utterances``): the shard's
  ``product_rejects`` rows, counted.

A refresh groups the listed files by the shard their path names, recounts the shards whose digest
changed (new, rebuilt, re-landed, a ledger added or removed) from exactly their files, through the
views' own SQL (:func:`~speechdata.catalog.accounting.accounting_select`), and forgets shards with
no files left. Only the per-shard inputs count: a bridge manifest holds its own shard's rows (the
``samples`` view takes ``shard`` from the rows, these from the path; the bridge writes both alike).
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Mapping

import duckdb
import pyarrow as pa

from speechdata.catalog.accounting import PRODUCTS_BUILT_FROM_FILES, SOURCES, accounting_select, product_rejects_sql
from speechdata.catalog.incremental import ListedFile, list_files, locations_of
from speechdata.io.storage import DataRoot

ACCOUNTING_STATE_TABLES = {
    "catalog_accounting_shards": "shard VARCHAR, inputs_sha256 VARCHAR",
    "catalog_product_accounting": (
        "shard VARCHAR, product VARCHAR, landed BIGINT, produced BIGINT, rejected BIGINT, balanced BOOLEAN"
    ),
    "catalog_product_rejects": "shard VARCHAR, product VARCHAR, reason VARCHAR, utterances BIGINT",
}

SHARD_ACCOUNTING_FROM_STATE = """
    SELECT shard, product, landed, produced, rejected, produced + rejected AS accounted_for, balanced
    FROM catalog_product_accounting ORDER BY shard, product"""
"""The named query ``shard_accounting`` from the state: the same rows without reading a file."""

REJECTS_BY_PRODUCT_FROM_STATE = """
    SELECT product, reason, sum(utterances)::BIGINT AS utterances, count(DISTINCT shard) AS shards
    FROM catalog_product_rejects GROUP BY product, reason ORDER BY product, utterances DESC, reason"""
"""The named query ``rejects_by_product`` from the state."""

_TEMP = {
    "landed": "_acct_landed",
    "produced": "_acct_produced",
    "built": "_acct_built",
    "rejects": "_acct_rejects",
}


def list_accounting_inputs(
    root: DataRoot, manifests: Mapping[str, ListedFile], rejects: Mapping[str, ListedFile]
) -> dict[str, dict[str, ListedFile]]:
    """Every file per-shard accounting reads, by source (``landed``, ``bridge``, ``asr``, ``vad``,
    ``translation``, ``hf``, ``rejects``); manifests and ledgers as the refresh already listed them."""
    listed = {name: list_files(root, pattern) for name, (pattern, _, _) in SOURCES.items() if name != "bridge"}
    listed["bridge"] = dict(manifests)
    listed["rejects"] = dict(rejects)
    return listed


def sync_accounting(
    connection: duckdb.DuckDBPyConnection,
    root_uri: str,
    inputs: Mapping[str, Mapping[str, ListedFile]],
    rejects_shard_from_path: str,
) -> int:
    """Bring the per-shard accounting up to the listed ``inputs``; returns how many shards were recounted."""
    files_by_shard = _files_by_shard(inputs, rejects_shard_from_path)
    digests = {shard: _digest(files) for shard, files in files_by_shard.items()}
    stored = dict(connection.execute("SELECT shard, inputs_sha256 FROM catalog_accounting_shards").fetchall())
    changed = sorted(shard for shard, digest in digests.items() if stored.get(shard) != digest)
    forget = sorted({*changed, *(shard for shard in stored if shard not in digests)})
    if forget:
        for table in ACCOUNTING_STATE_TABLES:
            connection.execute(f"DELETE FROM {table} WHERE shard IN (SELECT unnest(?::VARCHAR[]))", [forget])
    if changed:
        _recount(connection, root_uri, [f for shard in changed for f in files_by_shard[shard]], rejects_shard_from_path)
        connection.execute(
            "INSERT INTO catalog_accounting_shards SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
            [changed, [digests[shard] for shard in changed]],
        )
    return len(changed)


def _shard_regex(name: str, rejects_shard_from_path: str) -> re.Pattern[str]:
    return re.compile(rejects_shard_from_path if name == "rejects" else SOURCES[name][1])


def _files_by_shard(
    inputs: Mapping[str, Mapping[str, ListedFile]], rejects_shard_from_path: str
) -> dict[str, list[tuple[str, ListedFile]]]:
    by_shard: dict[str, list[tuple[str, ListedFile]]] = defaultdict(list)
    for name, files in inputs.items():
        regex = _shard_regex(name, rejects_shard_from_path)
        for path, listed in files.items():
            # The regexes are the views' own, written for DuckDB's full file names: anchor at a slash.
            found = regex.search("/" + path)
            if found:
                by_shard[found.group(1)].append((name, listed))
    return by_shard


def _digest(files: list[tuple[str, ListedFile]]) -> str:
    lines = sorted(f"{name}\t{f.path}\t{f.size_bytes}\t{f.fingerprint}" for name, f in files)
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def _recount(
    connection: duckdb.DuckDBPyConnection,
    root_uri: str,
    files: list[tuple[str, ListedFile]],
    rejects_shard_from_path: str,
) -> None:
    """Count the shards these ``(source, file)`` pairs belong to from these files alone, into the state."""
    paths: dict[str, list[str]] = defaultdict(list)
    for name, listed in files:
        paths[name].append(listed.path)
    # No cleanup on failure: the refresh's transaction rolls the temp tables back with everything else
    # (a statement in an aborted transaction would only hide the error that aborted it).
    _read_sources(connection, root_uri, paths, rejects_shard_from_path)
    connection.execute(
        "INSERT INTO catalog_product_accounting "
        + accounting_select(
            landed_rows=f"SELECT * FROM {_TEMP['landed']}",
            produced_rows=f"SELECT * FROM {_TEMP['produced']}",
            built=f"SELECT * FROM {_TEMP['built']}",
            rejects=f"SELECT * FROM {_TEMP['rejects']}",
        )
    )
    rejected = product_rejects_sql("SELECT * FROM " + _TEMP["rejects"])
    connection.execute(
        f"INSERT INTO catalog_product_rejects SELECT shard, product, reason, count(*) FROM ({rejected}) GROUP BY ALL"
    )
    for table in _TEMP.values():
        connection.execute(f"DROP TABLE {table}")


def _read_sources(
    connection: duckdb.DuckDBPyConnection, root_uri: str, paths: Mapping[str, list[str]], rejects_shard_from_path: str
) -> None:
    """Temp tables with the rows of the listed files: the four relations :func:`accounting_select` reads."""
    connection.execute(f"CREATE OR REPLACE TEMP TABLE {_TEMP['landed']} (shard VARCHAR, utt_id VARCHAR)")
    connection.execute(
        f"CREATE OR REPLACE TEMP TABLE {_TEMP['produced']} (product VARCHAR, shard VARCHAR, utt_id VARCHAR)"
    )
    connection.execute(
        f"CREATE OR REPLACE TEMP TABLE {_TEMP['rejects']} "
        "(shard VARCHAR, utt_id VARCHAR, stage VARCHAR, reason VARCHAR, detail VARCHAR)"
    )
    built = [(name, path) for name in PRODUCTS_BUILT_FROM_FILES for path in paths.get(name, [])]
    connection.register(
        "_acct_built_paths", pa.table({"product": [b[0] for b in built], "path": [b[1] for b in built]})
    )
    try:
        connection.execute(f"CREATE OR REPLACE TEMP TABLE {_TEMP['built']} (product VARCHAR, shard VARCHAR)")
        for name in PRODUCTS_BUILT_FROM_FILES:
            connection.execute(
                f"INSERT INTO {_TEMP['built']} SELECT product, regexp_extract('/' || path, ?, 1) "
                "FROM _acct_built_paths WHERE product = ?",
                [SOURCES[name][1], name],
            )
    finally:
        connection.unregister("_acct_built_paths")
    for name, (_, shard_regex, ids) in SOURCES.items():
        files = paths.get(name)
        if not files:
            continue
        locations = locations_of(root_uri, files)
        select = (
            f"SELECT regexp_extract(filename, ?, 1) AS shard, {ids} AS utt_id "
            "FROM read_parquet(?, union_by_name = true, hive_partitioning = false, filename = true)"
        )
        if name == "landed":
            connection.execute(f"INSERT INTO {_TEMP['landed']} {select}", [shard_regex, locations])
        elif name == "bridge":
            # As the view: the bridge's produced rows carry the manifest's own ``shard`` column.
            connection.execute(
                f"INSERT INTO {_TEMP['produced']} SELECT 'bridge', shard, key "
                "FROM read_parquet(?, union_by_name = true, hive_partitioning = false)",
                [locations],
            )
        else:
            connection.execute(
                f"INSERT INTO {_TEMP['produced']} SELECT ?, * FROM ({select})", [name, shard_regex, locations]
            )
    if paths.get("rejects"):
        connection.execute(
            f"INSERT INTO {_TEMP['rejects']} SELECT regexp_extract(filename, ?, 1), utt_id, stage, reason, detail "
            "FROM read_parquet(?, union_by_name = true, hive_partitioning = false, filename = true)",
            [rejects_shard_from_path, locations_of(root_uri, paths["rejects"])],
        )
