"""The catalog: DuckDB views and summary tables over every shard manifest and rejects ledger.

``catalog.duckdb`` under the data root holds

* ``samples``: a view over ``manifests/shard=*/part-0.parquet`` (union by name: the landed
  metadata's extra columns differ between shards and are NULL where a shard lacks them);
* ``rejects``: a view over ``shards/*/rejects/*.parquet`` with the ``shard`` taken from the path;
* ``hours_by_language``, ``hours_by_country``, ``hours_by_shard``: summary views (samples,
  hours, mean alignment score); ``product_accounting``: every landed shard's ledger per product
  line (:mod:`speechdata.catalog.accounting`); ``catalog_info`` (when and over what the refresh ran).

Everything but ``catalog_info`` is a view reading the files at query time, so a summary never lags
what it summarizes (a new shard is visible as soon as its manifest is committed, which happens only
after its checks passed). A refresh replaces all of them in one transaction. The views name the
root's absolute location: after moving a data root, refresh.

Everything here takes an open ``duckdb.DuckDBPyConnection`` and returns Arrow tables; the caller
owns the connection (a Dagster resource, the CLI, a notebook). For an object-store root the
connection must already be able to read it: :func:`speechdata.io.duckdb_object_store.enable_data_root_reads`
(httpfs with a secret, or the root's fsspec filesystem), and the database file itself is a local
copy put back with :func:`speechdata.io.duckdb_object_store.upload_database`.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import IO

import duckdb
import pyarrow as pa

from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.catalog.accounting import REJECTS_BY_PRODUCT, escape_glob, product_accounting_sql, product_rejects_sql
from speechdata.io import layout
from speechdata.io.storage import DataRoot, _is_local, atomic_open, filesystem_for
from speechdata.rejects import REJECTS_SCHEMA

CATALOG_FILE = "catalog.duckdb"
"""The catalog database, relative to the data root."""

SUMMARY_VIEWS = ("hours_by_language", "hours_by_country", "hours_by_shard", "product_accounting", "product_rejects")
"""Summaries are views over the live files, so they never lag what they summarize."""
SUMMARY_TABLES = (*SUMMARY_VIEWS, "catalog_info")

_MANIFEST_GLOB = manifest_path("*")
# Atomic writes leave ``._tmp-*`` files beside a ledger while it is written (and after a crash):
# ``[!.]`` keeps them, half-written, out of the view.
_REJECTS_GLOB = f"{layout.SHARDS}/*/rejects/[!.]*.parquet"
_SHARD_FROM_REJECTS_PATH = r"/shards/([^/]+)/rejects/[^/]+$"

_DUCKDB_TYPES = {
    pa.string(): "VARCHAR",
    pa.int64(): "BIGINT",
    pa.int32(): "INTEGER",
    pa.float64(): "DOUBLE",
    pa.float32(): "FLOAT",
}
_MANIFEST_TYPES = {f.name: _DUCKDB_TYPES[f.type] for f in MANIFEST_COLUMNS}


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


# --- refresh -------------------------------------------------------------------------------


def refresh_catalog(connection: duckdb.DuckDBPyConnection, root_uri: str) -> CatalogSummary:
    """(Re)create the ``samples`` and ``rejects`` views and the summary tables for ``root_uri``.

    The files are listed with the root's filesystem first: DuckDB fails on a glob that matches
    nothing, so with no manifests (or no ledgers) yet the view is an empty one with the right
    columns. Everything is replaced inside one transaction.
    """
    root = DataRoot(root_uri)
    manifest_files = root.fs.glob(f"{escape_glob(root.root)}/{_MANIFEST_GLOB}")
    rejects_files = root.fs.glob(f"{escape_glob(root.root)}/{_REJECTS_GLOB}")
    location = duckdb_location(root_uri)
    # A root such as ``/data/run[1]`` must match itself, not a character class.
    glob_location = escape_glob(location)

    if manifest_files:
        samples_sql = (
            f"SELECT * FROM read_parquet({_sql_literal(f'{glob_location}/{_MANIFEST_GLOB}')}, "
            "union_by_name = true, hive_partitioning = false)"
        )
    else:
        samples_sql = _empty_select(MANIFEST_COLUMNS)
    if rejects_files:
        rejects_sql = (
            f"SELECT regexp_extract(filename, {_sql_literal(_SHARD_FROM_REJECTS_PATH)}, 1) AS shard, "
            "utt_id, stage, reason, detail "
            f"FROM read_parquet({_sql_literal(f'{glob_location}/{_REJECTS_GLOB}')}, "
            "union_by_name = true, hive_partitioning = false, filename = true)"
        )
    else:
        rejects_sql = _empty_select(pa.schema([pa.field("shard", pa.string()), *REJECTS_SCHEMA]))

    connection.begin()
    try:
        connection.execute(f"CREATE OR REPLACE VIEW samples AS {samples_sql}")
        connection.execute(f"CREATE OR REPLACE VIEW rejects AS {rejects_sql}")
        old_tables = {r[0] for r in connection.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        for view in set(SUMMARY_VIEWS) & old_tables:  # catalogs refreshed before summaries became views
            connection.execute(f"DROP TABLE {view}")
        for group in ("language", "country"):
            connection.execute(
                f"CREATE OR REPLACE VIEW hours_by_{group} AS "
                f"SELECT {group}, count(*) AS samples, sum(duration_s) / 3600.0 AS hours, "
                "avg(alignment_score) AS mean_alignment_score, count(DISTINCT shard) AS shards "
                f"FROM samples GROUP BY {group} ORDER BY hours DESC, {group}"
            )
        connection.execute(
            """
            CREATE OR REPLACE VIEW hours_by_shard AS
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
        connection.execute(f"CREATE OR REPLACE VIEW product_accounting AS {product_accounting_sql(root, location)}")
        connection.execute(f"CREATE OR REPLACE VIEW product_rejects AS {product_rejects_sql()}")
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


