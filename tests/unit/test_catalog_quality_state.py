"""The catalog's per-shard quality aggregates give what the views over every shard's files give.

The histograms ``manifest_catalog`` shows are binned by DuckDB from per-shard counts: every value is
counted once, in the range that holds it; the hours lost are the named query's rows; a shard changed
or removed is recounted or forgotten, and nothing else is read again.
"""

import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from speechdata.catalog.quality import QUALITY_NAMED_QUERIES
from speechdata.catalog.quality_state import (
    HOURS_LOST,
    HOURS_LOST_FROM_STATE,
    SIGNAL_BIN_WIDTHS,
    SIGNAL_HISTOGRAMS_FROM_STATE,
)
from speechdata.catalog.queries import run_query
from speechdata.catalog.views import refresh_catalog
from speechdata.quality.near_duplicates import NEAR_DUPLICATES_SCHEMA
from speechdata.quality.paths import near_duplicates, quality_decisions, quality_signals
from speechdata.quality.schema import QUALITY_DECISIONS_SCHEMA, QUALITY_SIGNALS_SCHEMA


def write_shard(root, shard: str, seed: int, languages=("en", "de"), rows: int = 60) -> list[dict]:
    """A shard's quality signals (some not measured, one infinite), decisions and near-duplicate list."""
    rng = np.random.default_rng(seed)
    signals = []
    for i in range(rows):
        cer = None if i % 7 == 0 else float(rng.gamma(1.0, 0.1))
        signals.append(
            {
                "utt_id": f"{shard}-{i}",
                "language": languages[i % len(languages)] if i % 11 else None,
                "has_audio": i % 13 != 0,
                "duration_s": float(rng.uniform(0.5, 20.0)),
                "snr_db": math.inf if i == 5 else float(rng.normal(20, 10)),
                "bandwidth_hz": float(rng.choice([3400.0, 8000.0, 11025.0])),
                "speech_share": float(rng.random()),
                "cer": cer,
            }
        )
        for signal, width in SIGNAL_BIN_WIDTHS.items():  # the other histogram signals: spread over ~40 bins
            signals[-1].setdefault(signal, None if i % 17 == 0 else float(rng.uniform(0.0, 40 * width)))
    root.write_parquet(quality_signals(shard), pa.Table.from_pylist(signals, schema=QUALITY_SIGNALS_SCHEMA))
    decisions = [
        {
            "utt_id": row["utt_id"],
            "product": product,
            "reason": ("low_snr" if i % 3 == 0 else "no_speech" if i % 5 == 0 else None),
            "detail": None,
            "policy_sha256": "d",
        }
        for i, row in enumerate(signals)
        for product in ("bridge", "asr")
    ]
    root.write_parquet(quality_decisions(shard), pa.Table.from_pylist(decisions, schema=QUALITY_DECISIONS_SCHEMA))
    copies = [
        {
            "utt_id": row["utt_id"],
            "representative_shard": shard,
            "representative_utt": "x",
            "kind": "exact_audio",
            "similarity": 1.0,
        }
        for row in signals[1::9]
    ]
    root.write_parquet(near_duplicates(shard), pa.Table.from_pylist(copies, schema=NEAR_DUPLICATES_SCHEMA))
    return signals


def histograms(connection) -> dict[tuple[str, str], list[dict]]:
    found: dict[tuple[str, str], list[dict]] = {}
    for row in run_query(connection, SIGNAL_HISTOGRAMS_FROM_STATE).to_pylist():
        found.setdefault((row["language"], row["signal"]), []).append(row)
    return found


def check_histograms(connection, signals: list[dict]) -> None:
    """Every measured, finite value of each signal in exactly the range that holds it; the rest counted apart."""
    found = histograms(connection)
    measured = [row for row in signals if row["has_audio"]]
    languages = {row["language"] or "(none)" for row in measured}
    assert set(found) == {(language, signal) for language in languages for signal in SIGNAL_BIN_WIDTHS}
    for (language, signal), ranges in found.items():
        values = [row[signal] for row in measured if (row["language"] or "(none)") == language]
        finite = [v for v in values if v is not None and math.isfinite(v)]
        first = ranges[0]
        assert first["values_counted"] == len(finite) and first["missing"] == len(values) - len(finite)
        assert (first["low"], first["high"]) == (min(finite), max(finite))
        assert 1 <= len(ranges) <= 10
        assert sum(r["utterances"] for r in ranges) == len(finite)
        for r in ranges:
            inside = [v for v in finite if r["range_start"] <= v < r["range_end"]]
            assert r["utterances"] == len(inside), (language, signal, r)
        assert all(a["range_end"] == pytest.approx(b["range_start"]) for a, b in zip(ranges, ranges[1:]))


