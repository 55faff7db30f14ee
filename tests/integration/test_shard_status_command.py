"""``speechdata shard status``: one shard's registration, landing, assets and ledgers, from a real
instance in a temporary DAGSTER_HOME after in-process materializations."""

import json
import shutil
from pathlib import Path

import pytest

from assets.ingest import normalized_audio, raw_shards
from assets.partitions import shard_partitions
from assets.vad import vad_segments
from dagster_project.definitions import defs
from dagster_project.shard_status import NEVER_MATERIALIZED, shard_asset_keys
from speechdata.accounting.ledgers import ledger_markdown, shard_ledgers
from speechdata.cli import run
from speechdata.landing.fingerprint import shard_content_fingerprint
from speechdata.testing.shards import FAULT_REASONS, build_sample_shard
from tests.dagster_home import instance_at
from tests.integration.test_ingest_assets import land_shard_with_string_start_s
from tests.materialize import materialize_shard

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dagster_home(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(ROOT / "deploy" / "local" / "dagster.yaml", home / "dagster.yaml")
    return home


def materialize(home, data_root, shard_id, selection):
    with instance_at(home) as instance:
        return materialize_shard(instance, data_root, shard_id, selection, raise_on_error=False)


def status_json(capsys, home, data_root, shard_id) -> dict:
    status = run(["shard", "status", shard_id, "--json", "--dagster-home", str(home), "--data-root", data_root.url])
    out = capsys.readouterr().out
    assert status == 0, out
    return json.loads(out)


def test_status_of_a_landed_shard_never_materialized_nor_registered(dagster_home, data_root, capsys):
    build_sample_shard(data_root, "s1", 4, seed=3, long_recordings=0)
    report = status_json(capsys, dagster_home, data_root, "s1")

    assert report["shard"] == "s1" and report["registered"] is False
    landing = report["landing"]
    assert landing["present"] and landing["complete"]
    assert landing["fingerprint"] == shard_content_fingerprint(data_root, "s1")
    assert {"metadata.parquet", "_SUCCESS"} <= {f["path"] for f in landing["files"]}
    assert all(f["size_bytes"] >= 0 for f in landing["files"])
    assert [a["asset"] for a in report["assets"]] == shard_asset_keys(defs)
    assert {a["status"] for a in report["assets"]} == {NEVER_MATERIALIZED}


def test_status_shows_materializations_with_run_and_versions_and_the_ledgers(dagster_home, data_root, capsys):
    build_sample_shard(data_root, "s1", 6, seed=1, long_recordings=0, with_faults=True)
    result = materialize(dagster_home, data_root, "s1", [raw_shards, normalized_audio, vad_segments])
    assert result.success
    report = status_json(capsys, dagster_home, data_root, "s1")

    assert report["registered"] is True
    by_asset = {a["asset"]: a for a in report["assets"]}
    for asset in (raw_shards, normalized_audio, vad_segments):
        state = by_asset[asset.key.to_user_string()]
        assert state["status"] == "materialized" and state["run_id"] == result.run_id
        assert state["code_version"] == asset.code_versions_by_key[asset.key]
        assert state["data_version"] and state["timestamp"].endswith("+00:00")
    assert by_asset["shard_manifest"]["status"] == NEVER_MATERIALIZED

    ledgers = shard_ledgers(data_root, "s1")
    assert report["ledgers"]["vad"]["balanced"] is True
    assert report["ledgers"]["vad"]["landed"] == ledgers["vad"].landed > 0
    assert set(report["ledgers"]["vad"]["rejects_by_reason"]) == set(FAULT_REASONS)

    # The same state for a person: the asset table and speechdata.accounting.ledgers' own table.
    assert run(["shard", "status", "s1", "--dagster-home", str(dagster_home), "--data-root", data_root.url]) == 0
    text = capsys.readouterr().out
    assert f"| raw_shards | materialized | {by_asset['raw_shards']['timestamp']} | {result.run_id} |" in text
    assert ledger_markdown(ledgers) in text
    assert "registered: yes" in text


def test_status_of_a_failed_shard_names_the_reason_and_the_step_not_executed(dagster_home, data_root, capsys):
    land_shard_with_string_start_s(data_root, "bad")
    result = materialize(dagster_home, data_root, "bad", [raw_shards, normalized_audio])
    assert not result.success
    report = status_json(capsys, dagster_home, data_root, "bad")

    by_asset = {a["asset"]: a for a in report["assets"]}
    failed = by_asset["raw_shards"]
    assert failed["status"] == "failed" and failed["run_id"] == result.run_id
    assert failed["failure"].startswith("Shard 'bad' breaks the landing contract")
    assert "'start_s'" in failed["failure"] and "must be of type double, found string" in failed["failure"]
    assert by_asset["normalized_audio"]["status"] == "failed"
    assert by_asset["normalized_audio"]["failure"].startswith("not executed, upstream failed")


def test_status_refuses_a_shard_id_that_leaves_the_data_root_and_a_missing_instance(dagster_home, data_root, capsys):
    data_root.fs.makedirs(data_root.root, exist_ok=True)
    # An invalid shard id is a usage error, refused by the key validator before anything is read.
    with pytest.raises(SystemExit) as refused:
        run(["shard", "status", "../../etc", "--dagster-home", str(dagster_home), "--data-root", data_root.url])
    assert refused.value.code == 2
    assert "../../etc" in capsys.readouterr().err

    missing = dagster_home.parent / "no_home"
    assert run(["shard", "status", "s1", "--dagster-home", str(missing), "--data-root", data_root.url]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert str(missing) in line and "no Dagster instance" in line


@pytest.fixture
def make_dev_checkout(tmp_path, monkeypatch):
    """A checkout where ``make dev`` ran: ``./.dagster_home`` and no ``DAGSTER_HOME`` in the shell."""
    checkout = tmp_path / "checkout"
    (checkout / ".dagster_home").mkdir(parents=True)
    shutil.copy(ROOT / "deploy" / "local" / "dagster.yaml", checkout / ".dagster_home" / "dagster.yaml")
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(checkout)
    return checkout


def test_status_finds_make_devs_instance_and_says_how_shards_get_registered(make_dev_checkout, data_root, capsys):
    build_sample_shard(data_root, "s1", 4, seed=3, long_recordings=0)
    assert run(["shard", "status", "s1", "--json", "--data-root", data_root.url]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["instance"] == str(make_dev_checkout / ".dagster_home")
    assert report["registered"] is False
    assert "landed but not registered" in report["hint"] and "landing sensor" in report["hint"]
    assert "landing/s1/_SUCCESS" in report["hint"] and "make dev" in report["hint"]

    # Registered in that instance: no hint, and the text names the instance it read.
    with instance_at(make_dev_checkout / ".dagster_home") as instance:
        instance.add_dynamic_partitions(shard_partitions.name, ["s1"])
    assert run(["shard", "status", "s1", "--data-root", data_root.url]) == 0
    text = capsys.readouterr().out
    assert f"instance: {make_dev_checkout / '.dagster_home'}" in text
    assert "registered: yes" in text and "hint:" not in text


def test_status_of_an_unregistered_shard_says_what_registers_it_at_each_landing_stage(
    make_dev_checkout, data_root, capsys
):
    data_root.fs.makedirs(data_root.root, exist_ok=True)
    assert run(["shard", "status", "s2", "--data-root", data_root.url]) == 0
    text = capsys.readouterr().out
    assert "registered: no" in text
    [hint] = [line for line in text.splitlines() if line.startswith("hint: ")]
    assert "neither landed nor registered" in hint and "speechdata land" in hint and "landing sensor" in hint

    build_sample_shard(data_root, "s2", 4, seed=3, long_recordings=0)
    data_root.fs.rm(data_root.path("landing/s2/_SUCCESS"))
    assert run(["shard", "status", "s2", "--json", "--data-root", data_root.url]) == 0
    hint = json.loads(capsys.readouterr().out)["hint"]
    assert "not complete (no landing/s2/_SUCCESS yet)" in hint and "speechdata land" in hint


def test_status_without_any_instance_says_make_dev_creates_one(tmp_path, monkeypatch, data_root, capsys):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    data_root.fs.makedirs(data_root.root, exist_ok=True)
    assert run(["shard", "status", "s1", "--data-root", data_root.url]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "neither --dagster-home nor $DAGSTER_HOME is set" in line
    assert str(tmp_path / ".dagster_home") in line and "make dev" in line


def test_status_of_an_unusable_instance_is_one_error_naming_the_instance(tmp_path, monkeypatch, data_root, capsys):
    home = tmp_path / "broken_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("storage:\n  no_such_storage: 1\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    data_root.fs.makedirs(data_root.root, exist_ok=True)
    assert run(["shard", "status", "s1", "--data-root", data_root.url]) == 1
    error = capsys.readouterr().err
    assert error.startswith("speechdata shard status: error: DagsterInvalidConfigError")
    assert f"(instance {home})" in error and "Traceback" not in error
