"""Operating from the UI against a real `dagster dev`: backfills over partly-done shards, a code
change that marks partitions stale, a backfill of the stale set, and the pages a person reads,
checked and photographed in headless Chromium. One `dagster dev` serves every test of the module."""

import json
import math
import os
import time
from pathlib import Path

import pytest

from assets.shard_runs import GPU_SHARDS_PER_RUN
from speechdata.io.storage import DataRoot
from speechdata.testing.shards import build_sample_shard
from tests import spec_snapshot
from tests.dagster_home import instance_at
from tests.e2e.dagster_dev import ROOT, DagsterDev
from tests.e2e.ui_operations import (
    add_shard_partition,
    backfill_runs,
    code_version,
    downstream_closure,
    launch_backfill,
    materializations_by_partition,
    stale_status,
    wait_for_backfill,
)
from tests.e2e.versioned_definitions import OVERRIDES_ENV
from tests.integration.test_ingest_assets import land_shard_with_string_start_s

pytestmark = pytest.mark.e2e

SHARDS = ["ui-0", "ui-1", "ui-2"]
FAULTY_SHARD = "ui-2"  # lands one row per fault reason: raw_shards' rejects sample shows them
BAD_SHARD = "ui-bad"  # breaks the landing contract: its run fails with the reason
SHARD_POLICY_TEXT = f"Backfills in multiple runs, with a maximum of {GPU_SHARDS_PER_RUN} partitions per run"
# From the reviewed spec snapshot (tests/definitions_snapshot.json), not kept by hand here.
SHARD_ASSETS = spec_snapshot.job_asset_keys("per_shard_job")
GPU_ASSETS = set(spec_snapshot.gpu_asset_keys()) & set(SHARD_ASSETS)
TRANSLATION_ASSETS = spec_snapshot.job_asset_keys("translation_job")
BACKFILL_TIMEOUT_S = 420
SCREENSHOTS = ROOT / "docs" / "operator_guide"
SCREENSHOTS_ENV = "SPEECHDATA_SCREENSHOTS_DIR"


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """`dagster dev` on a temporary home and data root, three tiny shards registered as partitions.

    Sensors tick once at start and then sleep: the shards are registered through the UI's API and
    materialized by backfills only, so every run this module sees is one it launched.
    """
    tmp = tmp_path_factory.mktemp("ui_session")
    overrides = tmp / "code_versions.json"
    workspace = tmp / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: tests.e2e.versioned_definitions\n"
        f"      working_directory: {ROOT}\n      location_name: speech_data_platform\n"
    )
    env = {
        OVERRIDES_ENV: str(overrides),
        "SPEECHDATA_LANDING_SENSOR_INTERVAL_S": "86400",
        "SPEECHDATA_CATALOG_SENSOR_INTERVAL_S": "86400",
        "SPEECHDATA_PUBLISHING_SENSOR_INTERVAL_S": "86400",
    }
    data_root = DataRoot(str(tmp / "data"))
    for i, shard_id in enumerate(SHARDS):
        # No _SUCCESS marker: the landing sensor leaves them alone; the operator registers them.
        build_sample_shard(
            data_root, shard_id, 2, seed=10 + i, long_recordings=0, complete=False, with_faults=shard_id == FAULTY_SHARD
        )
    land_shard_with_string_start_s(data_root, BAD_SHARD)
    (tmp / "data" / "landing" / BAD_SHARD / "_SUCCESS").unlink(missing_ok=True)
    with DagsterDev(tmp / "dagster_home", tmp / "data", env, workspace=workspace) as dev:
        for shard_id in [*SHARDS, BAD_SHARD]:
            add_shard_partition(dev, shard_id)
        yield {"dev": dev, "overrides": overrides, "backfills": {}}


def materialize_index_in_process(dev: DagsterDev, shard_id: str) -> None:
    import dagster as dg

    from assets.ingest import raw_shards
    from tests.tiny_resources import tiny_resources_for

    with instance_at(dev.dagster_home) as instance:
        result = dg.materialize(
            [raw_shards],
            partition_key=shard_id,
            instance=instance,
            resources=tiny_resources_for(str(dev.data_root)),
            tags={"speechdata/launched_by": "e2e-notebook"},
        )
    assert result.success


