"""The product-line registry drives the ledgers, the catalog's accounting and its rejects, for every line.

A hand-made root is built from the registry itself: every product line has three utterances in its
output, and every stage any product line names rejects one landed utterance of its own plus one
utterance every stage rejects. A product's ledger must then count exactly its own stages' rejects,
the shared one under its earliest stage's reason, in ``shard_ledgers``, ``product_accounting`` (view
and per-shard state) and ``product_rejects``. A product line registered only in the test gets the
same, with no other code change.
"""

import dataclasses
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from speechdata import products
from speechdata.accounting.ledgers import PRODUCT_STAGES, shard_ledgers
from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.bridge.manifest import MANIFEST_COLUMNS
from speechdata.catalog.accounting_state import SHARD_ACCOUNTING_FROM_STATE
from speechdata.catalog.queries import NAMED_QUERIES, run_query
from speechdata.catalog.views import refresh_catalog
from speechdata.hf.shard_paths import HF_STAGE
from speechdata.io import layout
from speechdata.products import PRODUCT_LINES, ProductLine, product_line
from tests.unit.test_catalog_incremental import connect

SHARD = "shard-a"
PRODUCED = ["shard-a_u1", "shard-a_u2", "shard-a_u3"]
EVERY_STAGE_REJECTS = "shard-a_everywhere"

SPEAKER_EMBEDDINGS = ProductLine(
    name="speaker_embeddings",
    description="One speaker embedding per utterance (a product line known only to this test).",
    package="speechdata.speaker",
    builds={"speaker_embeddings": "speechdata.speaker.embeddings"},
    stages=("raw_shards", "normalized_audio", "speaker_embeddings"),
    output=lambda shard_id: f"speaker_embeddings/shard={shard_id}/embeddings.parquet",
    id_column="utt_id",
    output_asset="speaker_embeddings",
    docs="speaker-embeddings.md",
)


def line_with(**fields) -> ProductLine:
    """A record with every required field, ``fields`` replacing some."""
    return ProductLine(**{**SPEAKER_EMBEDDINGS.__dict__, **fields})


def rejected_by(stage: str) -> str:
    return f"shard-a_rejected_by_{stage}"


def reason_of(stage: str) -> str:
    return f"{stage}_failed"


def all_stages(lines) -> list[str]:
    return sorted({stage for line in lines for stage in line.stages})


def output_file(line: ProductLine, shard: str) -> str:
    """The file a product writes for the shard: one part of it when it writes one file per part."""
    return line.output(shard).replace("*", "de")


def output_table(line: ProductLine, shard: str, utt_ids: list[str]) -> pa.Table:
    if line.output is layout.shard_manifest:
        # The catalog's samples view and summaries read every manifest column, not only the ids.
        n = len(utt_ids)
        defaults = {pa.string(): "x", pa.int64(): 0, pa.int32(): 0, pa.float64(): 1.0, pa.float32(): 0.0}
        columns = {f.name: [defaults[f.type]] * n for f in MANIFEST_COLUMNS}
        return pa.table({**columns, "key": utt_ids, "shard": [shard] * n, "extra": ["{}"] * n}, MANIFEST_COLUMNS)
    if line.ids_are_lists:  # one row may hold several utterances (a VAD chunk)
        ids = pa.array([utt_ids[i : i + 2] for i in range(0, len(utt_ids), 2)], pa.list_(pa.string()))
    else:
        ids = pa.array(utt_ids, pa.string())
    columns = {line.id_column: ids}
    if line.shard_column:
        columns[line.shard_column] = pa.array([shard] * len(ids), pa.string())
    return pa.table(columns)


def build_root(data_root, lines) -> None:
    stages = all_stages(lines)
    landed = [*PRODUCED, EVERY_STAGE_REJECTS, *(rejected_by(s) for s in stages)]
    data_root.write_parquet(
        layout.landing_metadata(SHARD), pa.table({"utt_id": landed, "audio_path": [f"{u}.wav" for u in landed]})
    )
    for line in lines:
        data_root.write_parquet(output_file(line, SHARD), output_table(line, SHARD, PRODUCED))
    for stage in stages:
        rejects = [Reject(u, stage, reason_of(stage), "hand-made") for u in (rejected_by(stage), EVERY_STAGE_REJECTS)]
        data_root.write_parquet(layout.rejects(SHARD, stage), rejects_table(rejects))


def expected_ledger(line: ProductLine, lines) -> dict:
    """What the ledger of ``line`` must say on the root :func:`build_root` made for ``lines``."""
    by_reason = Counter({reason_of(stage): 1 for stage in line.stages})
    by_reason[reason_of(line.stages[0])] += 1  # rejected by every stage: counted once, at the earliest
    return {
        "landed": len(PRODUCED) + 1 + len(all_stages(lines)),
        "produced": len(PRODUCED),
        "rejected": len(line.stages) + 1,
        "rejects_by_reason": dict(by_reason),
    }


