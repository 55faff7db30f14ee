"""Per-shard accounting kept in the catalog, so that a refresh recounts only the shards that changed.

The ``product_accounting`` and ``product_rejects`` views read every shard's landing metadata,
product indexes, manifest and rejects ledgers at each query, a cost that grows with the shard count,
and ``manifest_catalog`` showed both after every shard (docs/performance.md has the figures). The
catalog now also keeps their rows per shard:

* ``catalog_accounting_shards`` (``shard``, ``inputs_sha256``): the digest of the path, size and
  fingerprint of every file the shard's accounting reads, and of the product lines it was counted
  under (:data:`speechdata.products.PRODUCT_LINES`: a product line added or changed recounts every shard);
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
import json
import re
from collections import defaultdict
from collections.abc import Collection, Mapping

import duckdb

from speechdata import products
from speechdata.catalog.accounting import (
    LANDED_GLOB,
    SHARD_FROM_LANDED_PATH,
    STATE_SQL,
    accounting_select,
    ids_expression,
    product_rejects_sql,
    shard_expression,
)
from speechdata.catalog.incremental import (
    SHARDS_PER_RECOUNT,
    ListedFile,
    in_batches,
    list_files,
    list_shard_files,
    locations_of,
)
from speechdata.catalog.recount_scratch import insert_counted, recount_scratch
from speechdata.io.storage import DataRoot

ACCOUNTING_STATE_TABLES = {
    "catalog_accounting_shards": "shard VARCHAR, inputs_sha256 VARCHAR",
    "catalog_product_accounting": (
        "shard VARCHAR, product VARCHAR, landed BIGINT, produced BIGINT, rejected BIGINT, balanced BOOLEAN"
    ),
    "catalog_product_rejects": "shard VARCHAR, product VARCHAR, reason VARCHAR, utterances BIGINT",
}

SHARD_ACCOUNTING_FROM_STATE = f"""
    SELECT shard, product, {STATE_SQL} AS state, landed, produced, rejected,
           produced + rejected AS accounted_for, balanced
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


LANDED = "landed"
REJECTS = "rejects"
"""The two sources beside the product lines' outputs; a product line may not take their names."""


def list_accounting_inputs(
    root: DataRoot,
    rejects: Mapping[str, ListedFile],
    already_listed: Mapping[str, Mapping[str, ListedFile]] | None = None,
    shards: Collection[str] | None = None,
) -> dict[str, dict[str, ListedFile]]:
    """Every file per-shard accounting reads, by source: ``landed``, each product line's name,
    ``rejects`` (the ledgers as the refresh already listed them). ``already_listed``: other files the
    refresh listed, by glob (the shard manifests), used as they are instead of listed again.
    ``shards``: those shards' files only (:func:`~speechdata.catalog.incremental.list_shard_files`)."""
    already_listed = already_listed or {}

    def listing(glob: str) -> dict[str, ListedFile]:
        return list_files(root, glob) if shards is None else list_shard_files(root, glob, shards)

    listed = {LANDED: listing(LANDED_GLOB)}
    for line in products.product_lines():
        if line.name in (LANDED, REJECTS):
            raise ValueError(f"product line {line.name!r} takes the name of a catalog accounting source")
        glob = line.output_glob
        listed[line.name] = dict(already_listed[glob]) if glob in already_listed else listing(glob)
    listed[REJECTS] = dict(rejects)
    return listed


def sync_accounting(
    connection: duckdb.DuckDBPyConnection,
    root_uri: str,
    inputs: Mapping[str, Mapping[str, ListedFile]],
    rejects_shard_from_path: str,
    shards: Collection[str] | None = None,
) -> int:
    """Bring the per-shard accounting up to the listed ``inputs``; returns how many shards were
    recounted. ``shards``: the inputs list those shards alone; no other shard's rows are touched."""
    files_by_shard = _files_by_shard(inputs, rejects_shard_from_path)
    registry = _registry_digest()
    digests = {shard: _digest(files, registry) for shard, files in files_by_shard.items()}
    stored = dict(connection.execute(*stored_shards_sql("catalog_accounting_shards", shards)).fetchall())
    changed = sorted(shard for shard, digest in digests.items() if stored.get(shard) != digest)
    forget = sorted({*changed, *(shard for shard in stored if shard not in digests)})
    if forget:
        for table in ACCOUNTING_STATE_TABLES:
            connection.execute(f"DELETE FROM {table} WHERE shard IN (SELECT unnest(?::VARCHAR[]))", [forget])
    if changed:
        turns = list(in_batches(changed, SHARDS_PER_RECOUNT))
        with recount_scratch(connection, len(turns)) as scratch:
            for turn in turns:
                files = [f for shard in turn for f in files_by_shard[shard]]
                _recount(connection, scratch, root_uri, files, rejects_shard_from_path)
        connection.execute(
            "INSERT INTO catalog_accounting_shards SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
            [changed, [digests[shard] for shard in changed]],
        )
    return len(changed)