def downstream_in_the_snapshot(root: str, within: list[str]) -> set[str]:
    """``root`` and every asset of ``within`` downstream of it, by the deps of the spec snapshot."""
    deps = {key: set(asset["deps"]) for key, asset in spec_snapshot.stored_spec()["assets"].items()}
    closure = {root}
    while grown := {key for key in within if deps[key] & closure} - closure:
        closure |= grown
    return closure


def materialization_counts(dev: DagsterDev, assets: list[str]) -> dict[str, dict[str, int]]:
    return {
        asset: {shard: len(runs) for shard, runs in materializations_by_partition(dev, asset).items()}
        for asset in assets
    }


def test_backfill_over_partly_done_shards_materializes_each_partition_once(session):
    dev = session["dev"]
    # Shard ui-0 is partly done: its index was built earlier, on its own (from a notebook, say).
    materialize_index_in_process(dev, "ui-0")
    before = materialization_counts(dev, SHARD_ASSETS)
    assert before["raw_shards"] == {"ui-0": 1}

    started = time.monotonic()
    backfill_id = launch_backfill(dev, SHARD_ASSETS, SHARDS, {"speechdata/launched_by": "e2e-backfill"})
    assert wait_for_backfill(dev, backfill_id, BACKFILL_TIMEOUT_S) == "COMPLETED_SUCCESS"
    session["backfills"]["first"] = backfill_id
    print(f"backfill of {len(SHARDS)} shards x {len(SHARD_ASSETS)} assets: {time.monotonic() - started:.0f} s")

    after = materialization_counts(dev, SHARD_ASSETS)
    for asset in SHARD_ASSETS:
        for shard in SHARDS:
            # One new materialization per asset and shard: the done one re-runs, none runs twice.
            assert after[asset].get(shard, 0) - before[asset].get(shard, 0) == 1, (asset, shard, after[asset])

    runs = backfill_runs(dev, backfill_id)
    assert runs and all(run["status"] == "SUCCESS" for run in runs), runs
    assert all(run["tags"]["speechdata/launched_by"] == "e2e-backfill" for run in runs)
    gpu_runs = [run for run in runs if run["assets"] & GPU_ASSETS]
    assert 1 <= len(gpu_runs) <= math.ceil(len(SHARDS) / GPU_SHARDS_PER_RUN), gpu_runs
    # The GPU assets of a run share its shard range: each model loaded once for up to k shards.
    assert all(run["assets"] & GPU_ASSETS == GPU_ASSETS for run in gpu_runs)
    assert sum(len(run["assets"]) for run in runs) == len(SHARD_ASSETS) * len(gpu_runs), "one wave of runs"
    assert {s: v for s, v in stale_status(dev, SHARD_ASSETS, SHARDS).items() if set(v.values()) != {"FRESH"}} == {}


def test_code_version_change_marks_partitions_stale_and_a_backfill_reruns_only_them(session):
    dev = session["dev"]
    assert "first" in session["backfills"], "needs the first backfill"
    new_version = code_version(dev, "frame_grids") + "+e2e-rule-2"
    session["overrides"].write_text(json.dumps({"frame_grids": new_version}))
    dev.reload_location()
    assert code_version(dev, "frame_grids") == new_version

    statuses = stale_status(dev, SHARD_ASSETS, SHARDS)
    stale = {asset for asset, by_shard in statuses.items() if "STALE" in by_shard.values()}
    assert stale == {"frame_grids"}, statuses
    assert set(statuses["frame_grids"].values()) == {"STALE"}

    rerun = downstream_closure(dev, stale, SHARD_ASSETS)
    assert rerun == downstream_in_the_snapshot("frame_grids", SHARD_ASSETS)
    before = materialization_counts(dev, SHARD_ASSETS)
    started = time.monotonic()
    backfill_id = launch_backfill(dev, sorted(rerun), SHARDS, {"speechdata/launched_by": "e2e-stale-backfill"})
    assert wait_for_backfill(dev, backfill_id, BACKFILL_TIMEOUT_S) == "COMPLETED_SUCCESS"
    session["backfills"]["stale"] = backfill_id
    print(f"stale backfill: {time.monotonic() - started:.0f} s")

    after = materialization_counts(dev, SHARD_ASSETS)
    for asset in SHARD_ASSETS:
        for shard in SHARDS:
            expected = 1 if asset in rerun else 0
            assert after[asset][shard] - before[asset][shard] == expected, (asset, shard)
    statuses = stale_status(dev, SHARD_ASSETS, SHARDS)
    assert {a: v for a, v in statuses.items() if set(v.values()) != {"FRESH"}} == {}, statuses


