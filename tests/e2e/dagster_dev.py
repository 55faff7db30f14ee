"""Start and stop a real `dagster dev` (daemon + webserver + code server) for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[2]
DAEMON_INTERVAL_DIR = Path(__file__).resolve().parent / "daemon_interval"
"""Its ``sitecustomize`` shortens the daemon's backfill interval (the module says why)."""
DAEMON_INTERVAL_S = "2"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DagsterDev:
    """`dagster dev` in its own process group, with a temporary DAGSTER_HOME and data root.

    ``instance_yaml`` is the dagster.yaml copied into DAGSTER_HOME (the local SQLite one by default;
    deploy/production/dagster.yaml puts the instance on PostgreSQL, with its ``DAGSTER_POSTGRES_*`` in ``env``).
    ``workspace`` replaces the project's workspace.yaml (the UI test loads versioned definitions).
    """

    def __init__(
        self,
        dagster_home: Path,
        data_root: Path,
        env: dict[str, str] | None = None,
        instance_yaml: Path = ROOT / "deploy" / "local" / "dagster.yaml",
        workspace: Path | None = None,
    ):
        self.instance_yaml = instance_yaml
        self.workspace = workspace or ROOT / "workspace.yaml"
        self.dagster_home = dagster_home
        self.data_root = data_root
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base_url}/graphql"
        self.extra_env = env or {}
        self.log_path = dagster_home / "dagster_dev.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> DagsterDev:
        self.dagster_home.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.instance_yaml, self.dagster_home / "dagster.yaml")
        env = {
            **os.environ,
            "DAGSTER_HOME": str(self.dagster_home),
            "DATA_ROOT": str(self.data_root),
            "SPEECHDATA_PROFILE": "tiny",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(DAEMON_INTERVAL_DIR), os.environ.get("PYTHONPATH")])),
            "SPEECHDATA_E2E_DAEMON_INTERVAL_S": DAEMON_INTERVAL_S,
            **self.extra_env,
        }
        dagster = Path(sys.executable).parent / "dagster"
        self._log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [str(dagster), "dev", "-w", str(self.workspace), "-h", "127.0.0.1", "-p", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            self._wait_until_loaded(timeout_s=240)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        group = os.getpgid(self.process.pid)
        os.killpg(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(group, signal.SIGKILL)
            self.process.wait(timeout=10)
        # The daemon and code server are in the same group; make sure none outlives the test.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        self._log.close()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text()[-chars:] if self.log_path.exists() else ""

    def query(self, query: str, variables: dict | None = None) -> dict:
        response = requests.post(self.url, json={"query": query, "variables": variables or {}}, timeout=30)
        response.raise_for_status()
        payload = response.json()
        if payload.get("errors"):
            raise RuntimeError(payload["errors"])
        return payload["data"]

    def reload_location(self, name: str = "speech_data_platform", timeout_s: float = 240) -> None:
        """What the UI's Reload button does: restart the code server and load the code again."""
        self.query(RELOAD_MUTATION, {"name": name})
        self._wait_until_loaded(timeout_s)

    def _wait_until_loaded(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dagster dev exited early:\n{self.log_tail()}")
            try:
                data = self.query(LOCATIONS_QUERY)
                entries = data["workspaceOrError"]["locationEntries"]
                if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                    errors = [e for e in entries if e["locationOrLoadError"]["__typename"] == "PythonError"]
                    if errors:
                        raise RuntimeError(f"code location failed to load: {errors}")
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise TimeoutError(f"dagster dev did not load within {timeout_s} s:\n{self.log_tail()}")

    def runs(self) -> list[dict]:
        return self.query(RUNS_QUERY)["runsOrError"]["results"]

    def materialized_partitions(self, asset: str) -> list[str]:
        data = self.query(MATERIALIZATIONS_QUERY, {"path": [asset]})
        asset_or_error = data["assetOrError"]
        if asset_or_error["__typename"] != "Asset":
            return []
        return [m["partition"] for m in asset_or_error["assetMaterializations"]]


LOCATIONS_QUERY = """
query { workspaceOrError { __typename ... on Workspace { locationEntries {
  name loadStatus locationOrLoadError { __typename } } } } }
"""

RELOAD_MUTATION = """
mutation Reload($name: String!) { reloadRepositoryLocation(repositoryLocationName: $name) { __typename } }
"""

RUNS_QUERY = """
query { runsOrError { __typename ... on Runs { results {
  runId jobName status tags { key value } } } } }
"""

MATERIALIZATIONS_QUERY = """
query Materializations($path: [String!]!) { assetOrError(assetKey: {path: $path}) {
  __typename ... on Asset { assetMaterializations { partition runId } } } }
"""