def stored_shards_sql(table: str, shards: Collection[str] | None) -> tuple[str, list]:
    """The (shard, inputs_sha256) rows of ``table``: all, or those of ``shards``."""
    if shards is None:
        return f"SELECT shard, inputs_sha256 FROM {table}", []
    return f"SELECT shard, inputs_sha256 FROM {table} WHERE shard IN (SELECT unnest(?::VARCHAR[]))", [sorted(shards)]


def _shard_regex(name: str, rejects_shard_from_path: str) -> re.Pattern[str]:
    if name == REJECTS:
        return re.compile(rejects_shard_from_path)
    if name == LANDED:
        return re.compile(SHARD_FROM_LANDED_PATH)
    return re.compile(products.product_line(name).shard_regex)


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


def _registry_digest() -> str:
    """What the product lines count: a shard counted under other product lines is counted again."""
    described = [
        [line.name, list(line.stages), line.output_glob, line.id_column, line.ids_are_lists, line.shard_column]
        + ([line.id_part_separator] if line.id_part_separator else [])
        for line in products.product_lines()
    ]
    return hashlib.sha256(json.dumps(described).encode("utf-8")).hexdigest()


def _digest(files: list[tuple[str, ListedFile]], registry_digest: str) -> str:
    lines = sorted(f"{name}\t{f.path}\t{f.size_bytes}\t{f.fingerprint}" for name, f in files)
    lines.append(f"product lines\t{registry_digest}")
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def _recount(
    connection: duckdb.DuckDBPyConnection,
    scratch: duckdb.DuckDBPyConnection,
    root_uri: str,
    files: list[tuple[str, ListedFile]],
    rejects_shard_from_path: str,
) -> None:
    """Count the shards these ``(source, file)`` pairs belong to from these files alone, into the
    state on ``connection``: their rows read into temp tables of ``scratch``
    (:func:`~speechdata.catalog.recount_scratch.recount_scratch`)."""
    paths: dict[str, list[str]] = defaultdict(list)
    for name, listed in files:
        paths[name].append(listed.path)
    # No cleanup on failure: the scratch's temp tables go when it is closed, or the refresh's
    # transaction rolls them back with everything else (a statement in an aborted transaction
    # would only hide the error that aborted it).
    _read_sources(scratch, root_uri, paths, rejects_shard_from_path)
    insert_counted(
        connection,
        "catalog_product_accounting",
        scratch,
        "SELECT shard, product, landed, produced, rejected, balanced FROM ("
        + accounting_select(
            landed_rows=f"SELECT * FROM {_TEMP['landed']}",
            produced_rows=f"SELECT * FROM {_TEMP['produced']}",
            built=f"SELECT * FROM {_TEMP['built']}",
            rejects=f"SELECT * FROM {_TEMP['rejects']}",
        )
        + ")",
    )
    rejected = product_rejects_sql("SELECT * FROM " + _TEMP["rejects"])
    insert_counted(
        connection,
        "catalog_product_rejects",
        scratch,
        f"SELECT shard, product, reason, count(*) FROM ({rejected}) GROUP BY ALL",
    )
    for table in _TEMP.values():
        scratch.execute(f"DROP TABLE {table}")


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
    lines = products.product_lines()
    built = [(line.name, path) for line in lines for path in paths.get(line.name, [])]
    connection.execute(f"CREATE OR REPLACE TEMP TABLE {_TEMP['built']} (product VARCHAR, shard VARCHAR)")
    for line in lines:
        line_paths = [path for name, path in built if name == line.name]
        if line_paths:
            # A list parameter, not a registered Arrow table: registering one imports pandas.
            connection.execute(
                f"INSERT INTO {_TEMP['built']} SELECT ?, regexp_extract('/' || path, ?, 1) "
                "FROM (SELECT unnest(?::VARCHAR[]) AS path)",
                [line.name, line.shard_regex, line_paths],
            )
    for batch in in_batches(locations_of(root_uri, paths.get(LANDED, []))):
        connection.execute(
            f"INSERT INTO {_TEMP['landed']} SELECT regexp_extract(filename, ?, 1) AS shard, utt_id "
            "FROM read_parquet(?, union_by_name = true, hive_partitioning = false, filename = true)",
            [SHARD_FROM_LANDED_PATH, batch],
        )
    for line in lines:
        # The same expressions as the view (a bridge row's shard is the manifest's own column).
        for batch in in_batches(locations_of(root_uri, paths.get(line.name, []))):
            connection.execute(
                f"INSERT INTO {_TEMP['produced']} SELECT ?, {shard_expression(line)}, {ids_expression(line)} "
                "FROM read_parquet(?, union_by_name = true, hive_partitioning = false, filename = true)",
                [line.name, batch],
            )
    for batch in in_batches(locations_of(root_uri, paths.get(REJECTS, []))):
        connection.execute(
            f"INSERT INTO {_TEMP['rejects']} SELECT regexp_extract(filename, ?, 1), utt_id, stage, reason, detail "
            "FROM read_parquet(?, union_by_name = true, hive_partitioning = false, filename = true)",
            [rejects_shard_from_path, batch],
        )
