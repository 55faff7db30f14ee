"""The catalog: DuckDB views and summary tables over every shard manifest and rejects ledger.

``catalog.duckdb`` under the data root holds

* ``samples``: a view over ``manifests/shard=*/part-0.parquet`` (union by name: the landed
  metadata's extra columns differ between shards and are NULL where a shard lacks them);
* ``rejects``: a view over ``shards/*/rejects/*.parquet`` with the ``shard`` taken from the path;
* ``hours_by_language``, ``hours_by_country``, ``hours_by_shard``: summary tables (samples,
  hours, mean alignment score) and ``catalog_info`` (when and over what the refresh ran), a
  snapshot taken by :func:`refresh_catalog`.

The views read the files at query time (a new shard is visible as soon as its manifest is
written); the summary tables change only on a refresh, and a refresh replaces all of them in one
transaction so a reader sees either the previous snapshot or the new one. The views name the
root's absolute location: after moving a data root, refresh.

This module builds the catalog; :mod:`~speechdata.catalog.queries` asks it questions,
:mod:`~speechdata.catalog.exports` writes selections out, :mod:`~speechdata.catalog.cli` is the
``speechdata catalog`` command. Everything takes an open ``duckdb.DuckDBPyConnection``; the caller
owns the connection (a Dagster resource, the CLI, a notebook). For an object-store root the
connection must already be able to read it: :func:`speechdata.io.duckdb_object_store.enable_data_root_reads`
(httpfs with a secret, or the root's fsspec filesystem), and the database file itself is a local
copy put back with :func:`speechdata.io.duckdb_object_store.upload_database`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import duckdb
import pyarrow as pa

from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.io import layout
from speechdata.io.duckdb_object_store import duckdb_location
from speechdata.io.storage import DataRoot
from speechdata.rejects import REJECTS_SCHEMA

CATALOG_FILE = "catalog.duckdb"
"""The catalog database, relative to the data root."""

SUMMARY_TABLES = ("hours_by_language", "hours_by_country", "hours_by_shard", "catalog_info")

_MANIFEST_GLOB = manifest_path("*")
# Atomic writes leave ``._tmp-*`` files beside a ledger while it is written (and after a crash):
# ``[!.]`` keeps them, half-written, out of the view.
_REJECTS_GLOB = f"{layout.SHARDS}/*/rejects/[!.]*.parquet"
_SHARD_FROM_REJECTS_PATH = r"/shards/([^/]+)/rejects/[^/]+$"

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

    def as_dict(self) -> dict:
        return asdict(self)


def refresh_catalog(connection: duckdb.DuckDBPyConnection, root_uri: str) -> CatalogSummary:
    """(Re)create the ``samples`` and ``rejects`` views and the summary tables for ``root_uri``.

    The files are listed with the root's filesystem first: DuckDB fails on a glob that matches
    nothing, so with no manifests (or no ledgers) yet the view is an empty one with the right
    columns. Everything is replaced inside one transaction.
    """
    root = DataRoot(root_uri)
    manifest_files = root.fs.glob(root.path(_MANIFEST_GLOB))
    rejects_files = root.fs.glob(root.path(_REJECTS_GLOB))
    location = duckdb_location(root_uri)

    if manifest_files:
        samples_sql = (
            f"SELECT * FROM read_parquet({_sql_literal(f'{location}/{_MANIFEST_GLOB}')}, "
            "union_by_name = true, hive_partitioning = false)"
        )
    else:
        samples_sql = _empty_select(MANIFEST_COLUMNS)
    if rejects_files:
        rejects_sql = (
            f"SELECT regexp_extract(filename, {_sql_literal(_SHARD_FROM_REJECTS_PATH)}, 1) AS shard, "
            "utt_id, stage, reason, detail "
            f"FROM read_parquet({_sql_literal(f'{location}/{_REJECTS_GLOB}')}, "
            "union_by_name = true, hive_partitioning = false, filename = true)"
        )
    else:
        rejects_sql = _empty_select(pa.schema([pa.field("shard", pa.string()), *REJECTS_SCHEMA]))

    connection.begin()
    try:
        connection.execute(f"CREATE OR REPLACE VIEW samples AS {samples_sql}")
        connection.execute(f"CREATE OR REPLACE VIEW rejects AS {rejects_sql}")
        for group in ("language", "country"):
            connection.execute(
                f"CREATE OR REPLACE TABLE hours_by_{group} AS "
                f"SELECT {group}, count(*) AS samples, sum(duration_s) / 3600.0 AS hours, "
                "avg(alignment_score) AS mean_alignment_score, count(DISTINCT shard) AS shards "
                f"FROM samples GROUP BY {group} ORDER BY hours DESC, {group}"
            )
        connection.execute(
            """
            CREATE OR REPLACE TABLE hours_by_shard AS
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
        )
        connection.execute(
            "CREATE OR REPLACE TABLE catalog_info AS SELECT current_timestamp AS refreshed_at, "
            "?::VARCHAR AS data_root, ?::BIGINT AS manifest_files, ?::BIGINT AS rejects_files",
            [root_uri, len(manifest_files), len(rejects_files)],
        )
        summary = _summarize(connection, len(manifest_files), len(rejects_files))
        connection.commit()
    except BaseException:
        connection.rollback()
        raise
    return summary


def _summarize(connection: duckdb.DuckDBPyConnection, manifest_files: int, rejects_files: int) -> CatalogSummary:
    shards, samples, hours = connection.execute(
        "SELECT count(*) FILTER (WHERE samples > 0), coalesce(sum(samples), 0), coalesce(sum(hours), 0.0) "
        "FROM hours_by_shard"
    ).fetchone()
    rejects, rejected = connection.execute(
        "SELECT count(*), count(DISTINCT (shard, utt_id)) FILTER (WHERE utt_id IS NOT NULL) FROM rejects"
    ).fetchone()
    languages = [
        row[0]
        for row in connection.execute(
            "SELECT language FROM hours_by_language WHERE language IS NOT NULL ORDER BY language"
        ).fetchall()
    ]
    countries = [
        row[0]
        for row in connection.execute(
            "SELECT country FROM hours_by_country WHERE country IS NOT NULL ORDER BY country"
        ).fetchall()
    ]
    return CatalogSummary(
        manifest_files=manifest_files,
        rejects_files=rejects_files,
        shards=int(shards),
        samples=int(samples),
        hours=float(hours),
        rejects=int(rejects),
        rejected_utterances=int(rejected),
        languages=languages,
        countries=countries,
    )


def _sql_literal(text: str) -> str:
    """A SQL string literal (for DDL, where DuckDB takes no parameters; never for user values)."""
    return "'" + text.replace("'", "''") + "'"


def quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _empty_select(schema: pa.Schema) -> str:
    columns = ", ".join(f"CAST(NULL AS {DUCKDB_TYPES[f.type]}) AS {quote_identifier(f.name)}" for f in schema)
    return f"SELECT {columns} WHERE false"