def duckdb_location(root_uri: str) -> str:
    """How DuckDB names the root: a plain absolute path for a local root, the URL otherwise."""
    fs, root = filesystem_for(root_uri)
    return root if _is_local(fs) else fs.unstrip_protocol(root)


def _sql_literal(text: str) -> str:
    """A SQL string literal (for DDL, where DuckDB takes no parameters; never for user values)."""
    return "'" + text.replace("'", "''") + "'"


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _empty_select(schema: pa.Schema) -> str:
    columns = ", ".join(f"CAST(NULL AS {_DUCKDB_TYPES[f.type]}) AS {_quote_identifier(f.name)}" for f in schema)
    return f"SELECT {columns} WHERE false"


# --- queries -------------------------------------------------------------------------------

NAMED_QUERIES: dict[str, str] = {
    "hours_per_language": """
        SELECT language, count(*) AS samples, sum(duration_s) / 3600.0 AS hours,
               avg(alignment_score) AS mean_alignment_score
        FROM samples GROUP BY language ORDER BY hours DESC, language""",
    "hours_per_country": """
        SELECT country, count(*) AS samples, sum(duration_s) / 3600.0 AS hours,
               avg(alignment_score) AS mean_alignment_score
        FROM samples GROUP BY country ORDER BY hours DESC, country""",
    "hours_per_shard": """
        SELECT shard, count(*) AS samples, sum(duration_s) / 3600.0 AS hours,
               avg(alignment_score) AS mean_alignment_score, count(DISTINCT tar_url) AS tars
        FROM samples GROUP BY shard ORDER BY shard""",
    "samples_per_language_and_country": """
        SELECT language, country, count(*) AS samples, sum(duration_s) / 3600.0 AS hours
        FROM samples GROUP BY language, country ORDER BY language, country""",
    "rejects_by_reason": """
        SELECT stage, reason, count(*) AS rejects, count(DISTINCT (shard, utt_id)) AS utterances,
               count(DISTINCT shard) AS shards
        FROM rejects GROUP BY stage, reason ORDER BY rejects DESC, stage, reason""",
    "rejects_by_shard": """
        SELECT shard, count(DISTINCT utt_id) AS rejected_utterances, count(*) AS rejects,
               string_agg(DISTINCT stage, ',' ORDER BY stage) AS stages
        FROM rejects GROUP BY shard ORDER BY shard""",
    "rejects_by_product": REJECTS_BY_PRODUCT,
    "shard_accounting": """
        SELECT shard, product, landed, produced, rejected, produced + rejected AS accounted_for, balanced
        FROM product_accounting ORDER BY shard, product""",
}
"""Queries a person asks often, by name; all read the live views. ``shard_accounting`` lists every
landed shard once per product line, with that product's own ledger (``speechdata.ledgers``)."""


