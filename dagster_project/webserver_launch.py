"""Runs and backfills launched through the Dagster webserver, as the UI launches them.

The same GraphQL mutations the UI's Materialize dialog sends (``launchPipelineExecution`` for one
run per shard, ``launchPartitionBackfill`` for a backfill), so what a shell launches is in the UI's
Runs and Backfills pages, queued by the run coordinator and processed by the daemon like any other.
Assets are named by key, never by a selection string: the server would parse a string with the
antlr runtime NeMo pins, which is too old for Dagster's grammar.
"""

from __future__ import annotations

import fnmatch
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from assets.partitions import PER_SHARD_JOB_NAME, shard_partitions

ASSET_JOB = "__ASSET_JOB"
"""The job Dagster builds over every asset: what the UI launches a selection of assets in."""
FINISHED_RUN = {"SUCCESS", "FAILURE", "CANCELED"}
FINISHED_BACKFILL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}
SUCCESSFUL_BACKFILL = {"COMPLETED", "COMPLETED_SUCCESS"}
POLL_S = 2.0


class WebserverError(RuntimeError):
    """The webserver is unreachable, or refused what was asked (its message included)."""


class SelectionError(ValueError):
    """The command names an asset, a group or a shard the code location does not have."""


@dataclass(frozen=True)
class AssetNode:
    name: str
    group: str
    shard_partitioned: bool
    location: str
    repository: str
    deps: tuple[str, ...] = ()
    """The assets it reads (its upstream), by name."""
    jobs: tuple[str, ...] = ()
    """The named jobs it is in (``per_shard_job`` for what the landing sensor runs)."""


