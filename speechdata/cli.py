"""``speechdata``: the one command line of the platform (no Dagster needed).

Each command lives in its domain package as a module exposing ``register(subparsers)``, which adds
its subparser and sets ``run`` (``args -> exit status``). ``COMMANDS`` lists the core's modules:
adding a command is one line there. Layers above the core add theirs without the core naming them:
a module declared in the ``speechdata.commands`` entry-point group (pyproject.toml; the Dagster
code location's ``speechdata shard``) is registered after the core's. Bad usage exits 2 (argparse);
a command that fails on its input exits with its own status (1 for an unusable landing shard or
import source, 2 for the catalog's errors).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
import tomllib
from pathlib import Path

COMMANDS = (
    "speechdata.importers.cli",  # speechdata import segment-tars|aligned-json|granary|language-tars
    "speechdata.catalog.cli",  # speechdata catalog
    "speechdata.alignment.mfa_corpus",  # speechdata mfa-corpus
    "speechdata.landing.cli",  # speechdata land
    "speechdata.export.command",  # speechdata export nemo|lhotse|moshi
    "speechdata.quality.near_dup_cli",  # speechdata near-duplicates batch / compact
)
"""The core's modules with a ``register(subparsers)``, in the order ``--help`` lists them."""

COMMAND_ENTRY_POINTS = "speechdata.commands"
"""The entry-point group of command modules from the layers above the core (``name = "module"``)."""

CHECKOUT_PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
"""In a source checkout (an editable install), the declaration itself: read too, so a group entry
added since the install works before the package is reinstalled."""


def entry_point_command_modules() -> list[str]:
    """The modules of the ``speechdata.commands`` group: this checkout's pyproject.toml (when the
    package runs from one), then every installed distribution's, each module once. A command
    module imports nothing heavy at import (``speechdata --help`` stays fast and Dagster-free)."""
    modules = []
    if CHECKOUT_PYPROJECT.is_file():
        project = tomllib.loads(CHECKOUT_PYPROJECT.read_text(encoding="utf-8")).get("project", {})
        modules += project.get("entry-points", {}).get(COMMAND_ENTRY_POINTS, {}).values()
    modules += [entry_point.module for entry_point in importlib.metadata.entry_points(group=COMMAND_ENTRY_POINTS)]
    return list(dict.fromkeys(modules))


EPILOG = """examples:
  speechdata land .data/landing/my-shard-0001
  speechdata import granary granary-0001 train-00000.parquet --language en --data-root .data
  speechdata catalog --named hours_per_language --data-root s3://bucket/platform
  speechdata shard status my-shard-0001

Every command takes --data-root URL (default: $DATA_ROOT, else ./.data); long ones show progress
on stderr when it is a terminal, and take --quiet.
'speechdata COMMAND --help' describes each command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speechdata",
        description="Land, import and query the speech data platform's data (DATA_ROOT); run and backfill its shards.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND", required=True)
    for module in (*COMMANDS, *entry_point_command_modules()):
        importlib.import_module(module).register(subparsers)
    return parser


def run(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; its exit status (argparse's SystemExit for usage and --help)."""
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


def main(argv: list[str] | None = None) -> int:
    """The console script: run, then leave without the interpreter's teardown.

    With both polars and pyarrow loaded, the teardown aborts now and then (SIGABRT from a native
    thread pool's destructor), which would replace the command's exit status with 134. Every file a
    command writes is closed (and atomically renamed) before it returns, so skipping the teardown
    loses nothing; output is flushed first.
    """
    try:
        status = run(argv)
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        if exit_.code is not None and not isinstance(exit_.code, int):
            print(exit_.code, file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main()
