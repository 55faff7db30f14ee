"""``speechdata land DIR``: check a landing shard against the contract and mark it landed.

``DIR`` is ``<data root>/landing/<shard_id>`` (a path or fsspec URL) holding ``metadata.parquet``
and the audio (``audio/`` or ``audio.tar``). The shard is validated exactly as ``raw_shards`` will
(docs/landing-contract.md): a shard-level problem names the file, the column and the rule and exits
1 without marking; row-level problems are listed (they become rejects in the pipeline). With
``--strict`` any rejected row also exits 1. Otherwise ``_SUCCESS`` is written (``mark_landed``) and
the landing sensor picks the shard up on its next tick. Re-running is harmless.
"""

from __future__ import annotations

import argparse
import posixpath
import sys
from collections import Counter
from pathlib import Path

from speechdata.command_options import add_data_root_option, data_root_from_args
from speechdata.io import layout
from speechdata.io.confinement import require_existing_root
from speechdata.io.storage import DataRoot
from speechdata.landing.contract import ContractError
from speechdata.landing.mark import mark_landed
from speechdata.landing.raw_shard import validate_landed_shard

EXIT_INVALID = 1
SHOWN_REJECTS = 10

DESCRIPTION = """Check a landing shard against the landing contract and mark it landed.

DIR is <data root>/landing/<shard_id> (a path or fsspec URL) holding metadata.parquet and the audio
(audio/ or audio.tar). The shard is validated exactly as the raw_shards asset will validate it
(docs/landing-contract.md). A shard-level problem names the file, the column and the rule, and exits 1
without marking the shard. Rejected rows are listed (the pipeline records them as rejects); with
--strict any rejected row also exits 1. Otherwise _SUCCESS is written and the landing sensor picks the
shard up on its next tick. Running it again is harmless.

DIR may also be a bare shard id: the shard under <data root>/landing/, the data root being --data-root,
else $DATA_ROOT, else ./.data. The data root must exist: land never creates it."""

EPILOG = """examples:
  speechdata land .data/landing/my-shard-0001
  speechdata land s3://bucket/platform/landing/my-shard-0001 --strict"""


def register(subparsers) -> None:
    """The speechdata land subcommand."""
    parser = subparsers.add_parser(
        "land",
        help="validate a landing shard directory against the landing contract and mark it landed",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "dir",
        metavar="DIR",
        help="<data root>/landing/<shard_id> (path or fsspec URL), or a bare shard id under --data-root",
    )
    add_data_root_option(parser)
    parser.add_argument("--strict", action="store_true", help="refuse to mark the shard when any row is rejected")
    parser.set_defaults(run=run)


def split_landing_dir(directory: str) -> tuple[DataRoot, str]:
    """``<root>/landing/<shard_id>`` -> (the data root, the shard id); ValueError otherwise."""
    text = directory.rstrip("/")
    if "://" not in text:
        text = str(Path(text).resolve())
    parent, shard_id = posixpath.split(text)
    root, landing = posixpath.split(parent)
    if landing != layout.LANDING:
        raise ValueError(
            f"{directory}: not a landing shard directory (expected <data root>/{layout.LANDING}/<shard_id>)"
        )
    if not layout.is_valid_shard_id(shard_id):
        raise ValueError(f"{directory}: shard id {shard_id!r} must match {layout.SHARD_ID_PATTERN.pattern}")
    return DataRoot(root), shard_id


def run(args: argparse.Namespace) -> int:
    try:
        if layout.is_valid_shard_id(args.dir):
            root, shard_id = data_root_from_args(args, what="land"), args.dir
        else:
            root, shard_id = split_landing_dir(args.dir)
            require_existing_root(root.root, local=root.is_local, what="land")
        validation = validate_landed_shard(root, shard_id)
    except (ContractError, ValueError, FileNotFoundError) as error:
        print(f"speechdata land: error: {error}", file=sys.stderr)
        return EXIT_INVALID
    rejects = validation.rejects
    kept = validation.index.num_rows
    for reject in rejects[:SHOWN_REJECTS]:
        print(f"reject {reject.utt_id}: {reject.reason}: {reject.detail}", file=sys.stderr)
    if len(rejects) > SHOWN_REJECTS:
        print(f"... and {len(rejects) - SHOWN_REJECTS} more rejects", file=sys.stderr)
    by_reason = dict(Counter(r.reason for r in rejects).most_common())
    if kept == 0 or (args.strict and rejects):
        why = "no usable utterance" if kept == 0 else "--strict and rejected rows"
        print(
            f"speechdata land: error: {root.uri(layout.landing_metadata(shard_id))}: {why} "
            f"({validation.landed_rows} rows, {len(rejects)} rejected: {by_reason}); not marked landed",
            file=sys.stderr,
        )
        return EXIT_INVALID
    mark_landed(root, shard_id)
    print(
        f"{shard_id}: {kept} of {validation.landed_rows} utterances usable ({validation.hours:.4f} h), "
        f"{len(rejects)} rejected {by_reason or ''}; marked landed: {root.uri(layout.landing_success_marker(shard_id))}"
    )
    return 0
