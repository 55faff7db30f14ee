"""Every ``python -m benchmarks...`` command the README, docs/ and the Makefile name is a module that
exists, so moving or renaming a benchmark cannot leave a figure whose command no longer runs.

Import specs only (``importlib.util.find_spec``): nothing is imported beyond the package ``__init__``\\s.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from benchmarks.run_all import available, module_of

REPOSITORY = Path(__file__).resolve().parents[2]
COMMAND = re.compile(r"python -m (benchmarks(?:\.\w+)+)")
TABLE_PREFIX = "`python -m benchmarks.`"
"""A table column headed ``command (`python -m benchmarks.`...)`` holds the rest of each command."""


def documents() -> list[Path]:
    return [REPOSITORY / "README.md", REPOSITORY / "Makefile", *sorted((REPOSITORY / "docs").rglob("*.md"))]


def table_commands(lines: list[str]) -> list[str]:
    """The modules of the cells under a column headed with ``TABLE_PREFIX`` (first backticked word)."""
    found, column = [], None
    for line in lines:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            column = None
        elif column is None:
            column = next((i for i, cell in enumerate(cells) if TABLE_PREFIX in cell), None)
        elif column < len(cells) and (cell := re.match(r"`([\w.]+)", cells[column])):
            found.append("benchmarks." + cell.group(1))
    return found


def named_commands() -> list[tuple[str, str]]:
    """(``file:line``, module) for every benchmark command the documents name."""
    named = []
    for path in documents():
        lines = path.read_text().splitlines()
        relative = path.relative_to(REPOSITORY).as_posix()
        for number, line in enumerate(lines, start=1):
            named.extend((f"{relative}:{number}", module) for module in COMMAND.findall(line))
        named.extend((f"{relative} (table)", module) for module in table_commands(lines))
    return named


def test_the_documents_name_benchmark_commands():
    modules = {module for _, module in named_commands()}
    # The figures' pages name dozens; a parser that found none would make the next test vacuous.
    assert len(modules) > 30
    assert "benchmarks.run_all" in modules


@pytest.mark.parametrize("where, module", named_commands())
def test_each_named_benchmark_command_is_a_module(where, module):
    assert importlib.util.find_spec(module) is not None, f"{where}: `python -m {module}` names no module"


def test_run_all_finds_each_benchmark_by_stem_and_by_module():
    benchmarks = available()
    assert {"bench_ingest", "bench_corpus_scale", "bench_backfill_launch", "bench_duty_cycle"} <= set(benchmarks)
    for stem, module in benchmarks.items():
        assert importlib.util.find_spec(module) is not None
        assert module_of(stem) == module_of(module.removeprefix("benchmarks.")) == module
    assert module_of("bench_no_such_thing") is None
    assert module_of("capacity_model") is None, "a helper module is not a benchmark"


def test_benchmarks_that_name_the_repository_root_find_it():
    """A benchmark one folder deeper than it was would otherwise look for ``.venv-nemo``, the model
    cache or the code location beside itself (only ``parents[N]`` names a root here)."""
    named = 0
    for path in sorted((REPOSITORY / "benchmarks").rglob("*.py")):
        for level in re.findall(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]", path.read_text()):
            named += 1
            assert path.resolve().parents[int(level)] == REPOSITORY, f"{path.relative_to(REPOSITORY)}: parents[{level}]"
        assert ".resolve().parent.parent" not in path.read_text(), f"{path.relative_to(REPOSITORY)}: use parents[N]"
    assert named >= 5