def state_and_views_agree(connection) -> None:
    state = run_query(connection, HOURS_LOST_FROM_STATE).to_pylist()
    views = run_query(connection, QUALITY_NAMED_QUERIES[HOURS_LOST]).to_pylist()
    assert state and len(state) == len(views)
    for a, b in zip(state, views):
        assert {k: v for k, v in a.items() if k != "hours"} == {k: v for k, v in b.items() if k != "hours"}
        assert a["hours"] == pytest.approx(b["hours"], rel=1e-12)


def test_histograms_and_hours_lost_from_the_state_equal_the_views_and_follow_every_change(data_root):
    one = write_shard(data_root, "shard-1", seed=1)
    two = write_shard(data_root, "shard-2", seed=2, languages=("en", "fr"))
    connection = duckdb.connect()
    summary = refresh_catalog(connection, data_root.url)
    assert summary.quality_shards_read == 2
    check_histograms(connection, one + two)
    state_and_views_agree(connection)

    # Nothing changed: nothing is recounted.
    assert refresh_catalog(connection, data_root.url).quality_shards_read == 0
    # One shard's near-duplicate list rewritten: that shard alone is recounted.
    data_root.write_parquet(near_duplicates("shard-2"), pa.Table.from_pylist([], schema=NEAR_DUPLICATES_SCHEMA))
    assert refresh_catalog(connection, data_root.url).quality_shards_read == 1
    state_and_views_agree(connection)
    # A shard rebuilt with other values, and a shard removed.
    three = write_shard(data_root, "shard-1", seed=3, languages=("es",), rows=25)
    data_root.fs.rm(data_root.path("shards/shard-2"), recursive=True)
    assert refresh_catalog(connection, data_root.url).quality_shards_read == 1
    check_histograms(connection, three)
    state_and_views_agree(connection)
    # A full refresh from scratch gives the same state.
    fresh = duckdb.connect()
    refresh_catalog(fresh, data_root.url, full=True)
    for sql in (SIGNAL_HISTOGRAMS_FROM_STATE, HOURS_LOST_FROM_STATE):
        assert run_query(fresh, sql).to_pylist() == run_query(connection, sql).to_pylist()


def test_a_signal_never_measured_is_counted_as_missing_not_binned(data_root):
    signals = write_shard(data_root, "shard-1", seed=1, languages=("en",), rows=10)
    table = data_root.read_parquet(quality_signals("shard-1"))
    unmeasured = table.set_column(table.schema.get_field_index("cer"), "cer", pa.nulls(table.num_rows, pa.float64()))
    data_root.write_parquet(quality_signals("shard-1"), unmeasured)
    connection = duckdb.connect()
    refresh_catalog(connection, data_root.url)
    measured = sum(1 for row in signals if row["has_audio"] and row["language"])
    [row] = histograms(connection)[("en", "cer")]
    assert row["position"] is None and row["values_counted"] == 0 and row["missing"] == measured


def test_a_shard_written_before_a_signal_existed_counts_it_as_not_measured(data_root):
    """Files from before the newer signals (no such columns) are read, their new signals missing."""
    older = pa.schema(
        [f for f in QUALITY_SIGNALS_SCHEMA if f.name in ("utt_id", "language", "has_audio", "duration_s", "snr_db")]
    )
    rows = [
        {"utt_id": f"u{i}", "language": "en", "has_audio": True, "duration_s": 2.0, "snr_db": 20.0 + i}
        for i in range(4)
    ]
    data_root.write_parquet(quality_signals("old"), pa.Table.from_pylist(rows, schema=older))
    connection = duckdb.connect()
    refresh_catalog(connection, data_root.url)
    found = histograms(connection)
    assert sum(r["utterances"] for r in found[("en", "snr_db")]) == 4
    assert found[("en", "dnsmos_bak")][0]["missing"] == 4
    assert found[("en", "dnsmos_bak")][0]["values_counted"] == 0
