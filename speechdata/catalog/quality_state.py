"""Per-shard quality aggregates kept in the catalog, so that a refresh recounts only the shards that changed.

``manifest_catalog`` shows, after every refresh, a histogram of each main quality signal per landed
language and the hours each product's quality filter lost per reason and language. Both used to be
queries over the ``quality``, ``quality_decisions`` and ``near_duplicates`` views (every shard's
files, at every refresh), and the histograms were binned in Python over every utterance's value.
The catalog now keeps, per shard:

* ``catalog_quality_shards`` (``shard``, ``inputs_sha256``): the digest of the path, size and
  fingerprint of the shard's ``quality.parquet``, ``quality_decisions.parquet`` and
  ``near_duplicates.parquet`` (any of them rewritten, added or removed: the shard is recounted);
* ``catalog_quality_bins`` (``shard``, ``language``, ``signal``, ``bin``, ``utterances``): how many
  of the shard's utterances with audio fall in each fixed-width bin of each :data:`SIGNAL_BIN_WIDTHS`
  signal (``bin`` = ``floor(value / width)``);
* ``catalog_quality_ranges`` (``shard``, ``language``, ``signal``, ``missing``, ``low``, ``high``):
  per language and signal, the utterances whose value is not measured or not finite, and the
  lowest and highest value (kept apart from the bins: one row, not one per bin);
* ``catalog_quality_hours_lost`` (``shard``, ``product``, ``reason``, ``language``, ``utterances``,
  ``duration_s``): the rows of the named query ``hours_lost_per_reason_per_language`` for the shard.

Every join of the named query is within one shard (``shard`` and ``utt_id``), so the sum of the
per-shard rows is the query's answer. The histograms (:data:`SIGNAL_HISTOGRAMS_FROM_STATE`) are
summed and re-binned in DuckDB into at most :data:`HISTOGRAM_BINS` ranges whose edges are bin
edges, so every count is exact; the minimum and maximum are the values'.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Collection, Mapping

import duckdb

from speechdata.catalog.accounting_state import stored_shards_sql
from speechdata.catalog.incremental import (
    SHARDS_PER_RECOUNT,
    ListedFile,
    in_batches,
    list_files,
    list_shard_files,
    locations_of,
)
from speechdata.catalog.quality import (
    DECISIONS_GLOB,
    NEAR_DUPLICATES_GLOB,
    QUALITY_GLOB,
    SHARD_FROM_QUALITY_PATH,
    SIGNAL_UNITS,
)
from speechdata.catalog.recount_scratch import insert_counted, recount_scratch
from speechdata.io.storage import DataRoot
from speechdata.quality.near_duplicates import REJECT_REASON

QUALITY_STATE_TABLES = {
    "catalog_quality_shards": "shard VARCHAR, inputs_sha256 VARCHAR",
    "catalog_quality_bins": "shard VARCHAR, language VARCHAR, signal VARCHAR, bin BIGINT, utterances BIGINT",
    "catalog_quality_ranges": (
        "shard VARCHAR, language VARCHAR, signal VARCHAR, missing BIGINT, low DOUBLE, high DOUBLE"
    ),
    "catalog_quality_hours_lost": (
        "shard VARCHAR, product VARCHAR, reason VARCHAR, language VARCHAR, utterances BIGINT, duration_s DOUBLE"
    ),
}

QUALITY_TOTAL_TABLES = {
    "catalog_quality_bin_totals": "language VARCHAR, signal VARCHAR, bin BIGINT, utterances BIGINT",
}
"""``catalog_quality_bins`` summed over the shards (``language``, ``signal``, ``bin``), kept as
shards are counted and forgotten (exact: counts), so that the histograms a refresh shows read one row
per bin in use, not one per shard and bin."""

SIGNAL_BIN_WIDTHS: dict[str, float] = {
    "snr_db": 1.0,
    "bandwidth_hz": 250.0,
    "speech_share": 0.02,
    "cer": 0.02,
    "speech_snr_db": 1.0,
    "dc_offset_ratio": 0.01,
    "mains_hum_share": 0.005,
    "chars_per_s": 0.5,
    "words_per_s": 0.1,
    "ngram_repetition": 0.02,
    "dnsmos_bak": 0.1,
    "dnsmos_ovrl": 0.1,
}
"""The width of a stored bin per histogram signal, in the signal's unit (:data:`SIGNAL_UNITS`): a
histogram's ranges are whole numbers of these."""
assert set(SIGNAL_BIN_WIDTHS) == set(SIGNAL_UNITS)