def run_query(connection: duckdb.DuckDBPyConnection, sql: str, params: Sequence | Mapping | None = None) -> pa.Table:
    """Run ``sql`` with ``params`` bound to its ``?`` (or ``$name``) placeholders; an empty table for DDL."""
    relation = connection.sql(sql, params=params)
    if relation is None:
        return pa.table({})
    return relation.to_arrow_table() if hasattr(relation, "to_arrow_table") else relation.fetch_arrow_table()


def sample_columns(connection: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """The ``samples`` view's columns and their DuckDB types, in order."""
    return {row[0]: row[1] for row in connection.execute("DESCRIBE samples").fetchall()}


def select_samples(
    connection: duckdb.DuckDBPyConnection,
    where: Mapping[str, object] | None = None,
    min_alignment_score: float | None = None,
    min_duration_s: float | None = None,
    max_duration_s: float | None = None,
    languages: Sequence[str] | None = None,
    countries: Sequence[str] | None = None,
    limit: int | None = None,
    order_by_key: bool = True,
) -> pa.Table:
    """Rows of ``samples`` matching every filter, ordered by ``(shard, key)`` unless told not to.

    ``where`` maps a column to a value (``= value``), a list/tuple/set (``IN``; empty matches
    nothing) or ``None`` (``IS NULL``). Column names are checked against the view's columns and
    rejected with :class:`ValueError` when unknown; every value reaches DuckDB as a bound
    parameter, cast to the column's type (so bounds compare at the column's precision: the
    ``alignment_score`` bound as float32). Scores and durations are inclusive bounds.
    """
    # Describing the view reads every manifest's footer: only a ``where`` needs it.
    columns = sample_columns(connection) if where else dict(_MANIFEST_TYPES)
    conditions: list[str] = []
    params: list[object] = []

    def placeholder(column: str) -> str:
        return f"CAST(? AS {columns[column]})"

    def add_membership(column: str, values) -> None:
        values = list(values)
        if not values:
            conditions.append("false")
            return
        conditions.append(f"{_quote_identifier(column)} IN ({', '.join([placeholder(column)] * len(values))})")
        params.extend(values)

    for column, value in (where or {}).items():
        if column not in columns:
            raise ValueError(f"unknown column {column!r} in where: the samples view has {', '.join(columns)}")
        if value is None:
            conditions.append(f"{_quote_identifier(column)} IS NULL")
        elif isinstance(value, (list, tuple, set, frozenset)):
            add_membership(column, sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value)
        else:
            conditions.append(f"{_quote_identifier(column)} = {placeholder(column)}")
            params.append(value)
    if languages is not None:
        add_membership("language", [languages] if isinstance(languages, str) else languages)
    if countries is not None:
        add_membership("country", [countries] if isinstance(countries, str) else countries)
    for bound, column, operator in (
        (min_alignment_score, "alignment_score", ">="),
        (min_duration_s, "duration_s", ">="),
        (max_duration_s, "duration_s", "<="),
    ):
        if bound is not None:
            conditions.append(f"{column} {operator} {placeholder(column)}")
            params.append(float(bound))

    sql = "SELECT * FROM samples"
    if conditions:
        sql += " WHERE " + " AND ".join(conditions)
    if order_by_key:
        sql += " ORDER BY shard, key"
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        sql += " LIMIT ?"
        params.append(limit)
    return run_query(connection, sql, params)


# --- exports -------------------------------------------------------------------------------


def export_nemo_manifest(
    table: pa.Table, path_or_handle: str | os.PathLike | IO, audio_url_column: str = "tar_url"
) -> int:
    """Write ``table``'s samples as a NeMo JSONL manifest; return the number of lines.

    One line per row: ``{"audio_filepath": "<tar_url>#<key>.wav", "duration": <duration_s>,
    "text": <text or "">, "lang": <language>}``. The ``#<key>.wav`` convention: ``tar_url`` is
    the WebDataset tar that holds the sample and the fragment after the last ``#`` is the name of
    its audio member inside that tar (keys have no dots, so ``<key>.wav`` is the whole member
    name). A loader splits at the last ``#``, opens the tar (or reads the manifest's
    ``offset``/``size`` byte range) and reads that member. NeMo's own tarred datasets take the tar
    list and the member name separately (``tarred_audio_filepaths`` and ``audio_filepath``), so
    feed them ``audio_filepath.rsplit("#", 1)``.

    ``path_or_handle``: a local path or fsspec URL (written atomically) or an open text/binary handle.
    """
    needed = [audio_url_column, "key", "duration_s", "text", "language"]
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise ValueError(f"cannot export a NeMo manifest: the table lacks column(s) {', '.join(missing)}")

    def write_lines(handle) -> int:
        binary = not isinstance(handle, io.TextIOBase) and "b" in getattr(handle, "mode", "b")
        lines = 0
        for batch in table.select(needed).to_batches(max_chunksize=65_536):
            urls, keys, durations, texts, langs = (batch.column(i).to_pylist() for i in range(5))
            chunk = "".join(
                json.dumps(
                    {"audio_filepath": f"{url}#{key}.wav", "duration": duration, "text": text or "", "lang": lang},
                    ensure_ascii=False,
                )
                + "\n"
                for url, key, duration, text, lang in zip(urls, keys, durations, texts, langs)
            )
            handle.write(chunk.encode("utf-8") if binary else chunk)
            lines += batch.num_rows
        return lines

    if hasattr(path_or_handle, "write"):
        return write_lines(path_or_handle)
    fs, path = filesystem_for(os.fspath(path_or_handle))
    with atomic_open(fs, path, "wb") as handle:
        return write_lines(handle)


def export_tar_urls(table: pa.Table, column: str = "tar_url") -> list[str]:
    """The distinct tar URLs of ``table``'s samples, sorted (a WebDataset shard list)."""
    if column not in table.column_names:
        raise ValueError(f"the table has no {column!r} column")
    return sorted({url for url in table.column(column).to_pylist() if url is not None})


# --- display -------------------------------------------------------------------------------


def format_table(table: pa.Table, max_rows: int = 50, max_width: int = 60) -> str:
    """An aligned plain-text rendering of ``table`` for a terminal (numbers right-aligned)."""
    names = table.column_names
    if not names:
        return "(no columns)"
    shown = table.slice(0, max_rows).to_pylist() if max_rows >= 0 else table.to_pylist()
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) for t in table.schema.types]
    cells = [[_format_cell(row[name], max_width) for name in names] for row in shown]
    widths = [max([len(name)] + [len(r[i]) for r in cells]) for i, name in enumerate(names)]

    def line(values: list[str]) -> str:
        return "  ".join(
            value.rjust(width) if is_number else value.ljust(width)
            for value, width, is_number in zip(values, widths, numeric)
        ).rstrip()

    out = [line(list(names)), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells)
    total = table.num_rows
    noun = "row" if total == 1 else "rows"
    out.append(f"({len(shown)} of {total} {noun} shown)" if len(shown) < total else f"({total} {noun})")
    return "\n".join(out)


def _format_cell(value: object, max_width: int) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        text = f"{value:.4f}" if abs(value) < 1e9 else f"{value:.4g}"
    else:
        text = str(value).replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= max_width else text[: max_width - 3] + "..."


__all__ = [
    "CATALOG_FILE",
    "NAMED_QUERIES",
    "SUMMARY_TABLES",
    "CatalogSummary",
    "duckdb_location",
    "export_nemo_manifest",
    "export_tar_urls",
    "format_table",
    "refresh_catalog",
    "run_query",
    "sample_columns",
    "select_samples",
]