def test_materialize_all_on_a_shard_through_the_daemon_is_green_with_every_ledger_balanced(session):
    """The UI's "Materialize all" on one shard partition: every shard-partitioned asset, the
    translation ones included, with no LLM segmentation landed."""
    from speechdata.accounting.ledgers import PRODUCT_STAGES, shard_ledgers

    dev = session["dev"]
    assert "first" in session["backfills"], "needs the first backfill"
    every_shard_asset = [*SHARD_ASSETS, *TRANSLATION_ASSETS]
    backfill_id = launch_backfill(dev, every_shard_asset, ["ui-1"], {"speechdata/launched_by": "e2e-materialize-all"})
    assert wait_for_backfill(dev, backfill_id, BACKFILL_TIMEOUT_S) == "COMPLETED_SUCCESS"
    runs = backfill_runs(dev, backfill_id)
    assert runs and all(run["status"] == "SUCCESS" for run in runs), runs
    assert set().union(*(run["assets"] for run in runs)) == set(every_shard_asset)

    ledgers = shard_ledgers(DataRoot(str(dev.data_root)), "ui-1")
    # hf is built per country (hf_dataset), never by a shard's "Materialize all": no hf output yet.
    assert set(ledgers) == set(PRODUCT_STAGES) - {"hf"}
    assert all(ledger.balanced for ledger in ledgers.values()), ledgers
    # With no segmentation landed, every translation reject is no_segmentation, but for the utterances
    # the quality filter left out first (the sample shards reuse their clips: near-duplicates of ui-0).
    from collections import Counter

    from speechdata.quality.decisions import excluded_utterances

    excluded = excluded_utterances(DataRoot(str(dev.data_root)), "ui-1", "translation")
    expected = Counter(excluded[u][0] if u in excluded else "no_segmentation" for u in utterance_ids(dev, "ui-1"))
    assert ledgers["translation"].rejects_by_reason == dict(expected)
    assert "no_segmentation" not in ledgers["bridge"].rejects_by_reason


