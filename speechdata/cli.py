"""``speechdata``: the one command line of the platform (no Dagster needed).

Each command lives in its domain package as a module exposing ``register(subparsers)``, which adds
its subparser and sets ``run`` (``args -> exit status``). ``COMMANDS`` lists those modules: adding
a command is one line there. Bad usage exits 2 (argparse); a command that fails on its input exits
with its own status (1 for an unusable landing shard or import source, 2 for the catalog's errors).
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = (
    "speechdata.importers.cli",  # speechdata import seed003|seed004|granary|language-tars
    "speechdata.catalog.cli",  # speechdata catalog
    "speechdata.alignment.mfa_corpus",  # speechdata mfa-corpus
    "speechdata.landing.cli",  # speechdata land
)
"""Modules with a ``register(subparsers)``, in the order ``--help`` lists them."""

EPILOG = """examples:
  speechdata land .data/landing/my-shard-0001
  speechdata import granary "$DATA_ROOT" granary-0001 train-00000.parquet --language en
  speechdata catalog --named hours_per_language

'speechdata COMMAND --help' describes each command."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speechdata",
        description="Land, import and query the speech data platform's data (DATA_ROOT).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(title="commands", dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        importlib.import_module(module).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
