"""The code location's definitions as data: every asset spec, check, job, sensor and resource key.

``tests/definitions_snapshot.json`` holds this for the ``tiny`` profile and is reviewed like code:
``tests/integration/test_definitions.py`` fails with a diff when the definitions drift from it, and
``pytest tests/integration/test_definitions.py --update-spec-snapshot`` rewrites it after a
deliberate change. Tests that need a list of assets read it from here or from ``assets`` rather
than keeping their own.

The snapshot is taken in a fresh interpreter (``python -m tests.spec_snapshot``) with every
``SPEECHDATA_*`` variable of the caller's environment removed and ``SPEECHDATA_PROFILE=tiny``: code
versions name the model that runs (``resources.model_pins.model_that_runs``), and sensor intervals,
model revisions and the GPU node selector are read from the environment when the location loads, so
only a clean environment gives the same file on every machine.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

REPO_ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT_PATH = Path(__file__).resolve().parent / "definitions_snapshot.json"
SNAPSHOT_PROFILE = "tiny"


def _partitions(partitions_def: dg.PartitionsDefinition | None) -> dict | None:
    if partitions_def is None:
        return None
    return {"type": type(partitions_def).__name__, "name": getattr(partitions_def, "name", None)}


def _keys(keys) -> list[str]:
    return sorted(key.to_user_string() for key in keys)


def _asset_entry(spec: dg.AssetSpec, assets_def: dg.AssetsDefinition) -> dict:
    checks = sorted(
        (
            {"name": check.name, "blocking": check.blocking}
            for check in assets_def.check_specs
            if check.asset_key == spec.key
        ),
        key=lambda check: check["name"],
    )
    executable = assets_def.is_executable and assets_def.node_def is not None
    return {
        "group": spec.group_name,
        "partitions": _partitions(spec.partitions_def),
        "deps": _keys(dep.asset_key for dep in spec.deps),
        "checks": checks,
        "tags": dict(sorted(spec.tags.items())),
        "kinds": sorted(spec.kinds),
        "owners": sorted(spec.owners),
        "code_version": spec.code_version,
        "pool": assets_def.op.pool if executable else None,
        "op_tags": sorted(assets_def.op.tags) if executable else [],
        "backfill_policy": str(assets_def.backfill_policy) if assets_def.backfill_policy else None,
        "automation_condition": str(spec.automation_condition) if spec.automation_condition else None,
    }


def _sensor_entry(sensor: dg.SensorDefinition) -> dict:
    return {
        "type": type(sensor).__name__,
        "jobs": sorted(target.job_name for target in sensor.targets),
        "asset_selection": str(sensor.asset_selection) if sensor.asset_selection is not None else None,
        "minimum_interval_seconds": sensor.minimum_interval_seconds,
        "default_status": sensor.default_status.value,
    }


def definitions_spec(defs: dg.Definitions) -> dict:
    """Everything a review of the code location's shape needs, as plain sorted data."""
    asset_graph = defs.resolve_asset_graph()
    assets = {}
    for assets_def in asset_graph.assets_defs:
        for spec in assets_def.specs:
            assets[spec.key.to_user_string()] = _asset_entry(spec, assets_def)
    jobs = {}
    for job in defs.jobs or []:
        job_def = defs.resolve_job_def(job.name)
        jobs[job.name] = {
            "assets": _keys(job_def.asset_layer.executable_asset_keys),
            "partitions": _partitions(job_def.partitions_def),
            "tags": dict(sorted(job_def.tags.items())),
        }
    return {
        "assets": dict(sorted(assets.items())),
        "jobs": dict(sorted(jobs.items())),
        "sensors": {sensor.name: _sensor_entry(sensor) for sensor in sorted(defs.sensors or [], key=lambda s: s.name)},
        "schedules": sorted(schedule.name for schedule in defs.schedules or []),
        "resources": sorted(defs.resources or {}),
    }


def render(spec: dict) -> str:
    return json.dumps(spec, indent=2, sort_keys=True) + "\n"


def clean_environment() -> dict[str, str]:
    """The caller's environment without anything that changes how the code location loads."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SPEECHDATA_")}
    env["SPEECHDATA_PROFILE"] = SNAPSHOT_PROFILE
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def current_snapshot() -> str:
    """The rendered snapshot of this checkout's definitions, taken in a clean interpreter."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.spec_snapshot"],
        cwd=REPO_ROOT,
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if result.returncode != 0:
        raise RuntimeError(f"the code location did not load for the spec snapshot:\n{result.stderr[-4000:]}")
    return result.stdout


def stored_snapshot() -> str:
    return SNAPSHOT_PATH.read_text()


def stored_spec() -> dict:
    return json.loads(stored_snapshot())


def job_asset_keys(job_name: str) -> list[str]:
    """The assets a job of the stored snapshot materializes, sorted."""
    return list(stored_spec()["jobs"][job_name]["assets"])


def gpu_asset_keys() -> list[str]:
    """Assets whose steps run in the ``gpu`` pool, per the stored snapshot."""
    return sorted(key for key, asset in stored_spec()["assets"].items() if asset["pool"] == "gpu")


def readable_diff(stored: str, current: str) -> str:
    name = SNAPSHOT_PATH.relative_to(REPO_ROOT).as_posix()
    lines = difflib.unified_diff(
        stored.splitlines(keepends=True), current.splitlines(keepends=True), f"{name} (stored)", "definitions (now)"
    )
    return "".join(lines)


if __name__ == "__main__":
    from dagster_project.definitions import defs

    sys.stdout.write(render(definitions_spec(defs)))
