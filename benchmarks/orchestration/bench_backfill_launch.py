"""Launching a backfill of 1 000 shards from the UI, until the backfill daemon has created its runs.

Why: re-running a model or a rule over many shards is a backfill launched from the UI's
"Materialize" dialog (the ``launchPartitionBackfill`` mutation); the backfill daemon then turns it
into runs. Both grow with the number of shards selected and registered.

In a fresh temporary directory: a persistent instance (``--storage sqlite`` or ``postgres``, as
``bench_orchestration_scale``) whose run coordinator queues runs and starts none
(``QueuedRunCoordinator``, ``max_concurrent_runs: 0``), ``--registered`` shards added as ``shard``
partitions, the workspace the daemon loads (``dagster_project.definitions`` in a code server).
As under ``dagster dev``, the webserver's and the daemon's workspaces both load the location from one
code server; it is started once per run shape (its ``SHARDS_PER_RUN``) and serves every size and
storage measured with that shape, so each measurement starts on a loaded location. Then, wall-clock:

* ``launch_seconds``: the ``launchPartitionBackfill`` mutation through ``dagster_graphql``'s
  in-process client (on an instance set up as the webserver's), selecting every per-shard asset (``PER_SHARD_SELECTION``) and the first
  ``--backfill`` shards, as the UI's dialog sends it;
* ``runs_created_seconds``: from the mutation's return, the backfill daemon's iterations
  (``dagster._daemon.backfill.execute_backfill_iteration``, what ``dagster-daemon`` runs every 30 s,
  run back to back here) until the backfill's runs all exist in the instance. The per-shard
  assets' backfill policy carries ``SHARDS_PER_RUN`` shards per run, so 1 000 shards make
  ceil(1 000 / k) runs.

Reported: both times, the runs created and the daemon iterations it took; ``per_run_ms``.

``--compare``: the run shape against the old one in one invocation. For each ``--sizes`` N
registered (default 1 000 and 100 000) and each shape (``old``: 4 shards per run, the policy before
``SHARDS_PER_RUN`` grew; ``new``: ``SHARDS_PER_RUN``), a fresh instance and the same
``--backfill`` shards; reported per shape and size ``per_run_ms`` and ``per_shard_ms``, then
``growth`` = per run at the largest N over the smallest (target <= 1.5) and ``new_over_old`` per
shard at each N. ``--profile FILE`` writes a cProfile of the daemon's iterations (one measurement).

``--storage-cache``: with ``--compare``, the instance storage instead of the run shape, all at
``SHARDS_PER_RUN``: ``plain`` (Dagster's storage), ``cached`` (``dagster_project.instance_storage``
with Dagster's event batching off: the dynamic partition list read again only when it changed, each
planned event written on its own connection) and ``batched`` (the same storage as deployed:
``DAGSTER_EVENT_BATCH_SIZE`` left to the storage, so a run's planned events are one transaction per
database). Reported ``growth`` per storage, ``cached_over_plain`` and ``batched_over_plain`` per run
at each N, and ``full_key_list_reads`` (caching storages only: the times the whole key list was
read). Alone, it measures the storage as deployed (``batched``).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import logging
import math
import os
import sys
import tempfile

import dagster as dg

from benchmarks.orchestration.bench_orchestration_scale import bench_instance, webserver_instance
from benchmarks.report import Stopwatch, emit, progress, ratio, stdout_to_stderr, timed_call
from dagster_project.instance_storage import EVENT_BATCH_SIZE, EVENT_BATCH_SIZE_ENV

LAUNCH_BACKFILL = """
mutation LaunchBackfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PythonError { message stack }
    ... on PartitionKeysNotFoundError { message }
  }
}
"""

QUEUE_ONLY = {
    "run_coordinator": {
        "module": "dagster._core.run_coordinator",
        "class": "QueuedRunCoordinator",
        "config": {"max_concurrent_runs": 0},
    }
}


def per_shard_asset_paths() -> list[list[str]]:
    from assets.partitions import PER_SHARD_SELECTION
    from dagster_project.definitions import defs

    keys = PER_SHARD_SELECTION.resolve(defs.resolve_asset_graph())
    return sorted(key.path for key in keys)


@contextlib.contextmanager
def launch_instance(home: str, storage: str, storage_cache: bool):
    """``bench_instance`` with the queue-only coordinator, on Dagster's storage or the caching one."""
    if not storage_cache:
        with bench_instance(home, storage, QUEUE_ONLY) as instance:
            yield instance
        return
    module = "dagster_project.instance_storage"
    if storage == "sqlite":
        caching = {"module": module, "class": "CachingSqliteStorage", "config": {"base_dir": home}}
        with dg.instance_for_test(temp_dir=home, overrides={**QUEUE_ONLY, "storage": {"custom": caching}}) as instance:
            yield instance
        return
    from tests.e2e.postgres_server import PostgresServer

    with PostgresServer() as server:
        postgres_db = server.postgres_db
        caching = {"module": module, "class": "CachingPostgresStorage", "config": {"postgres_db": postgres_db}}
        with dg.instance_for_test(temp_dir=home, overrides={**QUEUE_ONLY, "storage": {"custom": caching}}) as instance:
            yield instance


