"""What an operator does in the Dagster UI, as the GraphQL calls the UI itself makes.

Assets are named by key (``{"path": [...]}``), never by a selection string: the server would parse
a string with the antlr runtime NeMo pins, which is too old for Dagster's grammar.
"""

from __future__ import annotations

import time

from tests.e2e.dagster_dev import DagsterDev

LOCATION = "speech_data_platform"
REPOSITORY = {"repositoryLocationName": LOCATION, "repositoryName": "__repository__"}
FINISHED_BACKFILL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def add_shard_partition(dev: DagsterDev, shard_id: str) -> None:
    """The partitions page's "Add partition" button."""
    data = dev.query(ADD_PARTITION, {"repo": REPOSITORY, "name": "shard", "key": shard_id})
    result = data["addDynamicPartition"]
    assert result["__typename"] == "AddDynamicPartitionSuccess", result


def launch_backfill(dev: DagsterDev, assets: list[str], shards: list[str], tags: dict[str, str]) -> str:
    """The "Materialize" dialog for a set of assets and partitions, with run tags."""
    params = {
        "assetSelection": [{"path": [asset]} for asset in assets],
        "partitionNames": shards,
        "tags": [{"key": key, "value": value} for key, value in tags.items()],
        "title": tags.get("speechdata/launched_by", ""),
    }
    result = dev.query(LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
    assert result["__typename"] == "LaunchBackfillSuccess", result
    return result["backfillId"]


def wait_for_backfill(dev: DagsterDev, backfill_id: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    status = None
    while time.monotonic() < deadline:
        status = dev.query(BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"]["status"]
        if status in FINISHED_BACKFILL:
            return status
        time.sleep(2)
    raise TimeoutError(
        f"backfill {backfill_id} still {status} after {timeout_s} s; runs {dev.runs()}\n{dev.log_tail()}"
    )


def backfill_runs(dev: DagsterDev, backfill_id: str) -> list[dict]:
    """Each run of the backfill: id, status, tags and the asset keys it materialized."""
    data = dev.query(BACKFILL_RUNS, {"filter": {"tags": [{"key": "dagster/backfill", "value": backfill_id}]}})
    runs = data["runsOrError"]["results"]
    for run in runs:
        run["assets"] = {"/".join(key["path"]) for key in run.pop("assetSelection") or []}
        run["tags"] = {tag["key"]: tag["value"] for tag in run["tags"]}
    return runs


def materializations_by_partition(dev: DagsterDev, asset: str) -> dict[str, list[str]]:
    """Partition -> run ids of its materializations (newest first)."""
    by_partition: dict[str, list[str]] = {}
    data = dev.query(MATERIALIZATIONS, {"path": [asset]})["assetOrError"]
    for event in data.get("assetMaterializations", []):
        by_partition.setdefault(event["partition"], []).append(event["runId"])
    return by_partition


def stale_status(dev: DagsterDev, assets: list[str], shards: list[str]) -> dict[str, dict[str, str]]:
    """asset -> shard -> FRESH / STALE / MISSING, as the asset and partition pages show it."""
    data = dev.query(STALE_STATUS, {"keys": [{"path": [a]} for a in assets], "partitions": shards})
    return {
        "/".join(node["assetKey"]["path"]): dict(zip(shards, node["staleStatusByPartition"]))
        for node in data["assetNodes"]
    }


def downstream_closure(dev: DagsterDev, roots: set[str], within: list[str]) -> set[str]:
    """The roots and every asset of ``within`` that depends on them: what becomes stale once they re-run."""
    data = dev.query(DEPENDENTS, {"keys": [{"path": [a]} for a in within]})
    children = {
        "/".join(node["assetKey"]["path"]): {"/".join(k["path"]) for k in node["dependedByKeys"]}
        for node in data["assetNodes"]
    }
    closure, frontier = set(roots), list(roots)
    while frontier:
        for child in children.get(frontier.pop(), set()) & set(within):
            if child not in closure:
                closure.add(child)
                frontier.append(child)
    return closure


def code_version(dev: DagsterDev, asset: str) -> str:
    data = dev.query(CODE_VERSION, {"keys": [{"path": [asset]}]})
    return data["assetNodes"][0]["opVersion"]


ADD_PARTITION = """
mutation Add($repo: RepositorySelector!, $name: String!, $key: String!) {
  addDynamicPartition(repositorySelector: $repo, partitionsDefName: $name, partitionKey: $key) {
    __typename ... on PythonError { message } ... on UnauthorizedError { message } } }
"""

LAUNCH_BACKFILL = """
mutation Launch($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message stack }
  ... on InvalidStepError { invalidStepKey } ... on InvalidOutputError { invalidOutputName } } }
"""

BACKFILL_STATUS = """
query Status($id: String!) { partitionBackfillOrError(backfillId: $id) {
  __typename ... on PartitionBackfill { status } } }
"""

BACKFILL_RUNS = """
query Runs($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results {
  runId status tags { key value } assetSelection { path } } } } }
"""

MATERIALIZATIONS = """
query M($path: [String!]!) { assetOrError(assetKey: {path: $path}) {
  ... on Asset { assetMaterializations { partition runId } } } }
"""

STALE_STATUS = """
query Stale($keys: [AssetKeyInput!], $partitions: [String!]) { assetNodes(assetKeys: $keys) {
  assetKey { path } staleStatusByPartition(partitions: $partitions) } }
"""

DEPENDENTS = """
query Deps($keys: [AssetKeyInput!]) { assetNodes(assetKeys: $keys) { assetKey { path } dependedByKeys { path } } }
"""

CODE_VERSION = """
query V($keys: [AssetKeyInput!]) { assetNodes(assetKeys: $keys) { opVersion } }
"""