def assert_every_product_is_counted(data_root, lines) -> None:
    ledgers = shard_ledgers(data_root, SHARD)
    assert list(ledgers) == [line.name for line in lines]
    for line in lines:
        ledger = ledgers[line.name]
        expected = expected_ledger(line, lines)
        assert (ledger.landed, ledger.produced, ledger.rejected) == (
            expected["landed"],
            expected["produced"],
            expected["rejected"],
        ), line.name
        assert ledger.rejects_by_reason == expected["rejects_by_reason"], line.name

    with connect(data_root) as connection:
        refresh_catalog(connection, data_root.url)
        for sql in (NAMED_QUERIES["shard_accounting"], SHARD_ACCOUNTING_FROM_STATE):
            rows = {r["product"]: r for r in run_query(connection, sql).to_pylist() if r["shard"] == SHARD}
            assert set(rows) == {line.name for line in lines}
            for name, ledger in ledgers.items():
                row = rows[name]
                assert (row["landed"], row["produced"], row["rejected"], row["balanced"]) == (
                    ledger.landed,
                    ledger.produced,
                    ledger.rejected,
                    ledger.balanced,
                ), name
        rejects = connection.execute(
            "SELECT product, reason, count(*) FROM product_rejects WHERE shard = ? GROUP BY ALL", [SHARD]
        ).fetchall()
        by_product: dict[str, dict[str, int]] = {}
        for product, reason, count in rejects:
            by_product.setdefault(product, {})[reason] = count
        assert by_product == {name: ledger.rejects_by_reason for name, ledger in ledgers.items()}


@pytest.mark.parametrize("line", PRODUCT_LINES, ids=lambda line: line.name)
def test_every_registered_product_line_has_its_ledger_accounting_row_and_rejects(data_root, line):
    build_root(data_root, PRODUCT_LINES)
    ledger = shard_ledgers(data_root, SHARD)[line.name]
    expected = expected_ledger(line, PRODUCT_LINES)
    assert (ledger.landed, ledger.produced, ledger.rejected) == (
        expected["landed"],
        expected["produced"],
        expected["rejected"],
    )
    assert ledger.rejects_by_reason == expected["rejects_by_reason"]
    # Only the stages a product line owns count: a stage it does not name never touches its ledger.
    others = set(all_stages(PRODUCT_LINES)) - set(line.stages)
    assert not {reason_of(stage) for stage in others} & set(ledger.rejects_by_reason)
    with connect(data_root) as connection:
        refresh_catalog(connection, data_root.url)
        [row] = [
            r
            for r in run_query(connection, NAMED_QUERIES["shard_accounting"]).to_pylist()
            if (r["shard"], r["product"]) == (SHARD, line.name)
        ]
        assert (row["landed"], row["produced"], row["rejected"]) == (ledger.landed, ledger.produced, ledger.rejected)
        reasons = dict(
            connection.execute(
                "SELECT reason, count(*) FROM product_rejects WHERE shard = ? AND product = ? GROUP BY reason",
                [SHARD, line.name],
            ).fetchall()
        )
        assert reasons == ledger.rejects_by_reason


def test_the_ledgers_and_the_catalog_agree_on_every_product_line(data_root):
    build_root(data_root, PRODUCT_LINES)
    assert_every_product_is_counted(data_root, PRODUCT_LINES)


def test_a_product_line_registered_in_one_record_gets_a_ledger_and_accounting_rows(data_root, monkeypatch):
    lines = (*PRODUCT_LINES, SPEAKER_EMBEDDINGS)
    monkeypatch.setattr(products, "PRODUCT_LINES", lines)
    build_root(data_root, lines)
    assert_every_product_is_counted(data_root, lines)
    assert product_line("speaker_embeddings") is SPEAKER_EMBEDDINGS


def test_registering_a_product_line_recounts_the_catalog_state_of_unchanged_shards(data_root, monkeypatch):
    build_root(data_root, PRODUCT_LINES)
    with connect(data_root) as connection:
        refresh_catalog(connection, data_root.url)
        monkeypatch.setattr(products, "PRODUCT_LINES", (*PRODUCT_LINES, SPEAKER_EMBEDDINGS))
        # No file changed: only the registry did. The state must still list the new product line.
        summary = refresh_catalog(connection, data_root.url)
        assert summary.accounting_shards_read == 1
        from_state = run_query(connection, SHARD_ACCOUNTING_FROM_STATE).to_pylist()
        from_views = run_query(connection, NAMED_QUERIES["shard_accounting"]).to_pylist()
        assert from_state == from_views
        [row] = [r for r in from_state if r["product"] == "speaker_embeddings"]
        assert row["produced"] is None  # not built yet
        assert row["rejected"] == 3  # raw_shards and normalized_audio rejects, the shared one once


def test_the_public_ledger_names_are_the_registry():
    assert {line.name: line.stages for line in PRODUCT_LINES} == PRODUCT_STAGES
    assert [line.name for line in PRODUCT_LINES] == ["bridge", "asr", "vad", "translation", "hf"]


