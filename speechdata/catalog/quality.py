"""The catalog's quality views: every shard's signals and per-product decisions, and named queries.

``quality`` reads ``shards/*/quality.parquet`` and ``quality_decisions`` reads
``shards/*/quality_decisions.parquet``, each with the ``shard`` taken from the path (docs/quality.md);
with no such file yet, each is an empty view with the right columns.
"""

from __future__ import annotations

import pyarrow as pa

from speechdata.catalog.root_paths import under_root
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.schema import QUALITY_DECISIONS_SCHEMA, QUALITY_SIGNALS_SCHEMA

# Fixed file names: a writer's ``._tmp-*`` file beside them never matches.
QUALITY_GLOB = f"{layout.SHARDS}/*/quality.parquet"
DECISIONS_GLOB = f"{layout.SHARDS}/*/quality_decisions.parquet"
_SHARD_FROM_QUALITY_PATH = r"(?:^|/)shards/([^/]+)/quality(?:_decisions)?\.parquet$"

_DUCKDB_TYPES = {pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN"}

QUALITY_NAMED_QUERIES: dict[str, str] = {
    "hours_lost_per_reason_per_language": """
        SELECT d.product, d.reason, q.language, count(*) AS utterances, sum(q.duration_s) / 3600.0 AS hours
        FROM quality_decisions AS d JOIN quality AS q ON q.shard = d.shard AND q.utt_id = d.utt_id
        WHERE d.reason IS NOT NULL
        GROUP BY d.product, d.reason, q.language ORDER BY d.product, hours DESC, d.reason, q.language""",
    "quality_by_language": """
        SELECT language, count(*) AS utterances, sum(duration_s) / 3600.0 AS hours,
               median(snr_db) AS median_snr_db, median(bandwidth_hz) AS median_bandwidth_hz,
               avg(speech_share) AS mean_speech_share, avg(cer) AS mean_cer, avg(mos) AS mean_mos,
               avg(CASE WHEN text_language = split_part(lower(replace(language, '_', '-')), '-', 1)
                        THEN 1.0 ELSE 0.0 END) AS text_language_agreement
        FROM quality WHERE has_audio GROUP BY language ORDER BY hours DESC, language""",
    "language_label_disagreements": """
        SELECT language AS landed, text_language, count(*) AS utterances,
               avg(text_language_confidence) AS mean_confidence
        FROM quality
        WHERE text_language IS NOT NULL
          AND text_language <> split_part(lower(replace(language, '_', '-')), '-', 1)
        GROUP BY language, text_language ORDER BY utterances DESC, landed, text_language""",
}
"""Quality questions asked often, by name (merged into :data:`speechdata.catalog.queries.NAMED_QUERIES`)."""


SIGNAL_UNITS: dict[str, str] = {"snr_db": "dB", "bandwidth_hz": "Hz", "speech_share": "share", "cer": "rate"}
"""The main quality signals shown per language (the catalog's histograms), each with its unit."""

SIGNALS_PER_LANGUAGE = f"""
    SELECT coalesce(language, '(none)') AS language, count(*) AS utterances,
           {", ".join(f'list("{name}") AS "{name}"' for name in SIGNAL_UNITS)}
    FROM quality WHERE has_audio GROUP BY 1 ORDER BY 1"""
"""One row per landed language: every measured utterance's value of each :data:`SIGNAL_UNITS`
signal, nulls kept (a signal not measured, e.g. ``cer`` of an utterance the aligner skipped).

Reads every shard's ``quality.parquet`` (four columns): about 32 bytes per utterance."""


def quality_view_definitions(root: DataRoot, location: str) -> list[tuple[str, str]]:
    """(view, SELECT) for ``quality`` and ``quality_decisions``."""
    definitions = []
    for view, glob, schema in (
        ("quality", QUALITY_GLOB, QUALITY_SIGNALS_SCHEMA),
        ("quality_decisions", DECISIONS_GLOB, QUALITY_DECISIONS_SCHEMA),
    ):
        if root.glob(glob):
            columns = ", ".join(f'"{f.name}"' for f in schema)
            sql = (
                f"SELECT regexp_extract(filename, '{_SHARD_FROM_QUALITY_PATH}', 1) AS shard, {columns} "
                f"FROM read_parquet({under_root(glob, location)}, union_by_name = true, "
                "hive_partitioning = false, filename = true)"
            )
        else:
            nulls = ", ".join(f'CAST(NULL AS {_DUCKDB_TYPES[f.type]}) AS "{f.name}"' for f in schema)
            sql = f"SELECT CAST(NULL AS VARCHAR) AS shard, {nulls} WHERE false"
        definitions.append((view, sql))
    return definitions