HISTOGRAM_BINS = 10
"""At most this many ranges per histogram (fewer when the values span fewer stored bins)."""

QUALITY = "quality"
DECISIONS = "decisions"
NEAR_DUPLICATES = "near_duplicates"
QUALITY_GLOBS = {QUALITY: QUALITY_GLOB, DECISIONS: DECISIONS_GLOB, NEAR_DUPLICATES: NEAR_DUPLICATES_GLOB}
_GLOBS = QUALITY_GLOBS
_TEMP = {QUALITY: "_quality_rows", DECISIONS: "_quality_decision_rows", NEAR_DUPLICATES: "_quality_near_dup_rows"}

HOURS_LOST = "hours_lost_per_reason_per_language"
HOURS_LOST_FROM_STATE = """
    SELECT product, reason, language, sum(utterances)::BIGINT AS utterances, sum(duration_s) / 3600.0 AS hours
    FROM catalog_quality_hours_lost GROUP BY 1, 2, 3 ORDER BY 1, hours DESC, 2, 3"""
"""The named query ``hours_lost_per_reason_per_language`` from the state (no file read)."""

_WIDTHS = ", ".join(f"('{signal}', {width!r}::DOUBLE)" for signal, width in SIGNAL_BIN_WIDTHS.items())

SIGNAL_HISTOGRAMS_FROM_STATE = f"""
    WITH widths(signal, width) AS (VALUES {_WIDTHS}),
    bins AS (SELECT language, signal, bin, utterances FROM catalog_quality_bin_totals),
    totals AS (
        SELECT language, signal, sum(missing)::BIGINT AS missing, min(low) AS low, max(high) AS high
        FROM catalog_quality_ranges GROUP BY ALL
    ),
    spans AS (
        SELECT t.language, t.signal, min(b.bin) AS first_bin,
               greatest(1, ceil((max(b.bin) - min(b.bin) + 1) / {HISTOGRAM_BINS})::BIGINT) AS per_range,
               (max(b.bin) - min(b.bin))
                   // greatest(1, ceil((max(b.bin) - min(b.bin) + 1) / {HISTOGRAM_BINS})::BIGINT) + 1 AS ranges,
               sum(b.utterances)::BIGINT AS values_counted, t.missing, t.low, t.high
        FROM totals AS t LEFT JOIN bins AS b ON b.language = t.language AND b.signal = t.signal
        GROUP BY t.language, t.signal, t.missing, t.low, t.high
    ),
    ranges AS (
        SELECT s.language, s.signal, r.position, s.first_bin + r.position * s.per_range AS start_bin, s.per_range
        FROM spans AS s, LATERAL (SELECT unnest(range(coalesce(s.ranges, 0))) AS position) AS r
    ),
    counted AS (
        SELECT r.language, r.signal, r.position, r.start_bin, r.per_range, coalesce(sum(b.utterances), 0)::BIGINT AS n
        FROM ranges AS r LEFT JOIN bins AS b
          ON b.language = r.language AND b.signal = r.signal
         AND b.bin >= r.start_bin AND b.bin < r.start_bin + r.per_range
        GROUP BY ALL
    )
    SELECT s.language, s.signal, c.position,
           c.start_bin * w.width AS range_start, (c.start_bin + c.per_range) * w.width AS range_end,
           c.n AS utterances, coalesce(s.values_counted, 0) AS values_counted, s.missing, s.low, s.high
    FROM spans AS s JOIN widths AS w ON w.signal = s.signal
    LEFT JOIN counted AS c ON c.language = s.language AND c.signal = s.signal
    ORDER BY s.language, s.signal, c.position"""
