import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.bridge.manifest import MANIFEST_COLUMNS, manifest_path
from speechdata.catalog.display import format_table
from speechdata.catalog.exports import export_tar_urls
from speechdata.catalog.queries import NAMED_QUERIES, run_query, select_samples
from speechdata.catalog.views import CATALOG_FILE, SUMMARY_TABLES, refresh_catalog
from speechdata.io import layout

REPO_ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "'; DROP TABLE samples; --"


def write_manifest(data_root, shard, rows, extra=None):
    """rows: (utt, language, country, duration_s, alignment_score, text); extra: column -> (type, values)."""
    extra = extra or {}
    columns = {
        "key": [f"{shard}_{r[0]}" for r in rows],
        "shard": [shard] * len(rows),
        "tar_url": [f"file:///data/bridge/{shard}-{i // 2:06d}.tar" for i in range(len(rows))],
        "offset": [i * 1024 for i in range(len(rows))],
        "size": [1024] * len(rows),
        "duration_s": [r[3] for r in rows],
        "n_frames": [int(r[3] * 12.5) for r in rows],
        "n_tokens": [5] * len(rows),
        "language": [r[1] for r in rows],
        "country": [r[2] for r in rows],
        "source": ["hand"] * len(rows),
        "text": [r[5] for r in rows],
        "text_source": ["landed"] * len(rows),
        "asr_confidence": [None] * len(rows),
        "alignment_score": [r[4] for r in rows],
        "zero_duration_token_share": [0.0] * len(rows),
        "clipped_share": [0.0] * len(rows),
        "extra": ["{}"] * len(rows),
    }
    schema = MANIFEST_COLUMNS
    for name, (dtype, values) in extra.items():
        columns[name] = values
        schema = schema.append(pa.field(name, dtype))
    data_root.write_parquet(manifest_path(shard), pa.table(columns, schema=schema))


def write_rejects(data_root, shard, stage, utt_ids, reason="no_model"):
    table = rejects_table(Reject(u, stage, reason, f"detail of {u}") for u in utt_ids)
    data_root.write_parquet(layout.rejects(shard, stage), table)


SHARD_A = [
    ("u1", "en", "us", 3.6, -1.0, "hello there"),
    ("u2", "en", "us", 7.2, -3.0, "general kenobi"),
    ("u3", "de", "de", 1.8, -0.5, None),
]
SHARD_B = [
    ("v1", "en", "gb", 10.8, -2.0, "tea"),
    ("v2", "en", "gb", 0.6, -1.5, "biscuit"),
]


@pytest.fixture
def populated(data_root):
    write_manifest(data_root, "shard-a", SHARD_A, extra={"snr_db": (pa.float64(), [20.0, 15.0, 30.0])})
    write_manifest(data_root, "shard-b", SHARD_B, extra={"speaker": (pa.string(), ["s1", "s2"])})
    write_rejects(data_root, "shard-a", "ingest", ["u9"], reason="unreadable_audio")
    write_rejects(data_root, "shard-a", "alignment", ["u9", "u8"])
    # A ledger being written (or left by a crash) must not break or join the view.
    data_root.write_bytes(f"{layout.rejects_dir('shard-b')}/._tmp-0123456789ab-alignment.parquet", b"half a file")
    return data_root


@pytest.fixture
def connection(data_root):
    data_root.fs.makedirs(data_root.root, exist_ok=True)
    con = duckdb.connect(data_root.path(CATALOG_FILE))
    yield con
    con.close()


def scalar(connection, sql, params=None):
    return connection.execute(sql, params or []).fetchone()[0]


