"""The catalog's per-product accounting: the same ledgers as :mod:`speechdata.accounting.ledgers`, in SQL.

``product_accounting`` is a view with one row per (landed shard, product line): ``landed``,
``produced`` (NULL when the product has not been built for the shard), ``rejected`` (distinct
utterances rejected by the stages the product depends on), ``balanced`` (as
:attr:`speechdata.accounting.ledgers.Ledger.balanced`: false when not built) and ``state`` (:data:`ACCOUNTING_STATES`:
``balanced``, ``unbalanced`` or ``not built``, so a product never built is not read as a lost
utterance), for every product line of :data:`speechdata.products.PRODUCT_LINES`. Being a view it never lags what it summarizes. Every
glob here is built from an escaped root, so a data root whose path holds glob characters (``[1]``)
reads its own files.
"""

from __future__ import annotations

from speechdata import products
from speechdata.catalog.incremental import has_files
from speechdata.catalog.root_paths import under_root
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.products import ProductLine

LANDED_GLOB = layout.landing_metadata("*")
SHARD_FROM_LANDED_PATH = r"/landing/([^/]+)/metadata\.parquet$"
"""The landed metadata every shard's ``landed`` count reads; the products' own files come from
their :class:`~speechdata.products.ProductLine` (``output_glob``, ``shard_regex``, ``id_column``)."""


ACCOUNTING_STATES = ("balanced", "unbalanced", "not built")
"""A (shard, product) row's ``state``: every landed utterance produced or rejected; some neither; the
product's output file does not exist for the shard (``produced`` is NULL)."""

STATE_SQL = (
    "CASE WHEN produced IS NULL THEN 'not built' "
    "WHEN landed = produced + rejected THEN 'balanced' ELSE 'unbalanced' END"
)
"""The ``state`` column from a row's ``landed``, ``produced`` and ``rejected`` (the view and the
per-shard state, :mod:`speechdata.catalog.accounting_state`, share it)."""


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def ids_expression(line: ProductLine) -> str:
    """The SQL expression giving one row per utterance id of the product's output rows."""
    column = _identifier(line.id_column)
    if line.ids_are_lists:
        return f"unnest({column})"
    if line.id_part_separator:  # a part's id names its utterance before the separator
        return f"split_part({column}, {_literal(line.id_part_separator)}, 1)"
    return column


def shard_expression(line: ProductLine) -> str:
    """The SQL expression giving an output row's shard: its own column, else from the file's name."""
    if line.shard_column:
        return _identifier(line.shard_column)
    return f"regexp_extract(filename, {_literal(line.shard_regex)}, 1)"


_NO_ROWS = "SELECT CAST(NULL AS VARCHAR) AS shard, CAST(NULL AS VARCHAR) AS utt_id WHERE false"


def _landed_select(root: DataRoot, location: str) -> str:
    if not has_files(root, LANDED_GLOB):
        return _NO_ROWS
    return (
        f"SELECT regexp_extract(filename, {_literal(SHARD_FROM_LANDED_PATH)}, 1) AS shard, utt_id "
        f"FROM read_parquet({under_root(LANDED_GLOB, location)}, union_by_name = true, "
        "hive_partitioning = false, filename = true)"
    )


def _produced_select(root: DataRoot, location: str, line: ProductLine) -> str:
    """(shard, utt_id) of every output row of the product (DuckDB fails on a glob matching nothing)."""
    if not has_files(root, line.output_glob):
        return _NO_ROWS
    filename = "" if line.shard_column else ", filename = true"
    return (
        f"SELECT {shard_expression(line)} AS shard, {ids_expression(line)} AS utt_id "
        f"FROM read_parquet({under_root(line.output_glob, location)}, union_by_name = true, "
        f"hive_partitioning = false{filename})"
    )


def _built_select(location: str) -> str:
    """(product, shard) for every product output file that exists, empty ones included."""
    return " UNION ALL ".join(
        f"SELECT {_literal(line.name)} AS product, regexp_extract(file, {_literal(line.shard_regex)}, 1) AS shard "
        f"FROM glob({under_root(line.output_glob, location)})"
        for line in products.product_lines()
    )


