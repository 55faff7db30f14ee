"""The conventions every ``speechdata`` command shares: the data root option and progress on stderr.

One place, so that every command spells them the same way: ``--data-root URL`` (default
``$DATA_ROOT``, else ``./.data``), one error line naming a missing root, and progress bars on stderr
that stay off when stderr is not a terminal or with ``--quiet``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from speechdata.io.confinement import DataRootMissing, require_existing_root
from speechdata.io.env import DATA_ROOT_ENV, data_root_url
from speechdata.io.storage import DataRoot

DATA_ROOT_HELP = "the platform's data root: a path or fsspec URL (default: $DATA_ROOT, else ./.data)"
CREATED_ROOT_HELP = (
    "the platform's data root: a path or fsspec URL (default: $DATA_ROOT, else ./.data); "
    "a missing local root is created when its parent folder exists"
)

Item = TypeVar("Item")


def finite_float(text: str) -> float:
    """argparse ``type`` of every float option: ``nan``, ``inf`` and ``-inf`` exit 2 with the value
    named (``float("nan")`` parses, and a NaN limit compares false with every row: nothing filtered)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    """argparse ``type`` of a count option (``--limit``, ``--max-rows``): an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_int(text: str) -> int:
    """argparse ``type`` of a size option (``--samples-per-tar``): an integer >= 1."""
    value = non_negative_int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_data_root_option(parser: argparse.ArgumentParser, *, creates_root: bool = False) -> None:
    """``--data-root URL``; resolved by :func:`data_root_from_args`, never required."""
    parser.add_argument(
        "--data-root", metavar="URL", default=None, help=CREATED_ROOT_HELP if creates_root else DATA_ROOT_HELP
    )


def add_quiet_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def data_root_from_args(args: argparse.Namespace, *, what: str, creates_root: bool = False) -> DataRoot:
    """The data root ``--data-root`` names, else ``$DATA_ROOT``, else ``./.data``.

    A missing local root raises :class:`DataRootMissing` (one line naming it), unless ``creates_root``
    and its parent folder exists: then it is created, as an importer's first shard needs.
    """
    url = args.data_root or data_root_url()
    root = DataRoot(url)
    if creates_root and root.is_local and not os.path.isdir(root.root):
        parent = os.path.dirname(os.path.abspath(root.root))
        if not os.path.isdir(parent):
            raise DataRootMissing(root.root, f"{what} (its parent {parent!r} is missing too)")
        os.makedirs(root.root, exist_ok=True)
    require_existing_root(root.root, local=root.is_local, what=what)
    return root


def take_positional_data_root(args: argparse.Namespace, legacy_root: str | None, command: str) -> None:
    """The deprecated positional data root (``speechdata COMMAND ROOT ...``): used, with a warning."""
    if legacy_root is None:
        return
    print(
        f"speechdata {command}: warning: the positional data root is deprecated and will be removed; "
        f"write --data-root {legacy_root} (or set {DATA_ROOT_ENV})",
        file=sys.stderr,
    )
    if args.data_root and args.data_root != legacy_root:
        raise ValueError(f"two data roots: positional {legacy_root!r} and --data-root {args.data_root!r}")
    args.data_root = legacy_root


def progress_enabled(quiet: bool = False) -> bool:
    """Progress bars only for a person watching: not with ``--quiet``, not into a pipe or log file."""
    return not quiet and sys.stderr.isatty()


def with_progress(
    items: Iterable[Item], *, description: str, quiet: bool = False, total: int | None = None
) -> Iterator[Item]:
    """``items``, with a progress bar on stderr when :func:`progress_enabled`."""
    if not progress_enabled(quiet):
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=description, total=total, file=sys.stderr, unit="item", leave=False)
