"""Importing the code location loads no model library: every run worker, step process and code
server pays that import, and only the steps that run a model need torch (docs/performance.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.orchestration.orchestration_costs import MODEL_LIBRARIES

ROOT = Path(__file__).resolve().parents[2]


def _model_libraries_loaded_by(code: str) -> list[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(m for m in {MODEL_LIBRARIES!r} if m in sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_importing_the_code_location_loads_no_model_library():
    """A leak shows which library; ``python -X importtime -c "from dagster_project.definitions import
    defs"`` shows which module imported it."""
    loaded = _model_libraries_loaded_by(
        "from dagster_project.definitions import defs\nassert defs.resolve_asset_graph().get_all_asset_keys()"
    )
    assert loaded == []


@pytest.mark.slow
def test_the_cli_parser_loads_no_model_library():
    """``speechdata --help`` (every command's parser, the shard commands' included) stays light too."""
    assert _model_libraries_loaded_by("from speechdata.cli import build_parser\nbuild_parser()") == []
