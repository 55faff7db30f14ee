"""Quality signals seen everywhere: the catalog's quality views and named queries, the export filters."""

import duckdb
import pyarrow as pa

from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.catalog.queries import NAMED_QUERIES, run_query
from speechdata.catalog.views import refresh_catalog
from speechdata.export.command import register
from speechdata.export.selection import SampleFilter, select_published_samples
from speechdata.io.storage import DataRoot
from speechdata.quality.decisions import excluded_utterances
from speechdata.quality.near_duplicates import NEAR_DUPLICATES_SCHEMA
from speechdata.quality.paths import near_duplicates, quality_decisions, quality_signals
from speechdata.quality.schema import QUALITY_DECISIONS_SCHEMA, QUALITY_SIGNALS_SCHEMA

SIGNALS = {
    # utt_id: (landed language, text LID language, cer, snr_db, bandwidth_hz, duration_s)
    "clean": ("en", "en", 0.05, 40.0, 11000.0, 3600.0),
    "noisy": ("en", "en", 0.10, 4.0, 11000.0, 1800.0),
    "wrong_label": ("de", "fr", 0.20, 30.0, 11000.0, 900.0),
    "unaligned": ("en", "en", None, 30.0, 4000.0, 900.0),
}


def build_root(tmp_path) -> DataRoot:
    root = DataRoot(str(tmp_path / "data"))
    rows = [
        {
            "utt_id": utt_id,
            "language": landed,
            "has_audio": True,
            "duration_s": duration,
            "text_language": text_language,
            "text_language_confidence": 0.99,
            "cer": cer,
            "snr_db": snr,
            "bandwidth_hz": bandwidth,
        }
        for utt_id, (landed, text_language, cer, snr, bandwidth, duration) in SIGNALS.items()
    ]
    root.write_parquet(quality_signals("s1"), pa.Table.from_pylist(rows, schema=QUALITY_SIGNALS_SCHEMA))
    decisions = [
        {"utt_id": "clean", "product": "bridge", "reason": None, "detail": None, "policy_sha256": "d"},
        {"utt_id": "noisy", "product": "bridge", "reason": "low_snr", "detail": "x", "policy_sha256": "d"},
        {
            "utt_id": "wrong_label",
            "product": "bridge",
            "reason": "language_mismatch",
            "detail": "x",
            "policy_sha256": "d",
        },
        {"utt_id": "unaligned", "product": "bridge", "reason": "narrowband", "detail": "x", "policy_sha256": "d"},
        {"utt_id": "noisy", "product": "asr", "reason": "low_snr", "detail": "x", "policy_sha256": "d"},
    ]
    root.write_parquet(quality_decisions("s1"), pa.Table.from_pylist(decisions, schema=QUALITY_DECISIONS_SCHEMA))
    manifest = [
        {
            "key": utt_id,
            "shard": "s1",
            "tar_url": "bridge/s1/x.tar",
            "offset": i,
            "size": 1,
            "duration_s": 1.0,
            "n_frames": 1,
            "n_tokens": 1,
            "language": landed,
            "extra": "{}",
        }
        for i, (utt_id, (landed, *_)) in enumerate(SIGNALS.items())
    ]
    manifest.append({**manifest[0], "key": "no_quality_row", "offset": 9})
    root.write_parquet(manifest_path("s1"), pa.Table.from_pylist(manifest, schema=MANIFEST_COLUMNS))
    return root


def test_the_catalog_counts_hours_lost_per_reason_per_language(tmp_path):
    root = build_root(tmp_path)
    connection = duckdb.connect()
    refresh_catalog(connection, root.url)
    lost = run_query(connection, NAMED_QUERIES["hours_lost_per_reason_per_language"]).to_pylist()
    assert [(r["product"], r["reason"], r["language"], r["hours"]) for r in lost] == [
        ("asr", "low_snr", "en", 0.5),
        ("bridge", "low_snr", "en", 0.5),
        ("bridge", "language_mismatch", "de", 0.25),
        ("bridge", "narrowband", "en", 0.25),
    ]
    assert run_query(connection, "SELECT DISTINCT shard FROM quality").to_pylist() == [{"shard": "s1"}]
    disagreements = run_query(connection, NAMED_QUERIES["language_label_disagreements"]).to_pylist()
    assert [(r["landed"], r["text_language"]) for r in disagreements] == [("de", "fr")]


def test_hours_lost_count_near_duplicates_for_every_product_unless_a_quality_reason_applies(tmp_path):
    root = build_root(tmp_path)
    # Kept by the bridge's quality policy: lost as a near duplicate. "noisy" fails low_snr on its own:
    # the quality reason wins, as the product stages decide (excluded_utterances).
    root.write_parquet(
        near_duplicates("s1"),
        pa.Table.from_pylist(
            [
                {
                    "utt_id": utt_id,
                    "representative_shard": "s0",
                    "representative_utt": "a",
                    "kind": "exact_audio",
                    "similarity": 1.0,
                }
                for utt_id in ("clean", "noisy")
            ],
            schema=NEAR_DUPLICATES_SCHEMA,
        ),
    )
    connection = duckdb.connect()
    refresh_catalog(connection, root.url)
    lost = run_query(connection, NAMED_QUERIES["hours_lost_per_reason_per_language"]).to_pylist()
    assert [(r["product"], r["reason"], r["language"], r["hours"]) for r in lost] == [
        ("asr", "low_snr", "en", 0.5),
        ("bridge", "near_duplicate", "en", 1.0),
        ("bridge", "low_snr", "en", 0.5),
        ("bridge", "language_mismatch", "de", 0.25),
        ("bridge", "narrowband", "en", 0.25),
    ]
    for product in ("bridge", "asr"):
        excluded = excluded_utterances(root, "s1", product)
        assert excluded["noisy"][0] == "low_snr"
    assert excluded_utterances(root, "s1", "bridge")["clean"][0] == "near_duplicate"
    assert run_query(connection, "SELECT shard, utt_id FROM near_duplicates ORDER BY utt_id").to_pylist() == [
        {"shard": "s1", "utt_id": "clean"},
        {"shard": "s1", "utt_id": "noisy"},
    ]


def test_the_quality_views_exist_before_any_quality_file(tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    root.write_bytes("placeholder", b"")
    connection = duckdb.connect()
    refresh_catalog(connection, root.url)
    assert run_query(connection, "SELECT count(*) AS n FROM quality").to_pylist() == [{"n": 0}]
    assert run_query(connection, NAMED_QUERIES["hours_lost_per_reason_per_language"]).num_rows == 0


def test_export_quality_filters_keep_only_measured_samples_that_pass(tmp_path):
    root = build_root(tmp_path)

    def keys(**bounds):
        return select_published_samples(root, SampleFilter(**bounds))["key"].to_pylist()

    assert len(keys()) == 5  # no quality filter: every published sample, measured or not
    assert keys(min_snr_db=10.0) == ["clean", "wrong_label", "unaligned"]
    assert keys(max_cer=0.15) == ["clean", "noisy"]  # unaligned has no CER: unmeasured fails
    assert keys(language_confirmed=True) == ["clean", "noisy", "unaligned"]
    assert keys(min_bandwidth_hz=5000.0, min_snr_db=10.0, language_confirmed=True) == ["clean"]


def test_the_export_command_takes_the_quality_filters():
    import argparse

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(
        ["export", "nemo", "--out", "/tmp/x", "--max-cer", "0.2", "--min-snr", "15", "--language-confirmed"]
    )
    assert (args.max_cer, args.min_snr, args.language_confirmed, args.min_mos) == (0.2, 15.0, True, None)