LOCATION_NAME = "speechdata"


@contextlib.contextmanager
def code_server(shards_per_run: int):
    """A code server for ``dagster_project.definitions`` whose backfill policy carries ``shards_per_run``
    shards per run (the variable is read when the location loads): the target the workspaces connect to."""
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.load_target import GrpcServerTarget
    from dagster._grpc.server import GrpcServerProcess

    os.environ["SPEECHDATA_BACKFILL_SHARDS_PER_RUN"] = str(shards_per_run)
    origin = LoadableTargetOrigin(
        executable_path=sys.executable, module_name="dagster_project.definitions", working_directory=os.getcwd()
    )
    with GrpcServerProcess(
        instance_ref=None,
        location_name=LOCATION_NAME,
        loadable_target_origin=origin,
        inject_env_vars_from_instance=False,
        startup_timeout=180,
        wait_on_exit=True,
    ) as server:
        yield GrpcServerTarget(host="localhost", port=server.port, socket=server.socket, location_name=LOCATION_NAME)


@contextlib.contextmanager
def code_location_workspace(instance: dg.DagsterInstance, target):
    """The workspace a webserver or daemon on ``instance`` loads from the code server at ``target``."""
    from dagster._core.workspace.context import WorkspaceProcessContext

    with WorkspaceProcessContext(instance, target) as process_context:
        yield process_context


def full_key_list_reads(instance: dg.DagsterInstance) -> int | None:
    return getattr(instance.event_log_storage, "dynamic_partitions_full_reads", None)


def one_connection_batches(instance: dg.DagsterInstance) -> int | None:
    return getattr(instance.event_log_storage, "one_connection_batches", None)


STORAGES = (("plain", False, 0), ("cached", True, 0), ("batched", True, EVENT_BATCH_SIZE))
"""``--compare --storage-cache``'s storages: name, caching storage, ``DAGSTER_EVENT_BATCH_SIZE``."""

OLD_SHARDS_PER_RUN = 4
"""The per-shard assets' backfill policy before runs grew: the old shape ``--compare`` measures against."""


def launch_backfill(instance: dg.DagsterInstance, server, partitions: list[str], assets: list[list[str]]) -> tuple:
    """Launch a backfill of ``assets`` over ``partitions`` through GraphQL, as the UI does: (seconds, its id)."""
    from dagster_graphql.test.utils import execute_dagster_graphql

    with webserver_instance(instance) as webserver, code_location_workspace(webserver, server) as webserver_context:
        params = {
            "assetSelection": [{"path": path} for path in assets],
            "partitionNames": partitions,
            "tags": [{"key": "speechdata/launched_by", "value": "bench_backfill_launch"}],
            "title": "bench_backfill_launch",
        }
        launch_s, result = timed_call(
            lambda: execute_dagster_graphql(
                webserver_context.create_request_context(), LAUNCH_BACKFILL, variables={"params": params}
            )
        )
    launched = (result.data or {}).get("launchPartitionBackfill") or {}
    if result.errors or launched.get("__typename") != "LaunchBackfillSuccess":
        raise RuntimeError(f"launchPartitionBackfill failed: {result.errors or launched}")
    progress(f"launched backfill {launched['backfillId']} in {launch_s:.3f} s")
    return launch_s, launched["backfillId"]


