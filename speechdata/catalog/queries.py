"""Questions asked of the catalog: named queries, SQL with bound parameters, filtered selections of samples.

Every function takes an open connection to a refreshed catalog (:mod:`speechdata.catalog.views`)
and returns an Arrow table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import duckdb
import pyarrow as pa

from speechdata.catalog.accounting import REJECTS_BY_PRODUCT
from speechdata.catalog.quality import QUALITY_NAMED_QUERIES
from speechdata.catalog.views import MANIFEST_TYPES, quote_identifier

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
    "pseudo_labels_per_shard": """
        SELECT shard, language, count(*) AS samples,
               count(*) FILTER (WHERE text_source = 'asr') AS pseudo_labels,
               avg(asr_confidence) FILTER (WHERE text_source = 'asr') AS mean_asr_confidence
        FROM samples GROUP BY shard, language ORDER BY shard, language""",
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
        SELECT shard, product, state, landed, produced, rejected, produced + rejected AS accounted_for, balanced
        FROM product_accounting ORDER BY shard, product""",
    **QUALITY_NAMED_QUERIES,
}
"""Queries a person asks often, by name; all read the live views. ``shard_accounting`` lists every
landed shard once per product line, with that product's own ledger (``speechdata.accounting.ledgers``) and its
``state``: ``balanced``, ``unbalanced`` or ``not built``. ``pseudo_labels_per_shard`` counts the packed
samples whose text is the aligner's pseudo-label (``text_source = 'asr'``: landed without text) and their mean confidence."""


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
    conditions = _Conditions(sample_columns(connection) if where else dict(MANIFEST_TYPES))
    for column, value in (where or {}).items():
        conditions.add_where(column, value)
    if languages is not None:
        conditions.add_membership("language", [languages] if isinstance(languages, str) else languages)
    if countries is not None:
        conditions.add_membership("country", [countries] if isinstance(countries, str) else countries)
    for bound, column, operator in (
        (min_alignment_score, "alignment_score", ">="),
        (min_duration_s, "duration_s", ">="),
        (max_duration_s, "duration_s", "<="),
    ):
        if bound is not None:
            conditions.add_bound(column, operator, float(bound))

    sql = "SELECT * FROM samples"
    if conditions.sql:
        sql += " WHERE " + " AND ".join(conditions.sql)
    if order_by_key:
        sql += " ORDER BY shard, key"
    params = conditions.params
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be a non-negative integer, got {limit!r}")
        sql += " LIMIT ?"
        params.append(limit)
    return run_query(connection, sql, params)


class _Conditions:
    """SQL conditions on the ``samples`` view and their bound parameters, each cast to its column's type."""

    def __init__(self, columns: Mapping[str, str]):
        self.columns = columns
        self.sql: list[str] = []
        self.params: list[object] = []

    def _placeholder(self, column: str) -> str:
        return f"CAST(? AS {self.columns[column]})"

    def add_membership(self, column: str, values) -> None:
        values = list(values)
        if not values:
            self.sql.append("false")
            return
        self.sql.append(f"{quote_identifier(column)} IN ({', '.join([self._placeholder(column)] * len(values))})")
        self.params.extend(values)

    def add_where(self, column: str, value: object) -> None:
        """``= value``, ``IN`` for a list/tuple/set, ``IS NULL`` for None; an unknown column is a ValueError."""
        if column not in self.columns:
            raise ValueError(f"unknown column {column!r} in where: the samples view has {', '.join(self.columns)}")
        if value is None:
            self.sql.append(f"{quote_identifier(column)} IS NULL")
        elif isinstance(value, (list, tuple, set, frozenset)):
            self.add_membership(column, sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value)
        else:
            self.sql.append(f"{quote_identifier(column)} = {self._placeholder(column)}")
            self.params.append(value)

    def add_bound(self, column: str, operator: str, bound: float) -> None:
        self.sql.append(f"{column} {operator} {self._placeholder(column)}")
        self.params.append(bound)
