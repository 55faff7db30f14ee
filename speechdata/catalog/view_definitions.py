"""The catalog's views, as SQL: which files each reads, decided from which per-shard globs match anything.

:func:`view_definitions` gives (view, SELECT) for every view in creation order; :func:`create_views`
creates them. Split from :mod:`speechdata.catalog.views`, which decides when to (re)create them.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from speechdata.accounting.rejects import REJECTS_SCHEMA
from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.catalog.accounting import product_accounting_sql, product_rejects_sql
from speechdata.catalog.quality import quality_view_definitions
from speechdata.catalog.root_paths import under_root
from speechdata.io import layout
from speechdata.io.storage import DataRoot

SUMMARY_VIEWS = ("hours_by_language", "hours_by_country", "hours_by_shard", "product_accounting", "product_rejects")
"""Summaries are views over the live files, so they never lag what they summarize."""
MANIFEST_GLOB = manifest_path("*")
# Atomic writes leave ``._tmp-*`` files beside a ledger while it is written (and after a crash):
# ``[!.]`` keeps them, half-written, out of the view.
REJECTS_GLOB = f"{layout.SHARDS}/*/rejects/[!.]*.parquet"
SHARD_FROM_REJECTS_PATH = r"(?:^|/)shards/([^/]+)/rejects/[^/]+$"
ALIGNMENTS_GLOB = f"{layout.SHARDS}/*/alignments.parquet"
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


def view_definitions(
    root: DataRoot, location: str, any_manifests: bool, any_rejects: bool, any_alignments: bool
) -> list[tuple[str, str]]:
    """(view, SELECT) for every view, in creation order; the same text means the same view."""
    if any_manifests:
        # Unioned by name with an empty select of every manifest column: a root whose manifests were
        # all written before a column existed (text_source, asr_confidence) still has it, as NULL,
        # so the summaries that read it never fail there.
        samples_sql = (
            f"SELECT * FROM read_parquet({under_root(MANIFEST_GLOB, location)}, "
            f"union_by_name = true, hive_partitioning = false) UNION ALL BY NAME {_empty_select(MANIFEST_COLUMNS)}"
        )
    else:
        samples_sql = _empty_select(MANIFEST_COLUMNS)
    if any_rejects:
        rejects_sql = (
            f"SELECT regexp_extract(filename, {_sql_literal(SHARD_FROM_REJECTS_PATH)}, 1) AS shard, "
            "utt_id, stage, reason, detail "
            f"FROM read_parquet({under_root(REJECTS_GLOB, location)}, "
            "union_by_name = true, hive_partitioning = false, filename = true)"
        )
    else:
        rejects_sql = _empty_select(pa.schema([pa.field("shard", pa.string()), *REJECTS_SCHEMA]))
    if any_alignments:
        words_sql = (
            'SELECT s.shard, a.utt_id AS key, a."index" AS word_index, a.text AS word, a.start_ms, a.end_ms, '
            "s.language "
            f"FROM read_parquet({under_root(ALIGNMENTS_GLOB, location)}, hive_partitioning = false, filename = true) AS a "
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