def create_runs(
    instance: dg.DagsterInstance, server, backfill_id: str, expected_runs: int, max_iterations: int, profile: str | None
) -> dict:
    """The backfill daemon's iterations until ``expected_runs`` exist (or ``max_iterations``), timed, in
    the daemon's own instance and workspace (on PostgreSQL one connection per query)."""
    from dagster._core.storage.dagster_run import RunsFilter
    from dagster._daemon.backfill import execute_backfill_iteration

    with code_location_workspace(instance, server) as process_context:
        logger = logging.getLogger("bench_backfill_launch")
        runs_filter = RunsFilter(tags={"dagster/backfill": backfill_id})
        iterations, runs = 0, 0
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        reads_before, batches_before = full_key_list_reads(instance), one_connection_batches(instance)
        with Stopwatch() as watch:
            while runs < expected_runs and iterations < max_iterations:
                for error in execute_backfill_iteration(process_context, logger):
                    if error is not None:
                        raise RuntimeError(f"backfill daemon iteration failed: {error}")
                iterations += 1
                runs = instance.get_runs_count(runs_filter)
        reads_after, batches_after = full_key_list_reads(instance), one_connection_batches(instance)
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
        queued = instance.get_runs_count(
            RunsFilter(tags={"dagster/backfill": backfill_id}, statuses=[dg.DagsterRunStatus.QUEUED])
        )
    return {
        "runs_s": watch.wall_s,
        "runs": runs,
        "iterations": iterations,
        "queued": queued,
        "full_key_list_reads": None if reads_before is None else reads_after - reads_before,
        "event_batches_in_one_transaction": None if batches_before is None else batches_after - batches_before,
    }


