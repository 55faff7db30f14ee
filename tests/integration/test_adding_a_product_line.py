"""Adding a product line is its own package, its asset module and one registry record: nothing else.

The worked example of docs/contributing.md (a ``transcripts`` product line) is built from that page's
own code blocks, in a scratch folder that the ``speechdata`` and ``assets`` packages are extended
with, and its record is appended to the registry inside the test. No file of the repository names
it; the ledgers, the catalog refresh sensor, the stage-contract lists and the code location's loader
must then pick it up by themselves, and materializing it must balance its ledger.
"""

import importlib
import re
import sys
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest

import assets
import speechdata
from assets.ingest import raw_shards
from assets.partitions import shard_partitions
from dagster_project import loader
from dagster_project.product_graph import ProductGraphMismatch, check_product_lines
from resources.storage import DataRootResource
from sensors.catalog import catalogued_assets
from speechdata import products
from speechdata.accounting.ledgers import shard_ledgers
from speechdata.io import layout
from speechdata.products import ProductLine
from tests.conftest import encode, land_shard, tone
from tests.unit.test_stage_contract import contract_violations

REPOSITORY = Path(__file__).resolve().parents[2]
CONTRIBUTING = REPOSITORY / "docs" / "contributing.md"
FILE_BLOCK = re.compile(r"<!-- file: (?P<name>[^>]+?) -->\n```python\n(?P<code>.*?)```", re.DOTALL)
PACKAGE_FILE, ASSET_FILE, RECORD = "speechdata/transcripts/stage.py", "assets/transcripts.py", "registry record"
NEW_MODULES = ("speechdata.transcripts", "speechdata.transcripts.stage", "assets.transcripts")


def worked_example() -> dict[str, str]:
    """The worked example's code blocks, by the file (or record) each is, as the page shows them."""
    return {match["name"]: match["code"] for match in FILE_BLOCK.finditer(CONTRIBUTING.read_text())}


@pytest.fixture
def transcripts_line(tmp_path, monkeypatch) -> ProductLine:
    """The worked example added as a contributor would: its package, its asset module, its record."""
    blocks = worked_example()
    assert {PACKAGE_FILE, ASSET_FILE, RECORD} <= set(blocks), sorted(blocks)
    scratch = tmp_path / "checkout"
    for relative in (PACKAGE_FILE, ASSET_FILE):
        (scratch / relative).parent.mkdir(parents=True, exist_ok=True)
        (scratch / relative).write_text(blocks[relative])
    (scratch / "speechdata" / "transcripts" / "__init__.py").write_text("")
    monkeypatch.setattr(speechdata, "__path__", [*speechdata.__path__, str(scratch / "speechdata")])
    monkeypatch.setattr(assets, "__path__", [*assets.__path__, str(scratch / "assets")])
    record = eval(blocks[RECORD], {"ProductLine": ProductLine, "layout": layout})  # noqa: S307 - the docs' own code
    monkeypatch.setattr(products, "PRODUCT_LINES", (*products.PRODUCT_LINES, record))
    # The loader as it finds asset groups: the extended package's modules, found afresh.
    monkeypatch.setattr(assets, "GROUP_MODULES", assets.group_modules())
    monkeypatch.setattr(assets, "ALL_ASSETS", [a for module in assets.GROUP_MODULES for a in module.defs.assets])
    yield record
    for name in NEW_MODULES:
        sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if hasattr(sys.modules.get(parent), child):
            delattr(sys.modules[parent], child)


def test_no_file_of_the_repository_names_the_example_outside_its_page_and_this_test():
    naming = [
        path.relative_to(REPOSITORY).as_posix()
        for folder in ("speechdata", "assets", "resources", "sensors", "dagster_project", "tests")
        for path in (REPOSITORY / folder).rglob("*.py")
        if "run_transcripts" in path.read_text(errors="replace") and path != Path(__file__).resolve()
    ]
    assert naming == []
    assert "run_transcripts" in CONTRIBUTING.read_text()


def test_the_stage_contract_and_the_catalog_sensor_pick_the_new_line_up(transcripts_line):
    assert products.shard_stage_modules()["transcripts"] == "speechdata.transcripts.stage"
    assert contract_violations(products.shard_stage_modules()) == []
    assert dg.AssetKey("transcripts") in catalogued_assets()


def test_the_loader_finds_its_asset_and_checks_it_against_the_record(transcripts_line, tmp_path):
    asset_module = importlib.import_module("assets.transcripts")
    assert asset_module in assets.GROUP_MODULES
    definitions = loader.build_definitions(data_root=str(tmp_path / "data"), profile="tiny")
    assert definitions.resolve_assets_def("transcripts").group_names_by_key[dg.AssetKey("transcripts")] == (
        "transcripts"
    )
    # A record that drifts from the asset graph fails the load, naming the line and the stage.
    drifted = ProductLine(**{**transcripts_line.__dict__, "stages": ("raw_shards", "alignments", "transcripts")})
    with pytest.raises(ProductGraphMismatch, match=r"'transcripts'.*\['alignments'\].*not upstream"):
        check_product_lines(assets.ALL_ASSETS, [drifted])
    missing = ProductLine(**{**transcripts_line.__dict__, "output_asset": "transcript"})
    with pytest.raises(ProductGraphMismatch, match=r"'transcripts'.*\['transcript'\]"):
        check_product_lines(assets.ALL_ASSETS, [missing])


def test_materializing_it_balances_its_ledger(transcripts_line, data_root):
    wav = encode(tone(1.0, 16_000), 16_000)
    rows = [
        {"utt_id": "spoken", "audio_path": "a.wav", "text": "a sentence with words", "language": "en"},
        {"utt_id": "dots", "audio_path": "b.wav", "text": "...", "language": "en"},
    ]
    schema = pa.schema(
        [("utt_id", pa.string()), ("audio_path", pa.string()), ("text", pa.string()), ("language", pa.string())]
    )
    land_shard(data_root, "t1", rows, {"a.wav": wav, "b.wav": wav}, schema=schema)
    transcripts = importlib.import_module("assets.transcripts").transcripts
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["t1"])
        result = dg.materialize(
            [raw_shards, transcripts],
            partition_key="t1",
            instance=instance,
            resources={"data_root": DataRootResource(url=data_root.url)},
        )
    assert result.success
    assert all(check.passed for check in result.get_asset_check_evaluations())
    assert data_root.read_parquet(transcripts_line.output("t1"))["utt_id"].to_pylist() == ["spoken"]
    ledger = shard_ledgers(data_root, "t1")["transcripts"]
    assert ledger.balanced
    assert (ledger.landed, ledger.produced, ledger.rejected) == (2, 1, 1)
    assert ledger.rejects_by_reason == {"no_words": 1}
