"""Run NeMo's own code in the trainer's environment, ``.venv-nemo``, and read back what it found.

NeMo cannot live in the platform's ``.venv``: its hydra-core / omegaconf pin antlr4 4.9, and
Dagster's selection grammar needs 4.13 (docs/models-and-profiles.md). ``make nemo-env`` builds
``.venv-nemo`` (the core library plus ``nemo_toolkit[asr]``, the ``nemo-consumer`` dependency group)
and ``make test`` depends on it. A script in ``tests/nemo_consumer/`` gets the path of a JSON file
to write its result to, then its own arguments; tests assert on that result. NeMo logs on stdout,
so the result never travels there.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
NEMO_ENV = REPO_ROOT / ".venv-nemo"
NEMO_PYTHON = NEMO_ENV / "bin" / "python"
NEMO_ENV_STAMP = NEMO_ENV / ".installed"
"""Written by ``make nemo-env`` after the install succeeded: a half-built environment has none."""
CONSUMER_SCRIPTS = Path(__file__).resolve().parent / "nemo_consumer"


def run_in_nemo_env(script: str, *args: str, timeout_s: float = 900) -> Any:
    """Run ``tests/nemo_consumer/<script>`` with ``.venv-nemo``'s Python; return the JSON it wrote.

    Fails (never skips) when the environment is missing or the script fails, with its stderr.
    """
    if not NEMO_ENV_STAMP.exists():
        pytest.fail(f"NeMo's environment {NEMO_ENV} is missing or half built: `make nemo-env` creates it")
    with tempfile.TemporaryDirectory(prefix="nemo-result-") as work:
        result_path = Path(work) / "result.json"
        # This checkout's speechdata, not the copy the environment was built from.
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        done = subprocess.run(
            [str(NEMO_PYTHON), str(CONSUMER_SCRIPTS / script), str(result_path), *args],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if done.returncode != 0 or not result_path.exists():
            pytest.fail(f"{script} in {NEMO_ENV} exited {done.returncode}:\n{done.stderr[-6000:]}")
        return json.loads(result_path.read_text())
