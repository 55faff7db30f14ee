"""``speechdata import <format>``: one subcommand per importer module of this package."""

from __future__ import annotations

import argparse
import importlib
import sys

from speechdata.landing.contract import ContractError

FORMATS = {
    "segment-tars": "speechdata.importers.segment_tars",
    "aligned-json": "speechdata.importers.aligned_json",
    "granary": "speechdata.importers.granary",
    "language-tars": "speechdata.importers.language_tars",
}
"""Subcommand -> importer module (each has DESCRIPTION, EPILOG, add_arguments(parser) and run(args))."""

EXIT_FAILED = 1


def register(subparsers) -> None:
    """The ``speechdata import`` command and its per-format subcommands."""
    parser = subparsers.add_parser(
        "import",
        help="land a source dataset as landing shards (segment-tars, aligned-json, granary, language-tars)",
        description="Land a source dataset as shards under landing/ in the data root, each marked _SUCCESS last.",
        epilog="example:\n  speechdata import granary granary-0001 train-00000.parquet --language en --data-root .data\n\n"
        "Every format takes --data-root URL (default: $DATA_ROOT, else ./.data); a missing local root is\n"
        "created when its parent folder exists. Progress shows on stderr when it is a terminal (--quiet: off).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    formats = parser.add_subparsers(title="formats", dest="format", metavar="FORMAT", required=True)
    for name, module_name in FORMATS.items():
        module = importlib.import_module(module_name)
        sub = formats.add_parser(
            name,
            help=module.DESCRIPTION,
            description=module.DESCRIPTION,
            epilog=module.EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(run=_guarded(name, module.run))


def _guarded(name: str, run):
    """Run an importer; a problem with the input is one line on stderr and exit status 1."""

    def guarded(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (ContractError, ValueError, FileNotFoundError, OSError) as error:
            print(f"speechdata import {name}: error: {error}", file=sys.stderr)
            return EXIT_FAILED

    return guarded