def test_refresh_summarizes_every_manifest_and_ledger(populated, connection):
    summary = refresh_catalog(connection, populated.url)

    assert (summary.manifest_files, summary.rejects_files) == (2, 2)
    assert (summary.shards, summary.samples) == (2, 5)
    assert summary.hours == pytest.approx((3.6 + 7.2 + 1.8 + 10.8 + 0.6) / 3600)
    assert (summary.rejects, summary.rejected_utterances) == (3, 2)
    assert summary.languages == ["de", "en"]
    assert summary.countries == ["de", "gb", "us"]

    by_language = {r["language"]: r for r in run_query(connection, "SELECT * FROM hours_by_language").to_pylist()}
    assert by_language["en"]["samples"] == 4
    assert by_language["en"]["hours"] == pytest.approx((3.6 + 7.2 + 10.8 + 0.6) / 3600)
    assert by_language["en"]["mean_alignment_score"] == pytest.approx((-1.0 - 3.0 - 2.0 - 1.5) / 4)
    assert by_language["en"]["shards"] == 2
    by_country = {
        r["country"]: r["samples"] for r in run_query(connection, "SELECT * FROM hours_by_country").to_pylist()
    }
    assert by_country == {"us": 2, "de": 1, "gb": 2}
    by_shard = run_query(connection, "SELECT shard, samples, rejected_utterances FROM hours_by_shard ORDER BY shard")
    assert by_shard.to_pylist() == [
        {"shard": "shard-a", "samples": 3, "rejected_utterances": 2},
        {"shard": "shard-b", "samples": 2, "rejected_utterances": 0},
    ]


def test_pseudo_labels_are_counted_per_shard_and_language_even_beside_manifests_older_than_the_column(
    data_root, connection
):
    write_manifest(data_root, "shard-a", SHARD_A)
    labelled = pa.table(
        {"text_source": ["asr", "landed", "asr"], "asr_confidence": pa.array([0.8, None, 0.6], pa.float32())}
    )
    manifest = data_root.read_parquet(manifest_path("shard-a"))
    for name in labelled.column_names:
        manifest = manifest.set_column(manifest.column_names.index(name), name, labelled[name])
    data_root.write_parquet(manifest_path("shard-a"), manifest)
    write_manifest(data_root, "shard-b", SHARD_B)
    old = data_root.read_parquet(manifest_path("shard-b")).drop_columns(["text_source", "asr_confidence"])
    data_root.write_parquet(manifest_path("shard-b"), old)  # written before pseudo-labels existed
    refresh_catalog(connection, data_root.url)
    by_shard = run_query(connection, "SELECT shard, pseudo_labels FROM hours_by_shard ORDER BY shard").to_pylist()
    assert by_shard == [{"shard": "shard-a", "pseudo_labels": 2}, {"shard": "shard-b", "pseudo_labels": 0}]
    by_language = {
        r["language"]: r["pseudo_labels"] for r in run_query(connection, "SELECT * FROM hours_by_language").to_pylist()
    }
    assert by_language == {"en": 1, "de": 1}
    per_shard = run_query(connection, NAMED_QUERIES["pseudo_labels_per_shard"]).to_pylist()
    assert [(r["shard"], r["language"], r["samples"], r["pseudo_labels"]) for r in per_shard] == [
        ("shard-a", "de", 1, 1),
        ("shard-a", "en", 2, 1),
        ("shard-b", "en", 2, 0),
    ]
    assert per_shard[0]["mean_asr_confidence"] == pytest.approx(0.6)

    write_manifest(data_root, "shard-a", SHARD_A)
    data_root.write_parquet(
        manifest_path("shard-a"),
        data_root.read_parquet(manifest_path("shard-a")).drop_columns(["text_source", "asr_confidence"]),
    )
    refresh_catalog(connection, data_root.url)  # every manifest older than the column: the views still read
    assert scalar(connection, "SELECT sum(pseudo_labels) FROM hours_by_shard") == 0


def test_samples_view_unions_the_shards_differing_extra_columns(populated, connection):
    refresh_catalog(connection, populated.url)
    rows = run_query(connection, "SELECT key, snr_db, speaker FROM samples ORDER BY key").to_pylist()
    assert rows[0] == {"key": "shard-a_u1", "snr_db": 20.0, "speaker": None}
    assert rows[-1] == {"key": "shard-b_v2", "snr_db": None, "speaker": "s2"}


