"""The incremental catalog refresh gives exactly what a full refresh from scratch gives."""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from speechdata.bridge.manifest import manifest_path
from speechdata.catalog.accounting_state import ACCOUNTING_STATE_TABLES
from speechdata.catalog.incremental import HOURS_PER_LANGUAGE_FROM_STATE, STATE_TABLES
from speechdata.catalog.queries import NAMED_QUERIES, run_query
from speechdata.catalog.views import CATALOG_FILE, refresh_catalog
from speechdata.io import layout
from tests.unit.test_catalog import SHARD_A, SHARD_B, land_ids, run_cli, write_manifest, write_rejects

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARD_C = [("w1", "fr", "fr", 36.0, -1.0, "bonjour"), ("w2", "fr", "be", 2.5, None, "salut")]
SHARD_D = [("x1", "de", "at", 4.0, -0.25, "servus")]


@pytest.fixture
def root(data_root):
    return write_four_shards(data_root)


def write_four_shards(data_root):
    """Four shards with differing extra columns, landed ids, and rejects ledgers (one half-written)."""
    write_manifest(data_root, "shard-a", SHARD_A, extra={"snr_db": (pa.float64(), [20.0, 15.0, 30.0])})
    write_manifest(data_root, "shard-b", SHARD_B, extra={"speaker": (pa.string(), ["s1", "s2"])})
    write_manifest(data_root, "shard-c", SHARD_C)
    write_manifest(data_root, "shard-d", [])  # every utterance rejected
    for shard, rows in (("shard-a", SHARD_A), ("shard-b", SHARD_B), ("shard-c", SHARD_C)):
        land_ids(data_root, shard, [f"{shard}_{r[0]}" for r in rows] + [f"{shard}_gone"])
    write_rejects(data_root, "shard-a", "ingest", ["shard-a_gone"], reason="unreadable_audio")
    write_rejects(data_root, "shard-a", "alignments", ["shard-a_gone", "shard-a_u8"])
    write_rejects(data_root, "shard-d", "alignments", ["x1", "x2"])
    data_root.write_bytes(f"{layout.rejects_dir('shard-b')}/._tmp-0123456789ab-alignment.parquet", b"half a file")
    return data_root


def connect(data_root, name=CATALOG_FILE):
    data_root.fs.makedirs(data_root.root, exist_ok=True)
    return duckdb.connect(data_root.path(name))


class Summed(float):
    """A float that equals another within the last bits summation order changes between two scans
    (threads, spilling). Rounding both to a fixed number of digits instead is not enough: two sums a few
    units in the last place apart round apart whenever a rounding boundary lies between them."""

    def __eq__(self, other):
        return isinstance(other, float) and math.isclose(self, other, rel_tol=SUMMATION_TOLERANCE, abs_tol=1e-12)

    def __ne__(self, other):
        return not self == other

    __hash__ = float.__hash__

    def __repr__(self):
        return f"{float(self):.12g}"  # the rows' sort key: the same order for two scans of the same rows


SUMMATION_TOLERANCE = 1e-9
"""Far above what summation order changes in a sum of a few hundred thousand terms (about n x 1e-16
relative at worst), far below any real difference a test of the catalog looks for (a row more or less)."""


def _normal(value):
    if isinstance(value, float) and math.isfinite(value):
        return Summed(value)
    return value


def catalog_contents(connection, only=None) -> dict[str, list]:
    """Every table and view of the catalog (or ``only`` these), rows sorted (``catalog_info``'s timestamp left out)."""
    names = [
        r[0]
        for r in connection.execute(
            "SELECT table_name FROM duckdb_tables() WHERE NOT temporary UNION ALL "
            "SELECT view_name FROM duckdb_views() WHERE NOT internal AND NOT temporary ORDER BY 1"
        ).fetchall()
    ]
    contents = {}
    for name in only or names:
        relation = connection.sql(f'SELECT * FROM "{name}"')
        columns = [c for c in relation.columns if c != "refreshed_at"]
        rows = connection.execute(f'SELECT {", ".join(f"{chr(34)}{c}{chr(34)}" for c in columns)} FROM "{name}"')
        contents[name] = (columns, sorted((tuple(_normal(v) for v in row) for row in rows.fetchall()), key=repr))
    return contents