class Webserver:
    """A Dagster webserver's GraphQL endpoint (``make dev``: http://localhost:3000)."""

    def __init__(self, url: str, timeout_s: float = 60):
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def run_url(self, run_id: str) -> str:
        return f"{self.url}/runs/{run_id}"

    def backfill_url(self, backfill_id: str) -> str:
        return f"{self.url}/runs/b/{backfill_id}"

    def query(self, query: str, variables: dict | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                payload = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            raise WebserverError(f"the Dagster webserver at {self.url} answered HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise WebserverError(
                f"no Dagster webserver at {self.url} ({getattr(exc, 'reason', exc)}); start one with "
                "'make dev', or name it with --url or $DAGSTER_WEBSERVER_URL"
            ) from exc
        if payload.get("errors"):
            raise WebserverError(f"the Dagster webserver at {self.url} refused the query: {payload['errors']}")
        return payload["data"]


def asset_nodes(web: Webserver) -> dict[str, AssetNode]:
    """Every materializable asset of the webserver's code locations, by name."""
    nodes = {}
    for node in web.query(ASSET_NODES)["assetNodes"]:
        if not node["isMaterializable"]:
            continue
        dimensions = (node["partitionDefinition"] or {}).get("dimensionTypes") or []
        name = "/".join(node["assetKey"]["path"])
        nodes[name] = AssetNode(
            name=name,
            group=node["groupName"],
            shard_partitioned=[d["dynamicPartitionsDefinitionName"] for d in dimensions] == [shard_partitions.name],
            location=node["repository"]["location"]["name"],
            repository=node["repository"]["name"],
            deps=tuple("/".join(dep["path"]) for dep in node["dependencyKeys"]),
            jobs=tuple(node["jobNames"]),
        )
    return nodes


def select_assets(
    nodes: dict[str, AssetNode],
    names: Iterable[str] = (),
    groups: Iterable[str] = (),
    *,
    before: str | None = None,
    after: str | None = None,
) -> list[str]:
    """The shard assets named, plus those of the groups named; every shard asset when neither is given.

    ``before`` / ``after`` (an asset's name) split the landing flow at that asset: ``before`` keeps
    the assets it reads, directly or not; ``after`` keeps every other one but the asset itself, so the
    two sides and the asset make the whole. With neither names nor groups they split ``per_shard_job``
    (what the landing sensor runs), so a first import can run the two sides around a whole-corpus pass
    of the asset (docs/deploying.md)."""
    names, groups = list(names), list(groups)
    unknown = [name for name in names if name not in nodes]
    if unknown:
        known = ", ".join(sorted(n for n, node in nodes.items() if node.shard_partitioned))
        raise SelectionError(f"no asset named {', '.join(unknown)} (the shard assets: {known})")
    unknown_groups = sorted(set(groups) - {node.group for node in nodes.values()})
    if unknown_groups:
        known = ", ".join(sorted({node.group for node in nodes.values()}))
        raise SelectionError(f"no asset group named {', '.join(unknown_groups)} (the groups: {known})")
    not_by_shard = [name for name in names if not nodes[name].shard_partitioned]
    if not_by_shard:
        raise SelectionError(
            f"{', '.join(not_by_shard)} not partitioned by shard: launch it from the UI or its own job"
        )
    selected = set(names) | {n for n, node in nodes.items() if node.group in groups and node.shard_partitioned}
    if not names and not groups:
        selected = {n for n, node in nodes.items() if node.shard_partitioned}
        if before is not None or after is not None:
            selected = {n for n in selected if PER_SHARD_JOB_NAME in nodes[n].jobs}
    if not selected:
        raise SelectionError(f"no shard asset in the groups {', '.join(groups)}")
    if before is not None or after is not None:
        selected = _split_at(nodes, selected, before, after)
    return sorted(selected)


def _split_at(nodes: dict[str, AssetNode], selected: set[str], before: str | None, after: str | None) -> set[str]:
    """``selected`` cut at ``before`` (what it reads) or ``after`` (the rest, but it)."""
    if before is not None and after is not None:
        raise SelectionError("--before and --after: name one of them")
    pivot, option = (before, "--before") if before is not None else (after, "--after")
    if pivot in nodes and not nodes[pivot].shard_partitioned:
        raise SelectionError(f"{option} {pivot}: {pivot} is not partitioned by shard")
    if pivot not in nodes:
        known = ", ".join(sorted(n for n, node in nodes.items() if node.shard_partitioned))
        raise SelectionError(f"{option} {pivot}: no shard asset of that name (the shard assets: {known})")
    upstream = _upstream_of(nodes, pivot)
    chosen = selected & upstream if before is not None else selected - upstream - {pivot}
    if not chosen:
        side = "upstream of" if before is not None else "after"
        raise SelectionError(f"{option} {pivot}: no selected shard asset is {side} {pivot}")
    return chosen


def _upstream_of(nodes: dict[str, AssetNode], name: str) -> set[str]:
    """Every asset ``name`` reads, directly or through others."""
    upstream: set[str] = set()
    waiting = list(nodes[name].deps)
    while waiting:
        dep = waiting.pop()
        if dep not in upstream:
            upstream.add(dep)
            waiting.extend(nodes[dep].deps if dep in nodes else ())
    return upstream


def registered_shards(web: Webserver, asset: str) -> list[str]:
    """The keys of the ``shard`` dynamic partition (registered by the landing sensor or the UI)."""
    [node] = web.query(PARTITION_KEYS, {"keys": [{"path": asset.split("/")}]})["assetNodes"]
    return list(node["partitionKeys"])


def materialized_shards(web: Webserver, assets: list[str]) -> dict[str, set[str]]:
    """Asset -> the shards it has a materialization of."""
    data = web.query(PARTITION_STATUSES, {"keys": [{"path": a.split("/")} for a in assets]})["assetNodes"]
    return {
        "/".join(node["assetKey"]["path"]): set(node["assetPartitionStatuses"].get("materializedPartitions") or [])
        for node in data
    }


def choose_shards(
    registered: list[str],
    *,
    named: list[str] | None = None,
    every: bool = False,
    matching: str | None = None,
    materialized: dict[str, set[str]] | None = None,
) -> list[str]:
    """The shards a command acts on: those named, every registered one, those matching a glob, or
    (``materialized`` given) those where some selected asset has no materialization. A named shard
    that is not registered is an error naming it; a choice that finds no shard is one too."""
    if named:
        unregistered = [shard for shard in named if shard not in registered]
        if unregistered:
            raise SelectionError(
                f"shard {', '.join(unregistered)} not registered (dynamic partition '{shard_partitions.name}'): "
                "land it (speechdata land) so that landing_sensor registers it, or add the partition in the UI"
            )
        return list(dict.fromkeys(named))
    if every:
        chosen = list(registered)
    elif matching is not None:
        chosen = [shard for shard in registered if fnmatch.fnmatchcase(shard, matching)]
    elif materialized is not None:
        chosen = [shard for shard in registered if any(shard not in done for done in materialized.values())]
    else:
        raise SelectionError("name the shards: --shards a,b,c, --all, --missing or --matching GLOB")
    if not chosen:
        what = f"matching {matching!r}" if matching is not None else "missing" if materialized is not None else ""
        raise SelectionError(f"no registered shard {what}".strip() + f" ({len(registered)} registered)")
    return chosen


def launch_runs(
    web: Webserver, nodes: dict[str, AssetNode], assets: list[str], shards: list[str], tags: dict[str, str]
) -> dict[str, str]:
    """One run per shard of the selected assets (the UI's "Launch 1 run"); shard -> run id."""
    location, repository = _repository_of(nodes, assets)
    run_ids = {}
    for shard in shards:
        params = {
            "selector": {
                "repositoryLocationName": location,
                "repositoryName": repository,
                "pipelineName": ASSET_JOB,
                "assetSelection": [{"path": asset.split("/")} for asset in assets],
            },
            "mode": "default",
            "runConfigData": {},
            "executionMetadata": {"tags": _tag_list({**tags, "dagster/partition": shard})},
        }
        result = web.query(LAUNCH_RUN, {"params": params})["launchPipelineExecution"]
        if result["__typename"] != "LaunchRunSuccess":
            raise WebserverError(f"run for shard {shard} not launched: {_error_of(result)}")
        run_ids[shard] = result["run"]["runId"]
    return run_ids


def launch_backfill(web: Webserver, assets: list[str], shards: list[str], tags: dict[str, str], title: str) -> str:
    """One backfill of the selected assets over the shards (the UI's "Launch backfill"); its id."""
    params = {
        "assetSelection": [{"path": asset.split("/")} for asset in assets],
        "partitionNames": shards,
        "fromFailure": False,
        "tags": _tag_list(tags),
        "title": title,
    }
    result = web.query(LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
    if result["__typename"] != "LaunchBackfillSuccess":
        raise WebserverError(f"backfill not launched: {_error_of(result)}")
    return result["backfillId"]


def wait_for_runs(
    web: Webserver, run_ids: list[str], on_finished: Callable[[str, str], None], timeout_s: float | None = None
) -> dict[str, str]:
    """Poll until every run has finished; run id -> final status. ``on_finished(run_id, status)``
    is called once per run as it finishes."""
    statuses: dict[str, str] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while len(statuses) < len(run_ids):
        data = web.query(RUN_STATUSES, {"filter": {"runIds": run_ids}})["runsOrError"]
        for run in data.get("results", []):
            if run["status"] in FINISHED_RUN and run["runId"] not in statuses:
                statuses[run["runId"]] = run["status"]
                on_finished(run["runId"], run["status"])
        if len(statuses) < len(run_ids):
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"runs still going after {timeout_s} s: {sorted(set(run_ids) - set(statuses))}")
            time.sleep(POLL_S)
    return statuses


def wait_for_backfill(
    web: Webserver, backfill_id: str, on_progress: Callable[[int, int], None], timeout_s: float | None = None
) -> tuple[str, list[dict]]:
    """Poll until the backfill has finished; its status and its runs (id, status).
    ``on_progress(done, targeted)`` counts (asset, shard) pairs materialized or failed."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        backfill = web.query(BACKFILL_STATUS, {"id": backfill_id})["partitionBackfillOrError"]
        if backfill["__typename"] != "PartitionBackfill":
            raise WebserverError(f"backfill {backfill_id}: {_error_of(backfill)}")
        counts = [s for s in (backfill["assetBackfillData"] or {}).get("assetBackfillStatuses", []) if s]
        targeted = sum(s.get("numPartitionsTargeted", 0) for s in counts)
        done = sum(s.get("numPartitionsMaterialized", 0) + s.get("numPartitionsFailed", 0) for s in counts)
        on_progress(done, targeted)
        if backfill["status"] in FINISHED_BACKFILL:
            runs = web.query(RUN_STATUSES, {"filter": {"tags": [{"key": "dagster/backfill", "value": backfill_id}]}})
            return backfill["status"], runs["runsOrError"].get("results", [])
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"backfill {backfill_id} still {backfill['status']} after {timeout_s} s")
        time.sleep(POLL_S)


def _repository_of(nodes: dict[str, AssetNode], assets: list[str]) -> tuple[str, str]:
    repositories = {(nodes[a].location, nodes[a].repository) for a in assets}
    if len(repositories) != 1:
        raise SelectionError(f"the selected assets are in several code locations: {sorted(repositories)}")
    return repositories.pop()


def _tag_list(tags: dict[str, str]) -> list[dict[str, str]]:
    return [{"key": key, "value": value} for key, value in tags.items()]


def _error_of(result: dict) -> str:
    return result.get("message") or json.dumps(result)


ASSET_NODES = """
query { assetNodes { assetKey { path } groupName isMaterializable dependencyKeys { path } jobNames
  partitionDefinition { dimensionTypes { dynamicPartitionsDefinitionName } }
  repository { name location { name } } } }
"""

PARTITION_KEYS = """
query Keys($keys: [AssetKeyInput!]) { assetNodes(assetKeys: $keys) { partitionKeys } }
"""

PARTITION_STATUSES = """
query Statuses($keys: [AssetKeyInput!]) { assetNodes(assetKeys: $keys) { assetKey { path }
  assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions } } } }
"""

LAUNCH_RUN = """
mutation Launch($params: ExecutionParams!) { launchPipelineExecution(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on Error { message } } }
"""

LAUNCH_BACKFILL = """
mutation Launch($params: LaunchBackfillParams!) { launchPartitionBackfill(backfillParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on Error { message } } }
"""

RUN_STATUSES = """
query Runs($filter: RunsFilter) { runsOrError(filter: $filter) { ... on Runs { results { runId status } } } }
"""

BACKFILL_STATUS = """
query Backfill($id: String!) { partitionBackfillOrError(backfillId: $id) { __typename
  ... on PartitionBackfill { status assetBackfillData { assetBackfillStatuses {
    ... on AssetPartitionsStatusCounts { numPartitionsTargeted numPartitionsMaterialized numPartitionsFailed } } } }
  ... on Error { message } } }
"""