def test_rejects_view_takes_the_shard_from_the_path(populated, connection):
    refresh_catalog(connection, populated.url)
    rows = run_query(connection, "SELECT shard, utt_id, stage, reason FROM rejects ORDER BY stage, utt_id").to_pylist()
    assert rows == [
        {"shard": "shard-a", "utt_id": "u8", "stage": "alignment", "reason": "no_model"},
        {"shard": "shard-a", "utt_id": "u9", "stage": "alignment", "reason": "no_model"},
        {"shard": "shard-a", "utt_id": "u9", "stage": "ingest", "reason": "unreadable_audio"},
    ]
    by_reason = run_query(connection, NAMED_QUERIES["rejects_by_reason"]).to_pylist()
    assert by_reason[0] == {"stage": "alignment", "reason": "no_model", "rejects": 2, "utterances": 2, "shards": 1}


def test_summaries_never_lag_what_they_summarize(populated, connection):
    refresh_catalog(connection, populated.url)
    write_manifest(populated, "shard-c", [("w1", "fr", "fr", 36.0, -1.0, "bonjour")])

    # Views over the live files: a committed manifest is summarized at once, no refresh needed.
    assert scalar(connection, "SELECT count(*) FROM hours_by_shard") == 3
    summary = refresh_catalog(connection, populated.url)
    assert summary.shards == 3 and "fr" in summary.languages
    assert scalar(connection, "SELECT samples FROM hours_by_language WHERE language = 'fr'") == 1
    assert scalar(connection, "SELECT count(*) FROM samples WHERE shard = 'shard-c'") == 1


def test_a_removed_shard_goes_away_after_refresh(populated, connection):
    refresh_catalog(connection, populated.url)
    populated.fs.rm(populated.path("manifests/shard=shard-b"), recursive=True)

    summary = refresh_catalog(connection, populated.url)
    assert (summary.shards, summary.samples) == (1, 3)
    assert summary.countries == ["de", "us"]
    assert scalar(connection, "SELECT count(*) FROM samples WHERE shard = 'shard-b'") == 0
    assert scalar(connection, "SELECT count(*) FROM hours_by_country WHERE country = 'gb'") == 0


def test_empty_root_gives_empty_views_with_the_manifest_columns(data_root, connection):
    summary = refresh_catalog(connection, data_root.url)
    assert (summary.shards, summary.samples, summary.hours, summary.rejects) == (0, 0, 0.0, 0)
    assert summary.languages == [] and summary.countries == []
    samples = run_query(connection, "SELECT * FROM samples")
    assert samples.num_rows == 0 and samples.column_names == MANIFEST_COLUMNS.names
    assert run_query(connection, "SELECT * FROM rejects").column_names == [
        "shard",
        "utt_id",
        "stage",
        "reason",
        "detail",
    ]
    for name in NAMED_QUERIES:
        assert run_query(connection, NAMED_QUERIES[name]).num_rows == 0
    assert select_samples(connection, languages=["en"]).num_rows == 0


def land_ids(data_root, shard, utt_ids):
    table = pa.table({"utt_id": utt_ids, "audio_path": [f"{u}.wav" for u in utt_ids]})
    data_root.write_parquet(layout.landing_metadata(shard), table)


def test_a_shard_with_only_rejects_is_accounted_for(data_root, connection):
    land_ids(data_root, "shard-z", ["a", "b", "c"])
    write_manifest(data_root, "shard-z", [])
    write_rejects(data_root, "shard-z", "alignments", ["a", "b", "c"])
    refresh_catalog(connection, data_root.url)
    rows = {r["product"]: r for r in run_query(connection, NAMED_QUERIES["shard_accounting"]).to_pylist()}
    bridge = rows["bridge"]
    assert bridge["shard"] == "shard-z" and bridge["produced"] == 0 and bridge["accounted_for"] == 3
    assert bridge["balanced"] is True
    assert rows["asr"]["produced"] is None and rows["asr"]["state"] == "not built"
    assert bridge["state"] == "balanced"