def test_two_sums_of_the_same_rows_compare_equal_across_a_rounding_boundary_and_a_real_difference_does_not():
    # The first import's hours (tests/unit/test_catalog_refresh_memory.py) in two summation orders: the
    # exact sum lies 4 units in the last place below a 12-decimal rounding boundary, DuckDB's sums on both sides.
    one_order, another = 105.41720194444444, 105.4172019444446
    assert round(one_order, 12) != round(another, 12)
    assert Summed(one_order) == Summed(another) and Summed(another) == one_order
    assert {"hours": Summed(one_order)} == {"hours": Summed(another)}
    assert Summed(105.41720194444444) != 105.41720194444444 + 2.5 / 3600  # one utterance of 2.5 s more
    assert Summed(0.0) != 1e-9 and Summed(1.0) != "1.0"


def full_refresh_from_scratch(data_root):
    with connect(data_root, "scratch.duckdb") as fresh:
        summary = refresh_catalog(fresh, data_root.url, full=True)
        return summary, catalog_contents(fresh)


def comparable(summary):
    skip = {
        "manifests_read",
        "manifests_reused",
        "manifests_dropped",
        "rejects_files_read",
        "accounting_shards_read",
        "listed_shards",
        "hours",
    }
    return {k: v for k, v in summary.as_dict().items() if k not in skip} | {"hours": Summed(summary.hours)}


def test_incremental_refresh_equals_a_full_refresh_after_adds_changes_and_removals(root):
    with connect(root) as connection:
        first = refresh_catalog(connection, root.url)
        assert (first.manifests_read, first.manifests_reused, first.rejects_files_read) == (4, 0, 3)

        # A new shard with a new extra column, a re-landed shard (new rows, new ledger), a deleted
        # shard (manifest, landing and ledger gone), an unchanged one.
        write_manifest(root, "shard-e", SHARD_D, extra={"room": (pa.string(), ["hall"])})
        write_manifest(root, "shard-b", [*SHARD_B, ("v3", "cy", "gb", 5.0, -4.0, "bara")])
        write_rejects(root, "shard-b", "ingest", ["shard-b_v9"], reason="unreadable_audio")
        root.fs.rm(root.path("manifests/shard=shard-c"), recursive=True)
        root.fs.rm(root.path(layout.landing_metadata("shard-c")))
        root.fs.rm(root.path(layout.rejects("shard-a", "ingest")))
        summary = refresh_catalog(connection, root.url)
        assert (summary.manifests_read, summary.manifests_reused, summary.manifests_dropped) == (2, 2, 1)
        assert summary.rejects_files_read == 1
        incremental = catalog_contents(connection)

    full_summary, full = full_refresh_from_scratch(root)
    assert comparable(summary) == comparable(full_summary)
    assert set(incremental) >= {*STATE_TABLES, "samples", "rejects", "words", "hours_by_shard", "product_accounting"}
    assert incremental.keys() == full.keys()
    for name in full:
        assert incremental[name] == full[name], name
    assert "cy" in summary.languages and "fr" not in summary.languages
    assert ("room" in incremental["samples"][0]) and summary.shards == 3  # a, b, e (d has no samples)


def test_a_rewritten_manifest_of_the_same_size_is_read_again(root):
    with connect(root) as connection:
        refresh_catalog(connection, root.url)
        before = root.fs.size(root.path(manifest_path("shard-c")))
        # Another two-letter language whose compressed file happens to have the same size as "fr"'s.
        for language in ("nl", "de", "es", "it", "pt", "pl", "sv", "da", "fi", "cs", "ro", "hu", "el", "bg"):
            write_manifest(root, "shard-c", [(u, language, c, d, s, t) for u, _, c, d, s, t in SHARD_C])
            if root.fs.size(root.path(manifest_path("shard-c"))) == before:
                break
        assert root.fs.size(root.path(manifest_path("shard-c"))) == before, "no same-size rewrite found"
        summary = refresh_catalog(connection, root.url)
        assert summary.manifests_read == 1 and language in summary.languages and "fr" not in summary.languages