def measure(
    server,
    registered: int,
    backfill: int,
    shards_per_run: int,
    storage: str,
    max_iterations: int,
    profile: str | None = None,
    storage_cache: bool = False,
) -> dict:
    """Register ``registered`` shards in a fresh instance, launch a backfill of the first ``backfill``
    as the UI does, and time the daemon until its runs exist. ``server``: the ``code_server`` of
    ``shards_per_run``."""
    expected_runs = math.ceil(backfill / shards_per_run)
    with tempfile.TemporaryDirectory(prefix="bench-backfill-") as tmp:
        os.makedirs(os.path.join(tmp, "dagster_home"))
        with launch_instance(os.path.join(tmp, "dagster_home"), storage, storage_cache) as instance:
            shards = [f"shard-{i:07d}" for i in range(registered)]
            for start in range(0, len(shards), 10_000):
                instance.add_dynamic_partitions("shard", shards[start : start + 10_000])
            assets = per_shard_asset_paths()
            launch_s, backfill_id = launch_backfill(instance, server, shards[:backfill], assets)
            created = create_runs(instance, server, backfill_id, expected_runs, max_iterations, profile)
    runs, runs_s = created["runs"], created["runs_s"]
    progress(
        f"{registered} registered, {shards_per_run} per run: {runs} runs after {created['iterations']} "
        f"daemon iterations, {runs_s:.3f} s"
    )
    return {
        "assets": len(assets),
        "storage_cache": storage_cache,
        "full_key_list_reads": created["full_key_list_reads"],
        "event_batches_in_one_transaction": created["event_batches_in_one_transaction"],
        "shards_per_run": shards_per_run,
        "launch_seconds": round(launch_s, 3),
        "runs_created_seconds": round(runs_s, 3),
        "runs": runs,
        "expected_runs": expected_runs,
        "queued_runs": created["queued"],
        "daemon_iterations": created["iterations"],
        "per_run_ms": ratio(1000 * runs_s, runs),
        "per_shard_ms": ratio(1000 * runs_s, min(backfill, runs * shards_per_run)),
    }


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke runs")
    parser.add_argument("--registered", type=int, default=20_000, help="shard partitions in the instance")
    parser.add_argument("--backfill", type=int, default=1_000, help="shards in the backfill")
    parser.add_argument("--storage", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--max-iterations", type=int, default=200)
    parser.add_argument("--shards-per-run", type=int, help="the backfill policy's k (default SHARDS_PER_RUN)")
    parser.add_argument("--compare", action="store_true", help="old and new run shape at each of --sizes")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 100_000], help="registered, with --compare")
    parser.add_argument(
        "--storage-cache",
        action="store_true",
        help="the caching instance storage; with --compare, plain against cached instead of old against new shape",
    )
    parser.add_argument("--profile", help="write a cProfile of the daemon iterations to this file")
    parser.add_argument(
        "--event-batch-size",
        type=int,
        default=0,
        help="DAGSTER_EVENT_BATCH_SIZE for run creation: PostgreSQL then writes a run's planned events in batches",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.registered, args.backfill, args.sizes = 200, 16, [100, 400]
    return args


def launch_once(args: argparse.Namespace, params: dict, shards_per_run: int) -> None:
    """One backfill of ``--backfill`` shards among ``--registered``: the plain record."""
    with stdout_to_stderr(), code_server(shards_per_run) as server:
        figures = measure(
            server,
            args.registered,
            args.backfill,
            shards_per_run,
            args.storage,
            args.max_iterations,
            args.profile,
            args.storage_cache,
        )
    emit("backfill_launch", {**params, "registered": args.registered}, figures)


def compare_storages(args: argparse.Namespace, params: dict, shards_per_run: int) -> None:
    """Plain, cached and batched instance storage at each of ``--sizes``, one run shape."""
    per_storage = {}
    with stdout_to_stderr(), code_server(shards_per_run) as server:
        for name, cache, batch_size in STORAGES:
            # Dagster reads the switch at every event; "0" also keeps the caching storage from setting it.
            os.environ[EVENT_BATCH_SIZE_ENV] = str(args.event_batch_size or batch_size)
            per_storage[name] = {
                str(n): measure(
                    server, n, args.backfill, shards_per_run, args.storage, args.max_iterations, storage_cache=cache
                )
                for n in sorted(args.sizes)
            }
    small, large = str(min(args.sizes)), str(max(args.sizes))
    emit(
        "backfill_launch",
        {**params, "sizes": args.sizes, "shards_per_run": shards_per_run},
        {
            "per_storage": per_storage,
            "growth": {
                name: ratio(sizes[large]["per_run_ms"], sizes[small]["per_run_ms"])
                for name, sizes in per_storage.items()
            },
            **{
                f"{name}_over_plain_per_run": {
                    n: ratio(per_storage[name][n]["per_run_ms"], per_storage["plain"][n]["per_run_ms"])
                    for n in per_storage["plain"]
                }
                for name in ("cached", "batched")
            },
            "runs_created_seconds": per_storage["batched"][large]["runs_created_seconds"],
            "runs": per_storage["batched"][large]["runs"],
            "expected_runs": per_storage["batched"][large]["expected_runs"],
        },
    )


def compare_shapes(args: argparse.Namespace, params: dict, shapes: dict[str, int]) -> None:
    """The old and the new run shape (shards per run) at each of ``--sizes``."""
    per_shape = {}
    with stdout_to_stderr():
        for shape, k in shapes.items():
            with code_server(k) as server:
                per_shape[shape] = {
                    str(n): measure(server, n, args.backfill, k, args.storage, args.max_iterations)
                    for n in sorted(args.sizes)
                }
    small, large = str(min(args.sizes)), str(max(args.sizes))
    last = per_shape["new"][large]
    emit(
        "backfill_launch",
        {**params, "sizes": args.sizes, "shards_per_run": shapes},
        {
            "per_shape": per_shape,
            "growth": {
                shape: ratio(sizes[large]["per_run_ms"], sizes[small]["per_run_ms"])
                for shape, sizes in per_shape.items()
            },
            "new_over_old_per_shard": {
                n: ratio(per_shape["new"][n]["per_shard_ms"], per_shape["old"][n]["per_shard_ms"])
                for n in per_shape["new"]
            },
            # The keys of a plain run, for the largest size and the new shape.
            "launch_seconds": last["launch_seconds"],
            "runs_created_seconds": last["runs_created_seconds"],
            "runs": last["runs"],
            "expected_runs": last["expected_runs"],
        },
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    if args.event_batch_size:
        os.environ[EVENT_BATCH_SIZE_ENV] = str(args.event_batch_size)
    from assets.shard_runs import SHARDS_PER_RUN

    params = {
        "quick": args.quick,
        "backfill": args.backfill,
        "storage": args.storage,
        "event_batch_size": args.event_batch_size,
        "storage_cache": args.storage_cache,
    }
    shapes = {"old": OLD_SHARDS_PER_RUN, "new": args.shards_per_run or SHARDS_PER_RUN}
    if args.compare and args.storage_cache:
        compare_storages(args, params, shapes["new"])
    elif args.compare:
        compare_shapes(args, params, shapes)
    else:
        launch_once(args, params, shapes["new"])


if __name__ == "__main__":
    main()