def product_accounting_sql(root: DataRoot, location: str) -> str:
    """The ``product_accounting`` view's SELECT over the root (``location``: its escaped name, :func:`~speechdata.catalog.root_paths.glob_root`)."""
    produced = " UNION ALL ".join(
        f"SELECT {_literal(line.name)} AS product, shard, utt_id FROM ({_produced_select(root, location, line)})"
        for line in products.product_lines()
    )
    return accounting_select(
        landed_rows=_landed_select(root, location),
        produced_rows=produced,
        built=_built_select(location),
        rejects="SELECT * FROM rejects",
    )


def accounting_select(landed_rows: str, produced_rows: str, built: str, rejects: str) -> str:
    """One row per (landed shard, product) from four relations (each a SELECT): ``landed_rows``
    (shard, utt_id), ``produced_rows`` (product, shard, utt_id), ``built`` (product, shard: the
    product's output file exists) and ``rejects`` (the ``rejects`` view's columns). The view reads
    them from every file under the root; :mod:`speechdata.catalog.accounting_state` from one
    refresh's changed shards."""
    stages = ", ".join(
        f"({_literal(line.name)}, {_literal(stage)})" for line in products.product_lines() for stage in line.stages
    )
    return f"""
        WITH landed_rows AS ({landed_rows}),
        landed AS (
            SELECT shard, count(DISTINCT utt_id) + count(*) FILTER (WHERE utt_id IS NULL) AS landed,
                   count(*) FILTER (WHERE utt_id IS NULL) AS null_ids
            FROM landed_rows GROUP BY shard
        ),
        stages(product, stage) AS (VALUES {stages}),
        built AS ({built}),
        produced_rows AS ({produced_rows}),
        produced_counts AS (
            SELECT product, shard, count(DISTINCT utt_id) AS n FROM produced_rows GROUP BY product, shard
        ),
        rejected_rows AS ({rejects}),
        rejected_counts AS (
            SELECT stages.product, rejected_rows.shard,
                   count(DISTINCT rejected_rows.utt_id) AS ids,
                   count(*) FILTER (WHERE rejected_rows.utt_id IS NULL) AS nulls
            FROM rejected_rows JOIN stages ON rejected_rows.stage = stages.stage
            GROUP BY stages.product, rejected_rows.shard
        ),
        rows AS (
            SELECT landed.shard, products.product, landed.landed,
                   CASE WHEN built.shard IS NULL THEN NULL ELSE coalesce(produced_counts.n, 0) END AS produced,
                   coalesce(rejected_counts.ids, 0) + least(coalesce(rejected_counts.nulls, 0), landed.null_ids)
                       AS rejected
            FROM landed CROSS JOIN (SELECT DISTINCT product FROM stages) AS products
            LEFT JOIN (SELECT DISTINCT product, shard FROM built) AS built
                ON built.product = products.product AND built.shard = landed.shard
            LEFT JOIN produced_counts
                ON produced_counts.product = products.product AND produced_counts.shard = landed.shard
            LEFT JOIN rejected_counts
                ON rejected_counts.product = products.product AND rejected_counts.shard = landed.shard
        )
        SELECT shard, product, landed, produced, rejected,
               produced IS NOT NULL AND landed = produced + rejected AS balanced,
               {STATE_SQL} AS state
        FROM rows ORDER BY shard, product
    """


def product_rejects_sql(rejects: str = "SELECT * FROM rejects") -> str:
    """The ``product_rejects`` view: each (shard, product, utterance) rejected by one of the product's
    stages once, under the reason of the earliest such stage (as :func:`speechdata.accounting.ledgers.product_ledger`);
    ``rejects``: the SELECT it reads (the ``rejects`` view, or one refresh's changed ledgers)."""
    stages = ", ".join(
        f"({_literal(line.name)}, {_literal(stage)}, {order})"
        for line in products.product_lines()
        for order, stage in enumerate(line.stages)
    )
    return f"""
        WITH stages(product, stage, stage_order) AS (VALUES {stages}),
        rejected_rows AS ({rejects})
        SELECT rejected_rows.shard, stages.product, rejected_rows.utt_id,
               arg_min(rejected_rows.reason, stages.stage_order) AS reason
        FROM rejected_rows JOIN stages ON rejected_rows.stage = stages.stage
        WHERE rejected_rows.utt_id IS NOT NULL
        GROUP BY rejected_rows.shard, stages.product, rejected_rows.utt_id
    """


REJECTS_BY_PRODUCT = """
    SELECT product, reason, count(*) AS utterances, count(DISTINCT shard) AS shards
    FROM product_rejects GROUP BY product, reason ORDER BY product, utterances DESC, reason"""