def test_a_refresh_that_changes_nothing_reads_nothing(root):
    with connect(root) as connection:
        first = refresh_catalog(connection, root.url)
        again = refresh_catalog(connection, root.url)
        assert (again.manifests_read, again.manifests_reused, again.rejects_files_read) == (0, 4, 0)
        assert comparable(again) == comparable(first)


def test_hours_per_language_from_the_state_matches_the_named_query(root):
    with connect(root) as connection:
        refresh_catalog(connection, root.url)
        from_state = run_query(connection, HOURS_PER_LANGUAGE_FROM_STATE).to_pylist()
        from_files = run_query(connection, NAMED_QUERIES["hours_per_language"]).to_pylist()
    assert [r["language"] for r in from_state] == [r["language"] for r in from_files]
    for ours, theirs in zip(from_state, from_files):
        assert ours["samples"] == theirs["samples"]
        assert ours["hours"] == pytest.approx(theirs["hours"], rel=1e-12)
        assert ours["mean_alignment_score"] == pytest.approx(theirs["mean_alignment_score"], rel=1e-12)


KILLED_REFRESH = textwrap.dedent(
    """
    import os, sys, duckdb
    import speechdata.catalog.views as views

    def die(connection):  # after the state was rewritten, before the commit
        os._exit(9)

    views.summary_totals = die
    connection = duckdb.connect(sys.argv[2])
    views.refresh_catalog(connection, sys.argv[1])
    """
)


@pytest.mark.slow
def test_a_refresh_killed_part_way_leaves_the_previous_catalog_and_a_rerun_gives_the_clean_one(root):
    with connect(root) as connection:
        refresh_catalog(connection, root.url)
        before = catalog_contents(connection)
    write_manifest(root, "shard-e", SHARD_D)
    root.fs.rm(root.path("manifests/shard=shard-a"), recursive=True)

    killed = subprocess.run(
        [sys.executable, "-c", KILLED_REFRESH, root.url, root.path(CATALOG_FILE)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
    )
    assert killed.returncode == 9, killed.stderr

    with connect(root) as connection:
        after_kill = catalog_contents(connection)
        kept = (*STATE_TABLES, *ACCOUNTING_STATE_TABLES)
        assert {name: after_kill[name] for name in kept} == {name: before[name] for name in kept}
        assert connection.execute("SELECT manifest_files FROM catalog_info").fetchone()[0] == 4
        summary = refresh_catalog(connection, root.url)
        assert (summary.manifests_read, summary.manifests_dropped) == (1, 1)
        rerun = catalog_contents(connection)
    _, full = full_refresh_from_scratch(root)
    assert rerun == full


def test_a_corrupt_new_manifest_fails_the_refresh_and_keeps_the_state(root):
    with connect(root) as connection:
        refresh_catalog(connection, root.url)
        kept = (*STATE_TABLES, *ACCOUNTING_STATE_TABLES, "catalog_info", "catalog_view_definitions")
        before = catalog_contents(connection, kept)
        root.write_bytes(manifest_path("shard-bad"), b"not parquet")
        with pytest.raises(duckdb.Error):
            refresh_catalog(connection, root.url)
        # (the views read the live files, the bad one included: only the stored state is compared)
        assert catalog_contents(connection, kept) == before


@pytest.mark.slow
def test_cli_refreshes_incrementally_and_fully_on_request(root):
    first = run_cli("--refresh", data_root=root)
    again = run_cli("--refresh", data_root=root)
    full = run_cli("--refresh", "--full", data_root=root)
    assert [r.returncode for r in (first, again, full)] == [0, 0, 0], first.stderr + again.stderr + full.stderr
    assert "manifests read 4, reused 0" in first.stdout
    assert "manifests read 0, reused 4" in again.stdout
    assert "recounted for 4 shards" in first.stdout and "recounted for 0 shards" in again.stdout
    assert "manifests read 4, reused 0" in full.stdout
    misuse = run_cli("--full", "--list", data_root=root)
    assert misuse.returncode == 2 and "--full applies to --refresh" in misuse.stderr