"""Per landed language and signal, its histogram: one row per range (``position``, ``range_start`` to
``range_end``, ``utterances``), with the totals repeated (``values_counted``, ``missing``: not measured
or not finite, ``low``, ``high``); a signal measured for no utterance has one row with ``position`` NULL."""


def list_quality_inputs(root: DataRoot, shards: Collection[str] | None = None) -> dict[str, dict[str, ListedFile]]:
    """Every shard's quality signals, decisions and near-duplicate list, by source (``shards``: theirs alone)."""
    if shards is not None:
        return {name: list_shard_files(root, glob, shards) for name, glob in _GLOBS.items()}
    return {name: list_files(root, glob) for name, glob in _GLOBS.items()}


def sync_quality(
    connection: duckdb.DuckDBPyConnection,
    root_uri: str,
    inputs: Mapping[str, Mapping[str, ListedFile]],
    shards: Collection[str] | None = None,
) -> int:
    """Bring the per-shard quality aggregates up to the listed ``inputs``; returns how many shards
    were recounted (``shards``: the inputs list those shards alone; no other shard's rows are touched)."""
    files_by_shard: dict[str, list[tuple[str, ListedFile]]] = defaultdict(list)
    regex = re.compile(SHARD_FROM_QUALITY_PATH)
    for name, files in inputs.items():
        for listed in files.values():
            found = regex.search("/" + listed.path)
            if found:
                files_by_shard[found.group(1)].append((name, listed))
    digests = {shard: _digest(files) for shard, files in files_by_shard.items()}
    stored = dict(connection.execute(*stored_shards_sql("catalog_quality_shards", shards)).fetchall())
    changed = sorted(shard for shard, digest in digests.items() if stored.get(shard) != digest)
    forget = sorted({*changed, *(shard for shard in stored if shard not in digests)})
    if forget:
        _add_to_bin_totals(connection, forget, -1)
        for table in QUALITY_STATE_TABLES:
            connection.execute(f"DELETE FROM {table} WHERE shard IN (SELECT unnest(?::VARCHAR[]))", [forget])
    turns = list(in_batches(changed, SHARDS_PER_RECOUNT))
    with recount_scratch(connection, len(turns)) as scratch:
        for turn in turns:
            paths: dict[str, list[str]] = defaultdict(list)
            for shard in turn:
                for name, listed in files_by_shard[shard]:
                    paths[name].append(listed.path)
            _count(connection, scratch, root_uri, paths)
    if changed:
        _add_to_bin_totals(connection, changed, 1)
        connection.execute(
            "INSERT INTO catalog_quality_shards SELECT unnest(?::VARCHAR[]), unnest(?::VARCHAR[])",
            [changed, [digests[shard] for shard in changed]],
        )
    return len(changed)


def _add_to_bin_totals(connection: duckdb.DuckDBPyConnection, shards: list[str], sign: int) -> None:
    """``catalog_quality_bin_totals`` with these shards' stored bins added (``sign`` 1) or taken
    out (-1, before their rows are deleted); a bin no utterance is left in is dropped."""
    connection.execute(
        "CREATE OR REPLACE TEMP TABLE _quality_bin_totals AS "
        "SELECT language, signal, bin, sum(n)::BIGINT AS utterances FROM ("
        "  SELECT language, signal, bin, utterances AS n FROM catalog_quality_bin_totals"
        "  UNION ALL"
        "  SELECT language, signal, bin, ? * utterances FROM catalog_quality_bins"
        "  WHERE shard IN (SELECT unnest(?::VARCHAR[]))"
        ") GROUP BY ALL HAVING sum(n) <> 0",
        [sign, shards],
    )
    connection.execute("DELETE FROM catalog_quality_bin_totals")
    connection.execute("INSERT INTO catalog_quality_bin_totals SELECT * FROM _quality_bin_totals")
    connection.execute("DROP TABLE _quality_bin_totals")