def test_accounting_tells_a_product_not_built_from_an_unbalanced_one(data_root, connection):
    from speechdata.catalog.accounting_state import SHARD_ACCOUNTING_FROM_STATE

    land_ids(data_root, "shard-a", ["shard-a_u1", "shard-a_u2", "shard-a_u3", "shard-a_u4"])
    land_ids(data_root, "shard-b", ["shard-b_v1", "shard-b_v2"])
    write_manifest(data_root, "shard-a", SHARD_A)  # u4 neither produced nor rejected: unbalanced
    write_manifest(data_root, "shard-b", SHARD_B)
    refresh_catalog(connection, data_root.url)
    for sql in (NAMED_QUERIES["shard_accounting"], SHARD_ACCOUNTING_FROM_STATE):
        states = {(r["shard"], r["product"]): r["state"] for r in run_query(connection, sql).to_pylist()}
        assert states[("shard-a", "bridge")] == "unbalanced", sql
        assert states[("shard-b", "bridge")] == "balanced", sql
        assert {states[(shard, "asr")] for shard in ("shard-a", "shard-b")} == {"not built"}, sql
    view_states = dict(
        connection.execute(
            "SELECT state, count(*) FROM product_accounting WHERE shard = 'shard-a' GROUP BY ALL"
        ).fetchall()
    )
    assert view_states["unbalanced"] == 1 and view_states["not built"] >= 1


def test_accounting_is_per_product_and_lists_every_landed_shard(data_root, connection):
    ids = ["shard-a_u1", "shard-a_u2", "shard-a_u3"]
    land_ids(data_root, "shard-a", [*ids, "shard-a_u8", "shard-a_u9"])
    land_ids(data_root, "shard-q", ["q1"])  # landed, nothing built yet: listed, not balanced
    write_manifest(data_root, "shard-a", SHARD_A)
    write_rejects(data_root, "shard-a", "alignments", ["shard-a_u8", "shard-a_u9"])
    # The translation stage's rejects belong to translation only: they never unbalance the bridge.
    write_rejects(data_root, "shard-a", "streaming_segments", ids, reason="no_segmentation")
    refresh_catalog(connection, data_root.url)
    rows = run_query(connection, NAMED_QUERIES["shard_accounting"]).to_pylist()
    assert {r["shard"] for r in rows} == {"shard-a", "shard-q"}
    bridge = next(r for r in rows if (r["shard"], r["product"]) == ("shard-a", "bridge"))
    assert (bridge["landed"], bridge["produced"], bridge["rejected"], bridge["balanced"]) == (5, 3, 2, True)
    translation = next(r for r in rows if (r["shard"], r["product"]) == ("shard-a", "translation"))
    assert translation["rejected"] == 5 and translation["produced"] is None


def test_a_data_root_with_glob_characters_reads_its_own_files(tmp_path):
    from speechdata.io.storage import DataRoot

    root = DataRoot(str(tmp_path / "run[1]" / "data"))
    write_manifest(root, "shard-a", SHARD_A)
    land_ids(root, "shard-a", ["shard-a_u1", "shard-a_u2", "shard-a_u3"])
    root.fs.makedirs(root.root, exist_ok=True)
    with duckdb.connect(root.path(CATALOG_FILE)) as con:
        summary = refresh_catalog(con, root.url)
        assert (summary.shards, summary.samples) == (1, 3)
        [(balanced,)] = con.execute("SELECT balanced FROM product_accounting WHERE product = 'bridge'").fetchall()
        assert balanced is True


