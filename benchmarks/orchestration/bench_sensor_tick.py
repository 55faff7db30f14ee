"""How long the landing sensor's tick takes on a large landing zone, against Dagster's timeout.

Why: a sensor evaluation that runs past Dagster's sensor timeout (60 s by default,
``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS``) fails the tick, and no shard is registered at all. The
tick lists ``landing/`` and checks ``_SUCCESS`` in every unregistered directory up to its limit, so
its cost grows with the number of directories and with how many are still landing.

A temporary landing zone gets ``--shards`` directories, complete (``_SUCCESS`` plus one small
valid ``metadata.parquet``, the same bytes in each) and still landing (no ``_SUCCESS``) alternating
by name, so every still-landing directory sorts among the complete ones. No audio is written. Wall
time (``time.perf_counter``, median of ``--repeats``) of:

* ``scan``: one ``scan_landing_zone`` call, nothing registered, limit ``--limit``;
* ``tick_none_registered``: a whole sensor evaluation (``landing_sensor(context)`` on an
  ephemeral instance), nothing registered;
* ``tick_mostly_registered``: the same after ``--registered`` complete shards (the first in name
  order) were added as ``shard`` partitions, so the tick walks past every still-landing
  directory to find the last complete ones.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import tempfile
import time

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.report import emit, progress, ratio, stdout_to_stderr, timed
from resources.storage import DataRootResource
from sensors.landing import build_landing_sensor
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.scan import scan_landing_zone

DAGSTER_SENSOR_TIMEOUT_S = 60.0
"""Dagster's default sensor evaluation timeout (``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS`` unset)."""


def small_metadata() -> bytes:
    table = pa.table(
        {
            "utt_id": ["utt_00000", "utt_00001"],
            "audio_path": ["en/utt_00000.flac", "en/utt_00001.flac"],
            "language": ["en", "en"],
            "country": ["us", "gb"],
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


def build_landing_zone(root_dir: str, n_shards: int) -> list[str]:
    """Create the directories with plain file writes; return the complete shards' ids in name order."""
    metadata = small_metadata()
    complete = []
    for i in range(n_shards):
        shard_id = f"shard-{i:06d}"
        os.makedirs(os.path.join(root_dir, layout.landing_dir(shard_id)))
        if i % 2 == 0:
            with open(os.path.join(root_dir, layout.landing_metadata(shard_id)), "wb") as f:
                f.write(metadata)
            open(os.path.join(root_dir, layout.landing_success_marker(shard_id)), "wb").close()
            complete.append(shard_id)
    return complete


def figure(median_s: float, first_s: float, **checks) -> dict:
    return {
        "seconds": round(median_s, 4),
        "first_call_seconds": round(first_s, 4),
        "timeout_seconds": DAGSTER_SENSOR_TIMEOUT_S,
        "fraction_of_timeout": ratio(median_s, DAGSTER_SENSOR_TIMEOUT_S),
        **checks,
    }


def tick_checks(result: dg.SensorResult) -> dict:
    """What the tick found: the runs it requested and the still-landing directories it checked."""
    cursor = json.loads(result.cursor or "{}")
    return {"run_requests": len(result.run_requests or []), "still_landing_checked": cursor.get("still_landing")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small landing zone, for smoke runs")
    parser.add_argument("--shards", type=int, default=10_000, help="landing directories, half of them complete")
    parser.add_argument("--limit", type=int, default=50, help="max_shards_per_tick")
    parser.add_argument("--registered", type=int, default=4_950, help="complete shards registered before the last tick")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.shards, args.registered, args.repeats = 1_000, 450, 1

    with stdout_to_stderr(), tempfile.TemporaryDirectory(prefix="bench-sensor-") as tmp:
        started = time.perf_counter()
        complete = build_landing_zone(tmp, args.shards)
        progress(f"landing zone of {args.shards} directories built in {time.perf_counter() - started:.1f} s")
        registered = complete[: min(args.registered, len(complete))]

        scan_s, scan_first_s, scan = timed(lambda: scan_landing_zone(DataRoot(tmp), set(), args.limit), args.repeats)

        sensor = build_landing_sensor(max_shards_per_tick=args.limit)
        instance = dg.DagsterInstance.ephemeral()

        def tick() -> dg.SensorResult:
            context = dg.build_sensor_context(instance=instance, resources={"data_root": DataRootResource(url=tmp)})
            return sensor(context)

        fresh_s, fresh_first_s, fresh = timed(tick, args.repeats)
        instance.add_dynamic_partitions("shard", registered)
        later_s, later_first_s, later = timed(tick, args.repeats)
        instance.dispose()

    emit(
        "sensor_tick",
        {
            "quick": args.quick,
            "shards": args.shards,
            "complete": len(complete),
            "still_landing": args.shards - len(complete),
            "limit": args.limit,
            "registered": len(registered),
            "repeats": args.repeats,
        },
        {
            "scan": figure(
                scan_s, scan_first_s, complete_found=len(scan.complete), still_landing_checked=len(scan.still_landing)
            ),
            "tick_none_registered": figure(fresh_s, fresh_first_s, **tick_checks(fresh)),
            "tick_mostly_registered": figure(later_s, later_first_s, **tick_checks(later)),
            "ratio_mostly_registered_over_none_registered": ratio(later_s, fresh_s),
        },
    )


if __name__ == "__main__":
    main()
