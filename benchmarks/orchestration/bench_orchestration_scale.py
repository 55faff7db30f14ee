"""The landing sensor's tick and the UI's partitions query against a SQLite or PostgreSQL instance with many shards.

Why: every shard is a ``shard`` dynamic partition. A tick reads all of them from the instance to
know what is registered, and the UI's partitions page of a shard asset asks the instance for the
status of every partition; both grow with the number of shards, which decides how small shards
can be (docs/performance.md, "Hours per shard").

For each ``--sizes`` N, in a fresh temporary directory: a landing zone of N registered shard
directories plus ``--new`` complete ones (``_SUCCESS`` and a small ``metadata.parquet``), a
persistent Dagster instance (``dg.instance_for_test``; ``--storage sqlite``: the storage ``dagster
dev`` uses; ``--storage postgres``: the production storage, dagster-postgres on a throwaway
PostgreSQL server started as the e2e test starts it, ``tests/e2e/postgres_server.py``),
the N shards added as ``shard`` partitions (timed, as ``register_seconds``), then wall-clock,
median of ``--repeats``:

* ``tick``: one evaluation of the landing sensor (``build_sensor_context`` on that instance): list
  the registered partitions, scan the landing zone, read the new shards' metadata;
  ``partition_list_seconds``: its read of the registered partitions alone (``get_dynamic_partitions``);
* before timing, half of the shards (at most ``--max-materialized``) get a ``bridge_tars``
  materialization event, so the statuses the UI asks for are not all empty;
* ``partitions_query`` (unless ``--no-graphql``): the GraphQL query the UI's partitions page of
  ``bridge_tars`` issues (partition keys and materialization statuses of the asset), through
  ``dagster_graphql``'s in-process client on a workspace loaded from ``dagster_project.definitions``,
  on an instance set up as the webserver sets up its own (``optimize_for_webserver``).

Reported per N: the timings and ``tick_over_target`` (target 5 s at 100 000) and
``query_over_target`` (2 s at 20 000); across sizes ``tick_growth`` = tick(largest) / tick(smallest)
over largest / smallest N (1 = linear).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
from collections.abc import Iterator

import dagster as dg

from benchmarks.orchestration.bench_sensor_tick import small_metadata
from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed, timed_call
from resources.storage import DataRootResource
from sensors.landing import build_landing_sensor
from speechdata.io import layout

TICK_TARGET_S = 5.0
QUERY_TARGET_S = 2.0

PARTITIONS_QUERY = """
query PartitionHealthQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name type partitionKeys }
      assetPartitionStatuses {
        ... on DefaultPartitionStatuses {
          materializedPartitions materializingPartitions failedPartitions
        }
      }
    }
  }
}
"""


def build_landing(root: str, n_registered: int, n_new: int) -> list[str]:
    """Registered shards as bare directories (a tick never opens them), new ones complete."""
    metadata = small_metadata()
    ids = [f"shard-{i:07d}" for i in range(n_registered + n_new)]
    for i, shard_id in enumerate(ids):
        os.makedirs(os.path.join(root, layout.landing_dir(shard_id)))
        if i >= n_registered:
            with open(os.path.join(root, layout.landing_metadata(shard_id)), "wb") as f:
                f.write(metadata)
            open(os.path.join(root, layout.landing_success_marker(shard_id)), "wb").close()
    return ids[:n_registered]


@contextlib.contextmanager
def bench_instance(home: str, storage: str, overrides: dict | None = None) -> Iterator[dg.DagsterInstance]:
    """A persistent instance in ``home`` on SQLite, or on a fresh PostgreSQL server (one per call)."""
    overrides = overrides or {}
    if storage == "sqlite":
        with dg.instance_for_test(temp_dir=home, overrides=overrides) as instance:
            yield instance
        return
    from tests.e2e.postgres_server import PostgresServer

    with PostgresServer() as server:
        postgres_db = server.postgres_db
        with dg.instance_for_test(
            temp_dir=home, overrides={**overrides, "storage": {"postgres": {"postgres_db": postgres_db}}}
        ) as instance:
            yield instance


@contextlib.contextmanager
def code_location_workspace(instance: dg.DagsterInstance):
    """The workspace the webserver and the daemon load: ``dagster_project.definitions`` in a code server."""
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import ModuleTarget

    target = ModuleTarget(
        module_name="dagster_project.definitions",
        attribute=None,
        working_directory=os.getcwd(),
        location_name="speechdata",
    )
    with WorkspaceProcessContext(instance, target) as process_context:
        yield process_context


@contextlib.contextmanager
def webserver_instance(instance: dg.DagsterInstance) -> Iterator[dg.DagsterInstance]:
    """A second instance on the same storage, set up as ``dagster-webserver`` sets up its own (its
    defaults: one pooled connection instead of one per query on PostgreSQL); the daemons' processes
    (the sensor tick, the backfill daemon) keep the plain one."""
    with dg.DagsterInstance.from_ref(instance.get_ref()) as webserver:
        webserver.optimize_for_webserver(statement_timeout=15_000, pool_recycle=3_600, max_overflow=20)
        yield webserver


def partitions_query_seconds(instance: dg.DagsterInstance, repeats: int) -> tuple[float, int]:
    from dagster_graphql.test.utils import execute_dagster_graphql

    with webserver_instance(instance) as webserver, code_location_workspace(webserver) as process_context:

        def query():
            result = execute_dagster_graphql(
                process_context.create_request_context(),
                PARTITIONS_QUERY,
                variables={"assetKey": {"path": ["bridge_tars"]}},
            )
            if result.errors:
                raise RuntimeError(result.errors)
            return result.data

        query()  # warm: the first request loads the code location's snapshot
        seconds, _, data = timed(query, repeats)
    node = data["assetNodeOrError"]
    dimensions = node["partitionKeysByDimension"]
    statuses = node["assetPartitionStatuses"] or {}
    return (
        seconds,
        len(dimensions[0]["partitionKeys"]) if dimensions else 0,
        len(statuses.get("materializedPartitions", [])),
    )


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for smoke runs")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 20_000, 100_000])
    parser.add_argument("--new", type=int, default=50, help="complete, unregistered shards per tick")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-graphql", action="store_true")
    parser.add_argument("--storage", choices=("sqlite", "postgres"), default="sqlite", help="the instance's storage")
    parser.add_argument(
        "--max-materialized", type=int, default=10_000, help="bridge_tars materializations (half of N, at most this)"
    )
    args = parser.parse_args(argv)
    if args.quick:
        # Two sizes four times apart: the smoke checks the record, the full sizes give the growth figure.
        args.sizes, args.repeats = [100, 400], 1
    return args


def register_and_materialize(instance: dg.DagsterInstance, registered: list[str], max_materialized: int) -> tuple:
    """Every landed shard but the new ones registered (timed), then half of them (at most
    ``max_materialized``) marked as having their tars: (seconds to register, the materialized)."""

    def register() -> None:
        for start in range(0, len(registered), 10_000):
            instance.add_dynamic_partitions("shard", registered[start : start + 10_000])

    register_s, _ = timed_call(register)
    materialized = registered[: min(len(registered) // 2, max_materialized)]
    # Setup, not timed: on PostgreSQL a pooled connection, not one per event.
    with webserver_instance(instance) as writer:
        for shard_id in materialized:
            writer.report_runless_asset_event(dg.AssetMaterialization(asset_key="bridge_tars", partition=shard_id))
    return register_s, materialized


def measure_size(args: argparse.Namespace, sensor, n: int) -> dict:
    """The landing sensor's tick, the partition list and (unless ``--no-graphql``) the UI's partitions
    query, with ``n`` shards registered."""
    with tempfile.TemporaryDirectory(prefix="bench-orch-") as tmp:
        data = os.path.join(tmp, "data")
        registered = build_landing(data, n, args.new)
        os.makedirs(os.path.join(tmp, "dagster_home"))
        with bench_instance(os.path.join(tmp, "dagster_home"), args.storage) as instance:
            register_s, materialized = register_and_materialize(instance, registered, args.max_materialized)

            def tick():
                context = dg.build_sensor_context(
                    instance=instance, resources={"data_root": DataRootResource(url=data)}
                )
                return sensor(context)

            tick_s, _, result = timed(tick, args.repeats)
            # The tick's one read of the instance that grows with N (the rest is the landing zone).
            list_s = timed(lambda: instance.get_dynamic_partitions("shard"), args.repeats).median_s
            figures = {
                "register_seconds": round(register_s, 2),
                "tick_seconds": round(tick_s, 3),
                "tick_over_target": ratio(tick_s, TICK_TARGET_S),
                "partition_list_seconds": round(list_s, 3),
                "tick_new_shards": sum(
                    len(request.partition_keys or [])
                    for request in result.dynamic_partitions_requests or []
                    if request.partitions_def_name == "shard"
                ),
                "tick_runs_requested": len(result.run_requests or []),
                "materialized_partitions": len(materialized),
                "run_storage": type(instance.run_storage).__name__,
            }
            if not args.no_graphql:
                query_s, keys, materialized_count = partitions_query_seconds(instance, args.repeats)
                figures |= {
                    "partitions_query_seconds": round(query_s, 3),
                    "query_over_target": ratio(query_s, QUERY_TARGET_S),
                    "query_partition_keys": keys,
                    "query_materialized": materialized_count,
                }
    return figures


def main(argv: list[str] | None = None) -> None:
    args = parse_arguments(argv)
    per_size = {}
    with stdout_to_stderr():
        sensor = build_landing_sensor(max_shards_per_tick=args.new)
        for n in args.sizes:
            per_size[str(n)] = measure_size(args, sensor, n)
            progress(f"{n} shards: {per_size[str(n)]}")
    small, large = min(args.sizes), max(args.sizes)
    emit(
        "orchestration_scale",
        {"quick": args.quick, "sizes": args.sizes, "new": args.new, "repeats": args.repeats, "storage": args.storage},
        {
            "per_size": per_size,
            "tick_growth": ratio(
                per_size[str(large)]["tick_seconds"] / per_size[str(small)]["tick_seconds"], large / small
            ),
        },
    )


if __name__ == "__main__":
    main()