def test_a_failed_refresh_keeps_the_previous_catalog(populated, connection):
    refresh_catalog(connection, populated.url)
    # A manifest that is not parquet at all (a hand-copied file, a disk fault) fails the refresh.
    populated.write_bytes(manifest_path("shard-bad"), b"not parquet")
    with pytest.raises(duckdb.Error):
        refresh_catalog(connection, populated.url)
    assert scalar(connection, "SELECT manifest_files FROM catalog_info") == 2
    populated.fs.rm(populated.path(manifest_path("shard-bad")))
    assert scalar(connection, "SELECT sum(samples) FROM hours_by_shard") == 5


def test_select_samples_filters(populated, connection):
    refresh_catalog(connection, populated.url)

    def keys(**filters):
        return select_samples(connection, **filters).column("key").to_pylist()

    assert keys(languages=["en"]) == ["shard-a_u1", "shard-a_u2", "shard-b_v1", "shard-b_v2"]
    assert keys(languages=["en"], countries=["gb"], min_alignment_score=-1.8) == ["shard-b_v2"]
    assert keys(min_duration_s=1.8, max_duration_s=7.2) == ["shard-a_u1", "shard-a_u2", "shard-a_u3"]
    assert keys(where={"n_frames": "45"}) == ["shard-a_u1"]  # a string cast to the column's type
    assert keys(where={"speaker": ["s2", "s9"]}) == ["shard-b_v2"]
    assert keys(where={"text": None}) == ["shard-a_u3"]
    assert keys(where={"language": []}) == []
    assert keys(languages=["en"], limit=1) == ["shard-a_u1"]
    with pytest.raises(ValueError, match="limit"):
        select_samples(connection, limit=-1)


def test_a_hostile_value_is_only_ever_a_value(populated, connection):
    refresh_catalog(connection, populated.url)
    assert select_samples(connection, languages=[HOSTILE]).num_rows == 0
    assert select_samples(connection, where={"country": HOSTILE, "text": [HOSTILE]}).num_rows == 0
    assert scalar(connection, "SELECT count(*) FROM samples") == 5
    for table in SUMMARY_TABLES:
        names = "SELECT table_name AS name FROM duckdb_tables() UNION ALL SELECT view_name FROM duckdb_views()"
        assert scalar(connection, f"SELECT count(*) FROM ({names}) WHERE name = ?", [table]) == 1


@pytest.mark.parametrize("column", ["no_such_column", "language = 'en' OR 1=1 --", 'language"; DROP TABLE samples; --'])
def test_unknown_where_columns_are_rejected(populated, connection, column):
    refresh_catalog(connection, populated.url)
    with pytest.raises(ValueError, match="unknown column"):
        select_samples(connection, where={column: "en"})
    assert scalar(connection, "SELECT count(*) FROM samples") == 5


def test_tar_url_export_is_distinct_and_sorted(populated, connection):
    refresh_catalog(connection, populated.url)
    urls = export_tar_urls(select_samples(connection), populated.url)
    assert urls == sorted(set(urls)) and len(urls) == 3
    assert urls[0] == "file:///data/bridge/shard-a-000000.tar"


def test_format_table_aligns_columns_and_counts_hidden_rows():
    table = pa.table({"language": ["en", None, "de"], "hours": [1.5, 22.25, 0.0]})
    text = format_table(table, max_rows=2)
    lines = text.splitlines()
    assert lines[0] == "language    hours"
    assert lines[2] == "en         1.5000"
    assert lines[3] == "NULL      22.2500"
    assert lines[-1] == "(2 of 3 rows shown)"


