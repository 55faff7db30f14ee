"""Every private Dagster symbol the code location and the benchmarks import still exists.

Dagster's private modules (``dagster._core``, ``dagster._serdes``, ...) change without notice
between releases. The list below is read from the sources (their ASTs, function-level imports
included), so a new private import is covered the day it is written; an upgrade that moves one
fails here, naming the symbol, the module it was imported from and the file that imports it,
before anything fails at run time. ``dagster_project.instance_storage`` also overrides private
methods of Dagster's storages: each override it marks ``@override`` must still override something.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
SCANNED_PACKAGES = ("dagster_project", "assets", "resources", "sensors", "speechdata", "benchmarks")
PRIVATE_MODULE = re.compile(r"^dagster(_[a-z]+)?\._")
"""``dagster._core...``, ``dagster_postgres._...``: a module path with a private component."""


@dataclass(frozen=True)
class PrivateImport:
    file: str
    module: str
    symbol: str | None
    """``from module import symbol``; None for ``import module``."""

    def __str__(self) -> str:
        return f"{self.file}: {self.module}{'' if self.symbol is None else ' import ' + self.symbol}"


def private_dagster_imports(root: Path = REPOSITORY) -> list[PrivateImport]:
    found: list[PrivateImport] = []
    for package in SCANNED_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            relative = path.relative_to(root).as_posix()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    if PRIVATE_MODULE.match(node.module):
                        found.extend(PrivateImport(relative, node.module, alias.name) for alias in node.names)
                    elif node.module.split(".")[0].startswith("dagster"):
                        # ``from dagster import _check``: the symbol itself is the private part.
                        found.extend(
                            PrivateImport(relative, node.module, alias.name)
                            for alias in node.names
                            if alias.name.startswith("_")
                        )
                elif isinstance(node, ast.Import):
                    found.extend(
                        PrivateImport(relative, alias.name, None)
                        for alias in node.names
                        if PRIVATE_MODULE.match(alias.name)
                    )
    return sorted(set(found), key=str)


PRIVATE_IMPORTS = private_dagster_imports()


def test_the_scan_finds_the_instance_storages_imports():
    """The scan itself works: it sees what instance_storage.py is known to import."""
    files = {item.file for item in PRIVATE_IMPORTS}
    assert {"dagster_project/instance_storage.py", "assets/shard_runs.py", "dagster_project/shard_status.py"} <= files
    assert (
        PrivateImport("dagster_project/instance_storage.py", "dagster._core.storage.sqlite_storage", "_runs_directory")
        in PRIVATE_IMPORTS
    )


def test_the_scan_catches_every_import_form(tmp_path):
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "example.py").write_text(
        "import dagster as dg\n"
        "from dagster import asset, _check\n"
        "import dagster._core.events\n"
        "from dagster_postgres._private import thing\n"
        "def later():\n"
        "    from dagster._core.storage.tags import PARTITION_NAME_TAG\n"
    )
    found = {str(item) for item in private_dagster_imports(tmp_path)}
    assert found == {
        "assets/example.py: dagster import _check",
        "assets/example.py: dagster._core.events",
        "assets/example.py: dagster_postgres._private import thing",
        "assets/example.py: dagster._core.storage.tags import PARTITION_NAME_TAG",
    }


@pytest.mark.parametrize("private_import", PRIVATE_IMPORTS, ids=str)
def test_private_dagster_symbol_still_exists(private_import: PrivateImport):
    import dagster

    where = f"{private_import.file} imports"
    try:
        module = importlib.import_module(private_import.module)
    except ImportError as error:
        pytest.fail(
            f"{where} from {private_import.module}, which Dagster {dagster.__version__} no longer has ({error}); "
            "find where the symbol moved and update the import (and the tested version in its docstring)"
        )
    if private_import.symbol is not None and not hasattr(module, private_import.symbol):
        pytest.fail(
            f"{where} {private_import.symbol} from {private_import.module}, which Dagster {dagster.__version__} "
            "no longer defines there; find where it moved and update the import (and the tested version in its "
            "docstring)"
        )


def _is_dagster_class(cls: type) -> bool:
    return cls.__module__.split(".")[0].startswith("dagster") and cls.__module__.split(".")[0] != "dagster_project"


def _overrides(module) -> list[tuple[type, str]]:
    """``(storage class, method)`` for each ``@override`` method a storage of ``module`` gets from
    ``module`` itself (its own or a mixin's)."""
    storages = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and any(_is_dagster_class(base) for base in cls.__mro__)
    ]
    return [
        (storage, name)
        for storage in storages
        for own in storage.__mro__
        if own.__module__ == module.__name__
        for name, member in vars(own).items()
        if getattr(getattr(member, "__func__", member), "__override__", False)
    ]


def test_instance_storage_overrides_still_override_dagster_methods():
    """A method Dagster renames would silently stop being called: each ``@override`` must find its base."""
    from dagster_project import instance_storage

    overrides = _overrides(instance_storage)
    assert {name for _, name in overrides} >= {"_connect", "store_event_batch", "get_dynamic_partitions"}
    for storage, name in overrides:
        if not any(name in vars(base) for base in storage.__mro__ if _is_dagster_class(base)):
            pytest.fail(
                f"dagster_project/instance_storage.py: {storage.__name__}.{name} is marked @override but no Dagster "
                f"base class of {storage.__name__} defines {name} any more: Dagster renamed or removed it"
            )


def _pinned_version(package: str) -> str:
    project = tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *(spec for extra in project["optional-dependencies"].values() for spec in extra)]
    pins = [spec for spec in specs if re.match(rf"^{re.escape(package)}==", spec)]
    assert len(pins) == 1, f"pyproject.toml pins {package} exactly once (==): found {pins}"
    return pins[0].split("==", 1)[1]


def test_instance_storage_states_the_pinned_dagster_versions_it_is_tested_against():
    from importlib.metadata import version

    from dagster_project import instance_storage

    for package in ("dagster", "dagster-postgres"):
        pinned = _pinned_version(package)
        assert f"{package}=={pinned}" in (instance_storage.__doc__ or ""), (
            f"instance_storage.py's docstring must name the {package} version it is tested against, {package}=={pinned} "
            "(pyproject.toml's pin): after an upgrade, run tests/integration/test_instance_storage.py and update both"
        )
        assert version(package) == pinned, f"installed {package} {version(package)} is not the pinned {pinned}"