def _digest(files: list[tuple[str, ListedFile]]) -> str:
    lines = sorted(f"{name}\t{f.path}\t{f.size_bytes}\t{f.fingerprint}" for name, f in files)
    lines.append(f"bin widths\t{sorted(SIGNAL_BIN_WIDTHS.items())}")
    return hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest()


def _count(
    connection: duckdb.DuckDBPyConnection,
    scratch: duckdb.DuckDBPyConnection,
    root_uri: str,
    paths: Mapping[str, list[str]],
) -> None:
    """The bins and hours lost of the shards these files belong to, from these files alone: their
    rows read into temp tables of ``scratch`` (:func:`~speechdata.catalog.recount_scratch.recount_scratch`),
    their counts inserted into the state on ``connection``."""
    # No cleanup on failure: the scratch's temp tables go when it is closed, or the refresh's
    # transaction rolls them back with everything else.
    columns = {
        QUALITY: "utt_id VARCHAR, language VARCHAR, has_audio BOOLEAN, duration_s DOUBLE, "
        + ", ".join(f"{signal} DOUBLE" for signal in SIGNAL_BIN_WIDTHS),
        DECISIONS: "utt_id VARCHAR, product VARCHAR, reason VARCHAR",
        NEAR_DUPLICATES: "utt_id VARCHAR",
    }
    for name, table in _TEMP.items():
        scratch.execute(f"CREATE OR REPLACE TEMP TABLE {table} (shard VARCHAR, {columns[name]})")
        for batch in in_batches(locations_of(root_uri, paths.get(name, []))):
            present = {
                row[0]
                for row in scratch.execute(
                    "DESCRIBE SELECT * FROM read_parquet(?, union_by_name = true, hive_partitioning = false)", [batch]
                ).fetchall()
            }
            # A signal added after a shard's file was written reads as not measured (NULL), not as an error.
            names = ", ".join(
                column if column in present else f"CAST(NULL AS {kind}) AS {column}"
                for column, kind in (c.split() for c in columns[name].split(", "))
            )
            scratch.execute(
                f"INSERT INTO {table} SELECT regexp_extract(filename, ?, 1), {names} "
                "FROM read_parquet(?, union_by_name = true, hive_partitioning = false, filename = true)",
                [SHARD_FROM_QUALITY_PATH, batch],
            )
    quality = _TEMP[QUALITY]
    bins, ranges = [], []
    for signal, width in SIGNAL_BIN_WIDTHS.items():
        finite = f"isfinite({signal})"
        bins.append(
            f"SELECT shard, coalesce(language, '(none)'), '{signal}', floor({signal} / {width!r})::BIGINT, count(*) "
            f"FROM {quality} WHERE has_audio AND {finite} GROUP BY ALL"
        )
        ranges.append(
            f"SELECT shard, coalesce(language, '(none)'), '{signal}', count(*) FILTER (WHERE {finite} IS NOT TRUE), "
            f"min({signal}) FILTER (WHERE {finite}), max({signal}) FILTER (WHERE {finite}) "
            f"FROM {quality} WHERE has_audio GROUP BY ALL"
        )
    # One insert per table, every signal's rows in it: each insert from the scratch has a fixed cost.
    insert_counted(connection, "catalog_quality_bins", scratch, " UNION ALL ".join(bins))
    insert_counted(connection, "catalog_quality_ranges", scratch, " UNION ALL ".join(ranges))
    # The named query hours_lost_per_reason_per_language, per shard.
    insert_counted(
        connection,
        "catalog_quality_hours_lost",
        scratch,
        f"SELECT d.shard, d.product, coalesce(d.reason, '{REJECT_REASON}'), q.language, count(*), sum(q.duration_s) "
        f"FROM {_TEMP[DECISIONS]} AS d JOIN {quality} AS q ON q.shard = d.shard AND q.utt_id = d.utt_id "
        f"LEFT JOIN {_TEMP[NEAR_DUPLICATES]} AS n ON n.shard = d.shard AND n.utt_id = d.utt_id "
        "WHERE d.reason IS NOT NULL OR n.utt_id IS NOT NULL GROUP BY ALL",
    )
    for table in _TEMP.values():
        scratch.execute(f"DROP TABLE {table}")