def run_cli(*args, data_root):
    env = {**os.environ, "DATA_ROOT": data_root.root}
    return subprocess.run(
        [sys.executable, "-m", "speechdata.catalog.cli", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_cli_runs_a_named_query(populated):
    refreshed = run_cli("--refresh", data_root=populated)
    assert refreshed.returncode == 0, refreshed.stderr
    assert "2 shards, 5 samples" in refreshed.stdout

    proc = run_cli("--named", "hours_per_language", data_root=populated)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == ["language", "samples", "hours", "mean_alignment_score"]
    assert lines[2].split()[:2] == ["en", "4"] and lines[3].split()[:2] == ["de", "1"]
    assert lines[-1] == "(2 rows)"


@pytest.mark.slow
def test_cli_exports_a_selection(populated, tmp_path):
    assert run_cli("--refresh", data_root=populated).returncode == 0
    # NeMo manifests moved to `speechdata export nemo` (paths NeMo's loaders read): the old flag says where.
    proc = run_cli("--export-nemo", str(tmp_path / "en.jsonl"), "--language", "en", data_root=populated)
    assert proc.returncode == 2 and "speechdata export nemo" in proc.stderr
    assert not (tmp_path / "en.jsonl").exists()
    urls = tmp_path / "urls.txt"
    assert run_cli("--export-urls", str(urls), "--language", "en", data_root=populated).returncode == 0
    assert urls.read_text().splitlines() == [
        "file:///data/bridge/shard-a-000000.tar",
        "file:///data/bridge/shard-b-000000.tar",
    ]


@pytest.mark.slow
def test_cli_reports_bad_sql_and_a_missing_catalog_with_status_2(populated):
    missing = run_cli("SELECT 1", data_root=populated)
    assert missing.returncode == 2
    assert missing.stderr.strip().startswith("catalog: error: no catalog at")

    assert run_cli("--refresh", data_root=populated).returncode == 0
    bad = run_cli("SELEC * FROM samples", data_root=populated)
    assert bad.returncode == 2 and bad.stdout == ""
    assert len(bad.stderr.strip().splitlines()) == 1 and "syntax error" in bad.stderr
    # The connection is read-only: SQL cannot change the catalog.
    dropped = run_cli("DROP TABLE hours_by_language", data_root=populated)
    assert dropped.returncode == 2 and "read-only" in dropped.stderr.lower()
    assert run_cli("--named", "hours_per_country", data_root=populated).returncode == 0


@pytest.mark.slow
def test_cli_cannot_write_or_read_files_outside_the_catalog(populated, tmp_path):
    assert run_cli("--refresh", data_root=populated).returncode == 0
    target = tmp_path / "stolen.csv"
    copied = run_cli(f"COPY (SELECT * FROM samples) TO '{target}'", data_root=populated)
    assert copied.returncode == 2 and not target.exists()
    assert "read-only catalog: only queries (SELECT, EXPLAIN) run here, refused a COPY statement" in copied.stderr
    inside = run_cli(f"COPY (SELECT 1) TO '{populated.root}/manifests/evil.csv'", data_root=populated)
    assert inside.returncode == 2 and not populated.exists("manifests/evil.csv")
    read = run_cli("SELECT * FROM read_text('/etc/hostname')", data_root=populated)
    assert read.returncode == 2
    assert 'Cannot access file "/etc/hostname" - file system operations are disabled' in read.stderr
    unlock = run_cli("SELECT current_setting('enable_external_access')", data_root=populated)
    assert unlock.returncode == 0 and "False" in unlock.stdout
    assert run_cli("--named", "shard_accounting", data_root=populated).returncode == 0


@pytest.mark.slow
def test_cli_works_on_a_data_root_with_glob_characters(tmp_path):
    from speechdata.io.storage import DataRoot

    root = DataRoot(str(tmp_path / "run[1]"))
    write_manifest(root, "shard-a", SHARD_A)
    refreshed = run_cli("--refresh", data_root=root)
    assert refreshed.returncode == 0 and "1 shards, 3 samples" in refreshed.stdout
    counted = run_cli("SELECT count(*) AS n FROM samples", data_root=root)
    assert counted.returncode == 0 and counted.stdout.splitlines()[2].strip() == "3"


def test_every_named_query_is_listed_in_the_command_reference():
    # docs/cli.md's list is what a user reads before `--list`; three queries were missing from it.
    reference = (REPO_ROOT / "docs" / "cli.md").read_text().split("\n## catalog\n", 1)[1]
    section = reference.split("\n## ", 1)[0]
    assert [name for name in NAMED_QUERIES if f"`{name}`" not in section] == []
