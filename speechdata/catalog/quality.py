"""The catalog's quality views: every shard's signals and per-product decisions, and named queries.

``quality`` reads ``shards/*/quality.parquet``, ``quality_decisions`` reads
``shards/*/quality_decisions.parquet`` and ``near_duplicates`` reads
``shards/*/near_duplicates.parquet``, each with the ``shard`` taken from the path (docs/quality.md,
docs/near-duplicates.md); with no such file yet, each is an empty view with the right columns.
"""

from __future__ import annotations

import pyarrow as pa

from speechdata.catalog.incremental import has_files
from speechdata.catalog.root_paths import under_root
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.near_duplicates import NEAR_DUPLICATES_SCHEMA, REJECT_REASON
from speechdata.quality.schema import QUALITY_DECISIONS_SCHEMA, QUALITY_SIGNALS_SCHEMA

# Fixed file names: a writer's ``._tmp-*`` file beside them never matches.
QUALITY_GLOB = f"{layout.SHARDS}/*/quality.parquet"
DECISIONS_GLOB = f"{layout.SHARDS}/*/quality_decisions.parquet"
NEAR_DUPLICATES_GLOB = f"{layout.SHARDS}/*/near_duplicates.parquet"
SHARD_FROM_QUALITY_PATH = r"(?:^|/)shards/([^/]+)/(?:quality|quality_decisions|near_duplicates)\.parquet$"

_DUCKDB_TYPES = {pa.string(): "VARCHAR", pa.float64(): "DOUBLE", pa.int64(): "BIGINT", pa.bool_(): "BOOLEAN"}
_DUCKDB_TYPES[pa.list_(pa.float32(), 256)] = "FLOAT[256]"  # the speaker embedding

QUALITY_NAMED_QUERIES: dict[str, str] = {
    # What each product leaves out, as its stages do (speechdata.quality.decisions): the quality
    # reason, else the near-duplicate stage's for an utterance it listed.
    "hours_lost_per_reason_per_language": f"""
        SELECT d.product, coalesce(d.reason, '{REJECT_REASON}') AS reason, q.language,
               count(*) AS utterances, sum(q.duration_s) / 3600.0 AS hours
        FROM quality_decisions AS d JOIN quality AS q ON q.shard = d.shard AND q.utt_id = d.utt_id
        LEFT JOIN near_duplicates AS n ON n.shard = d.shard AND n.utt_id = d.utt_id
        WHERE d.reason IS NOT NULL OR n.utt_id IS NOT NULL
        GROUP BY 1, 2, 3 ORDER BY 1, hours DESC, 2, 3""",
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


SIGNAL_UNITS: dict[str, str] = {
    "snr_db": "dB",
    "bandwidth_hz": "Hz",
    "speech_share": "share",
    "cer": "rate",
    "speech_snr_db": "dB",
    "dc_offset_ratio": "mean/RMS",
    "mains_hum_share": "share",
    "chars_per_s": "letters/s",
    "words_per_s": "words/s",
    "ngram_repetition": "share",
    "dnsmos_bak": "MOS",
    "dnsmos_ovrl": "MOS",
}
"""The main quality signals shown per language (the catalog's histograms,
:mod:`speechdata.catalog.quality_state`), each with its unit."""


def quality_view_definitions(root: DataRoot, location: str) -> list[tuple[str, str]]:
    """(view, SELECT) for ``quality``, ``quality_decisions`` and ``near_duplicates``."""
    definitions = []
    for view, glob, schema in (
        ("quality", QUALITY_GLOB, QUALITY_SIGNALS_SCHEMA),
        ("quality_decisions", DECISIONS_GLOB, QUALITY_DECISIONS_SCHEMA),
        ("near_duplicates", NEAR_DUPLICATES_GLOB, NEAR_DUPLICATES_SCHEMA),
    ):
        if has_files(root, glob):
            columns = ", ".join(f'"{f.name}"' for f in schema)
            # UNION ALL BY NAME with an empty row of every column: a column no file has yet (files
            # written before a signal existed) reads as NULL instead of failing the view.
            typed = ", ".join(f'CAST(NULL AS {_DUCKDB_TYPES[f.type]}) AS "{f.name}"' for f in schema)
            sql = (
                f"SELECT regexp_extract(filename, '{SHARD_FROM_QUALITY_PATH}', 1) AS shard, {columns} "
                f"FROM (SELECT * FROM read_parquet({under_root(glob, location)}, union_by_name = true, "
                f"hive_partitioning = false, filename = true) UNION ALL BY NAME SELECT {typed} WHERE false)"
            )
        else:
            nulls = ", ".join(f'CAST(NULL AS {_DUCKDB_TYPES[f.type]}) AS "{f.name}"' for f in schema)
            sql = f"SELECT CAST(NULL AS VARCHAR) AS shard, {nulls} WHERE false"
        definitions.append((view, sql))
    return definitions