@pytest.mark.parametrize("line", PRODUCT_LINES, ids=lambda line: line.name)
def test_a_product_lines_glob_and_shard_regex_find_its_own_output(line):
    path = output_file(line, "shard-x_1")
    assert re.search(line.shard_regex, "/" + path).group(1) == "shard-x_1"
    assert re.search(line.shard_regex, "s3://bucket/prefix/" + path).group(1) == "shard-x_1"
    assert not re.search(line.shard_regex, "/" + path + ".tmp")
    assert line.output_glob == line.output("*")
    assert not re.search(line.shard_regex, "/" + path.rpartition("/")[0] + "/._tmp-0123-" + path.rpartition("/")[2])


def test_a_product_line_must_name_the_shard_in_its_output_and_have_a_plain_name():
    with pytest.raises(ValueError, match="name the shard"):
        line_with(output=lambda shard_id: "fixed.parquet")
    with pytest.raises(ValueError, match="must match"):
        line_with(name="Bad Name")
    with pytest.raises(ValueError, match="only its file name may hold"):
        line_with(output=lambda shard_id: f"{shard_id}/*/x.parquet")
    with pytest.raises(ValueError, match="only its file name may hold"):
        line_with(output=lambda shard_id: f"{shard_id}/*-*.parquet")
    with pytest.raises(ValueError, match="not under speechdata"):
        line_with(package="speaker")
    with pytest.raises(ValueError, match=r"builds shared stage\(s\) \['alignments'\]"):
        line_with(builds={"alignments": "speechdata.speaker.embeddings"})
    with pytest.raises(KeyError, match="unknown product 'nope'"):
        product_line("nope")


def test_a_record_is_immutable():
    with pytest.raises(TypeError):
        SPEAKER_EMBEDDINGS.builds["other"] = "speechdata.speaker.other"  # type: ignore[index]
    assert isinstance(SPEAKER_EMBEDDINGS.stages, tuple)


def test_every_product_lines_docs_page_exists_and_is_in_the_site():
    docs = Path(__file__).resolve().parents[2] / "docs"
    nav = (docs.parent / "mkdocs.yml").read_text(encoding="utf-8")
    for line in PRODUCT_LINES:
        assert (docs / line.docs).is_file(), line.name
        assert f": {line.docs}" in nav, line.name


def test_the_contributing_checklist_names_every_field_of_a_record():
    page = (Path(__file__).resolve().parents[2] / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = page.split("## Adding a product line", 1)[1].split("\n### ", 1)[0]
    named = [m.group(1) for m in re.finditer(r"^\| `([a-z_]+)` \|", section, re.MULTILINE)]
    assert named == [field.name for field in dataclasses.fields(ProductLine)]


def test_every_catalog_view_a_record_names_is_built(data_root):
    build_root(data_root, PRODUCT_LINES)
    with connect(data_root) as connection:
        refresh_catalog(connection, data_root.url)
        views = {row[0] for row in connection.execute("SELECT view_name FROM duckdb_views()").fetchall()}
    for line in PRODUCT_LINES:
        assert set(line.catalog_views) <= views, line.name


def test_the_hf_records_last_stage_is_the_hf_publishing_stage():
    assert product_line("hf").stages[-1] == HF_STAGE
    assert product_line("hf").output(SHARD).startswith(layout.shard_dir(SHARD))


def test_a_product_line_registered_twice_is_an_error(monkeypatch):
    monkeypatch.setattr(products, "PRODUCT_LINES", (*PRODUCT_LINES, PRODUCT_LINES[0]))
    with pytest.raises(ValueError, match="registered twice: bridge"):
        products.product_lines()


def test_the_ledgers_page_lists_every_product_line_as_registered():
    page = (Path(__file__).resolve().parents[2] / "docs" / "ledgers.md").read_text(encoding="utf-8")
    section = page.split("## One ledger per product line", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1:]
    assert list(rows) == [line.name for line in PRODUCT_LINES]
    for line in PRODUCT_LINES:
        stages, outputs = rows[line.name]
        assert tuple(s.strip() for s in stages.split(",")) == line.stages, line.name
        assert outputs.startswith(f"`{line.output('<s>')}` (`{line.id_column}`"), line.name


def test_a_product_written_in_parts_counts_every_part_and_is_built_once_one_exists(data_root):
    hf = product_line("hf")
    landed = ["u1", "u2", "u3"]
    data_root.write_parquet(layout.landing_metadata(SHARD), pa.table({"utt_id": landed}))
    assert "hf" not in shard_ledgers(data_root, SHARD)
    data_root.write_parquet(hf.output(SHARD).replace("*", "de"), pa.table({"utt_id": ["u1", "u2"]}))
    assert not shard_ledgers(data_root, SHARD)["hf"].balanced
    data_root.write_parquet(hf.output(SHARD).replace("*", "at"), pa.table({"utt_id": ["u3"]}))
    ledger = shard_ledgers(data_root, SHARD)["hf"]
    assert (ledger.produced, ledger.balanced) == (3, True)


def test_a_country_that_is_no_plain_name_cannot_name_a_published_index():
    from speechdata.hf.shard_paths import published_index

    for country in ("../x", "a/b", "*", ".hidden", ""):
        with pytest.raises(ValueError, match="cannot name a published index"):
            published_index(SHARD, country)