def test_the_shard_commands_launch_a_run_and_a_backfill_the_daemon_processes(session, capsys):
    """``speechdata shard run`` and ``speechdata shard backfill`` against the webserver: the runs and
    the backfill are the daemon's (queued, launched, finished), tagged with who launched them, and
    ``--wait`` exits 1 for the shard whose run fails and 0 for the backfill that succeeds."""
    from dagster_project.webserver_launch import Webserver, choose_shards, materialized_shards, registered_shards
    from speechdata.cli import run

    dev = session["dev"]
    assert "first" in session["backfills"], "needs the first backfill"
    common = ["--url", dev.base_url, "--data-root", str(dev.data_root), "--quiet"]

    web = Webserver(dev.base_url)
    registered = registered_shards(web, "raw_shards")
    assert sorted(registered) == sorted([*SHARDS, BAD_SHARD])
    missing = choose_shards(registered, materialized=materialized_shards(web, ["raw_shards"]))
    assert missing == [BAD_SHARD]

    status = run(["shard", "run", "--missing", "--select", "raw_shards", "--wait", "--launched-by", "e2e-cli", *common])
    out = capsys.readouterr().out
    assert status == 1, out
    [run_id] = [line.split()[1] for line in out.splitlines() if line.startswith("run ") and line.endswith("FAILURE")]
    assert f"{dev.base_url}/runs/{run_id}" in out
    [failed] = [r for r in dev.runs() if r["runId"] == run_id]
    tags = {tag["key"]: tag["value"] for tag in failed["tags"]}
    assert (failed["status"], tags["dagster/partition"], tags["speechdata/launched_by"]) == (
        "FAILURE",
        BAD_SHARD,
        "e2e-cli",
    )
    session["failed_run"] = run_id

    before = materialization_counts(dev, ["raw_shards", "normalized_audio"])
    status = run(
        [
            "shard",
            "backfill",
            "--matching",
            "ui-[01]",
            "--group",
            "ingest",
            "--wait",
            "--launched-by",
            "e2e-cli",
            *common,
        ]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    [backfill_id] = [
        line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("backfill ") and "/runs/b/" in line
    ]
    assert f"backfill {backfill_id}: COMPLETED_SUCCESS" in out
    runs = backfill_runs(dev, backfill_id)
    assert runs and all(r["status"] == "SUCCESS" and r["tags"]["speechdata/launched_by"] == "e2e-cli" for r in runs)
    after = materialization_counts(dev, ["raw_shards", "normalized_audio"])
    for asset in ("raw_shards", "normalized_audio"):
        assert {shard: after[asset][shard] - before[asset].get(shard, 0) for shard in after[asset]} == {
            "ui-0": 1,
            "ui-1": 1,
            "ui-2": 0,
        }, asset


def screenshot_dirs(tmp_path) -> list:
    """Where the pictures go: the test's tmp dir, $SPEECHDATA_SCREENSHOTS_DIR when set, and
    docs/operator_guide/ with SPEECHDATA_UPDATE_SCREENSHOTS=1 (the pictures the docs show)."""
    dirs = [tmp_path / "screenshots"]
    if os.environ.get(SCREENSHOTS_ENV):
        dirs.append(Path(os.environ[SCREENSHOTS_ENV]))
    if os.environ.get("SPEECHDATA_UPDATE_SCREENSHOTS") == "1":
        dirs.append(SCREENSHOTS)
    for folder in dirs:
        folder.mkdir(parents=True, exist_ok=True)
    return dirs


def wait_for_texts(page, expected: list[str], timeout_s: float = 45) -> str:
    """The page's text once every expected string is in it; fails naming the missing ones."""
    deadline = time.monotonic() + timeout_s
    while True:
        dismiss_welcome_dialog(page)
        text = page.inner_text("body")
        missing = [word for word in expected if word.lower() not in text.lower()]
        if not missing:
            return text
        if time.monotonic() > deadline:
            raise AssertionError(f"{page.url}: {missing} not shown; the page reads: {text[:3000]}")
        page.wait_for_timeout(1000)


def photograph(page, dirs: list, name: str) -> None:
    # The texts are asserted before (wait_for_texts); the pause only lets the graph and tables settle
    # for a picture someone looks at: the docs' (SPEECHDATA_UPDATE_SCREENSHOTS=1) or a kept folder's.
    kept = os.environ.get("SPEECHDATA_UPDATE_SCREENSHOTS") == "1" or os.environ.get(SCREENSHOTS_ENV)
    page.wait_for_timeout(1500 if kept else 200)
    for folder in dirs:
        page.screenshot(path=str(folder / name), full_page=True)


def test_the_ui_shows_the_asset_graph_a_partition_and_the_backfill_in_chromium(session, tmp_path):
    """Load the pages an operator reads, assert the asset names, statuses, reasons and metadata in
    them, then photograph each: a failed shard's run with its reason, raw_shards' rejects sample,
    shard_manifest's ledger table and histograms, an output's column descriptions, the backfill
    dialog's one policy."""
    from assets.reporting import COLUMN_DESCRIPTIONS
    from speechdata.testing.shards import FAULT_REASONS
    from tests.e2e.browser import chromium_page

    dev = session["dev"]
    backfill_id = session["backfills"].get("stale") or session["backfills"].get("first")
    assert backfill_id, "needs a backfill"
    failed_run = session.get("failed_run")
    assert failed_run, "needs the failed run of the shard commands' test"
    dirs = screenshot_dirs(tmp_path)
    pages = [
        # (file, path, texts that must appear: asset names, statuses, reasons, metadata and check names)
        (
            "asset_graph.png",
            "/assets/shard_manifest?view=lineage&lineageScope=upstream&lineageDepth=8",
            ["raw_shards", "normalized_audio", "frame_grids", "qwen_hidden_states", "wavlm_features", "shard_manifest"],
        ),
        (
            "partition_page.png",
            "/assets/frame_grids?view=partitions&partition=ui-1",
            ["ui-0", "ui-1", "ui-2", "Materialized", "zero_duration_token_share"],
        ),
        ("backfill.png", f"/runs/b/{backfill_id}", ["Succeeded", "ui-0", "ui-1", "ui-2"]),
        # The events list shows one entry per run, named by one of its shards: which one follows
        # Dagster's order of the run's partitions, so no shard id is asserted here.
        ("asset_events.png", "/assets/normalized_audio?view=events", ["normalized_audio", "materialized in run"]),
        (
            "failed_run_reason.png",
            f"/runs/{failed_run}",
            [
                "Failure",
                f"partition: {BAD_SHARD}",
                f"Shard '{BAD_SHARD}' breaks the landing contract",
                "'start_s'",
                "must be of type double, found string",
            ],
        ),
        (
            "rejects_sample.png",
            f"/assets/raw_shards?view=partitions&partition={FAULTY_SHARD}",
            ["rejects_sample", "reason", "detail", *FAULT_REASONS, "duration_s_histogram"],
        ),
        (
            "ledger_table.png",
            "/assets/shard_manifest?view=partitions&partition=ui-1",
            [
                "ledgers",
                "rejects by reason",
                "bridge",
                "asr",
                "vad",
                "unbalanced_products",
                "duration_s_histogram",
                "alignment_score_histogram",
            ],
        ),
        (
            "column_descriptions.png",
            "/assets/raw_shards",
            [
                "Columns",
                "Column name",
                "Description",
                "utt_id",
                COLUMN_DESCRIPTIONS["utt_id"],
                "duration_s",
                COLUMN_DESCRIPTIONS["duration_s"],
            ],
        ),
    ]
    with chromium_page() as page:
        for name, path, expected in pages:
            page.goto(dev.base_url + path, wait_until="load", timeout=60_000)
            wait_for_texts(page, expected)
            photograph(page, dirs, name)
        photograph_the_backfill_dialog_policy(page, dev, dirs)
    for folder in dirs:
        names = {p.name for p in folder.glob("*.png")}
        assert {name for name, _, _ in pages} | {"backfill_dialog_policy.png"} <= names, folder


def photograph_the_backfill_dialog_policy(page, dev: DagsterDev, dirs: list) -> None:
    """The ingest group's "Materialize all" on every shard: the dialog's preview lists each selected
    asset with the one shard backfill policy (the dialog's own notice says "varying" for any two
    assets in Dagster 1.13: it compares the policies by reference, docs/operating-the-ui.md)."""
    page.goto(dev.base_url + "/locations/speech_data_platform/asset-groups/ingest", wait_until="load", timeout=60_000)
    wait_for_texts(page, ["raw_shards", "normalized_audio", "Materialize all"])
    page.get_by_role("button", name="Materialize all").first.click()
    wait_for_texts(page, ["Partition selection", "Launch"])
    page.get_by_role("button", name="All", exact=True).first.click()
    wait_for_texts(page, [f"{len(SHARDS) + 1} partitions"])
    page.get_by_text("Preview", exact=True).first.click()
    text = wait_for_texts(
        page, ["Backfill preview", "Backfill policy", "raw_shards", "normalized_audio", SHARD_POLICY_TEXT]
    )
    preview = text[text.index("Backfill preview") :]
    assert preview.count(SHARD_POLICY_TEXT) == 2, preview[:2000]
    photograph(page, dirs, "backfill_dialog_policy.png")


def dismiss_welcome_dialog(page) -> None:
    """A fresh browser profile gets Dagster's community dialog once; skip it."""
    skip = page.get_by_role("button", name="Skip")
    if skip.count() and skip.first.is_visible():
        skip.first.click()


def utterance_ids(dev, shard_id: str) -> list[str]:
    """The shard's indexed utterances (raw_shards' utterance index)."""
    from speechdata.io import layout

    return (
        DataRoot(str(dev.data_root))
        .read_parquet(layout.utterance_index(shard_id), columns=["utt_id"])["utt_id"]
        .to_pylist()
    )
