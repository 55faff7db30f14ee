"""The core library and its CLI import no Dagster: training code installs ``speechdata`` alone."""

import subprocess
import sys

import pytest

TOUCH_THE_TRAINING_API = """
import sys
CODE_LOCATION_AND_DAGSTER = {
    "dagster", "dagster_graphql", "dagster_webserver", "dagster_duckdb", "dagster_k8s", "dagster_postgres",
    "dagster_shared", "dagster_pipes", "dagster_project", "assets", "resources", "sensors",
}
import speechdata
for name in speechdata.__all__:
    getattr(speechdata, name)
assert speechdata.FRAME_RATE_HZ == 12.5
from speechdata.cli import build_parser
build_parser()
# The one code-location module the parser loads: the shard commands' arguments (no Dagster until they run).
parser_only = {"dagster_project", "dagster_project.operations_cli"}
leaked = sorted(m for m in sys.modules if m.split(".")[0] in CODE_LOCATION_AND_DAGSTER and m not in parser_only)
assert not leaked, leaked
print(len(speechdata.__all__))
"""


@pytest.mark.slow
def test_importing_the_training_api_and_the_cli_imports_no_dagster():
    proc = subprocess.run([sys.executable, "-c", TOUCH_THE_TRAINING_API], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.strip()) >= 10


def test_import_speechdata_is_cheap():
    """The package ``__init__`` resolves names lazily: importing it pulls in neither torch nor DuckDB."""
    code = "import sys, speechdata; print(sorted(m for m in ('torch', 'duckdb', 'polars') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_base_dependencies_hold_no_dagster_and_the_platform_extra_does():
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("dagster")]
    platform = {d.split("=")[0].split(">")[0] for d in project["optional-dependencies"]["platform"]}
    assert {"dagster", "dagster-webserver", "dagster-duckdb", "dagster-postgres", "dagster-k8s"} <= platform
    assert "speech-data-platform[platform]" in project["optional-dependencies"]["dev"]
