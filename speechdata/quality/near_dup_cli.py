"""``speechdata near-duplicates batch``: the whole-corpus near-duplicate pass from a shell; and
``speechdata near-duplicates compact``: the index's merges too large for a shard's own run.

Decides the selected shards at once (:mod:`speechdata.quality.near_dup_batch`) on a Ray cluster
(``--ray-address``, default ``$SPEECHDATA_RAY_ADDRESS``, else a Ray instance started on this machine)
or in this process (``--in-process``), and writes every shard's ``near_duplicates.parquet`` and the
index exactly as the incremental asset would, shard by shard in the index order. Progress on stderr (on a
terminal), a summary on stdout; an unusable selection or input exits 1 with one line naming it.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from speechdata.command_options import (
    add_data_root_option,
    add_quiet_option,
    data_root_from_args,
    finite_float,
    key_type,
    non_negative_int,
    positive_int,
    progress_enabled,
)
from speechdata.io.confinement import DataRootMissing
from speechdata.quality.near_dup_batch import (
    DEFAULT_PARTITIONS,
    run_near_duplicates_batch,
    select_shards,
)
from speechdata.quality.near_dup_batch_ray import IN_PROCESS, LOCAL, RAY_ADDRESS_ENV, batch_engine
from speechdata.quality.near_dup_compaction import compact_pending
from speechdata.quality.near_dup_index import CorpusIndexBusy
from speechdata.quality.near_dup_matching import NearDuplicateThresholds
from speechdata.quality.near_duplicates import recall_warning

EXIT_FAILED = 1
PROGRESS_EVERY_S = 2.0

DESCRIPTION = f"""Decide near duplicates for many shards at once: the first import of a corpus, or a re-run
after a threshold change (docs/near-duplicates.md, Whole-corpus batch pass).

The shards are decided in the index's order (indexed shards at their positions, new ones after, in
the order given), with the same decisions and the same files, byte for byte, as the near_duplicates
asset running them one by one; shards landing afterwards continue from the index it leaves. The
corpus index stays locked for the pass: incremental runs wait for it.

The tasks run on the Ray cluster at --ray-address (default ${RAY_ADDRESS_ENV}, else '{LOCAL}': a Ray
instance on this machine, stopped after), or in this process with --in-process."""

COMPACT_DESCRIPTION = """Run the near-duplicate index's due merges, lowest level first: those too large for
a shard's own run (creating a level above $SPEECHDATA_NEAR_DUP_INLINE_MERGE_LEVEL, default 2), and any
smaller one still due (docs/near-duplicates.md, Merges). Shards keep committing meanwhile: each merge
takes the index lock only for its switch. Killed, it leaves the index usable; run it again.
A line before and after each merge on stderr (on a terminal), a summary on stdout."""

COMPACT_EPILOG = """examples:
  speechdata near-duplicates compact                       # every due merge
  speechdata near-duplicates compact --max-merges 1 --quiet"""

EPILOG = """examples:
  speechdata near-duplicates batch                         # every shard with normalized audio
  speechdata near-duplicates compact                       # the index's merges too large for a shard's run
  speechdata near-duplicates batch --matching 'yodas-*' --ray-address ray://head:10001
  speechdata near-duplicates batch --min-transcript-jaccard 0.9 --signals-from index"""


def register(subparsers) -> None:
    """The speechdata near-duplicates command."""
    parser = subparsers.add_parser(
        "near-duplicates",
        help="decide near duplicates for a whole corpus at once (on Ray); merge the index's large segments",
        description="Near duplicates across the corpus: the whole-corpus batch pass, the index's compaction.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(title="commands", dest="near_duplicates_command", metavar="COMMAND", required=True)
    batch = commands.add_parser(
        "batch",
        help="decide the selected shards in one pass and write their files and the index",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    batch.add_argument(
        "shards",
        nargs="*",
        type=key_type("shard"),
        metavar="SHARD",
        help="shard ids, in the order new ones are indexed",
    )
    batch.add_argument(
        "--matching", metavar="GLOB", help="without SHARD: the shards with normalized audio matching GLOB"
    )
    batch.add_argument(
        "--signals-from",
        choices=("audio", "index"),
        default="audio",
        help="index: indexed shards reuse their stored signals (a threshold change; only if their audio is unchanged)",
    )
    batch.add_argument(
        "--ray-address", metavar="ADDRESS", default=None, help=f"auto, <head>:6379, ray://<head>:10001 or {LOCAL}"
    )
    batch.add_argument("--in-process", action="store_true", help="run every task in this process, without Ray")
    batch.add_argument(
        "--partitions",
        type=positive_int,
        metavar="N",
        default=DEFAULT_PARTITIONS,
        help="key partitions (parallel joins)",
    )
    defaults = NearDuplicateThresholds()
    for name, kind, metavar, help_text in (
        ("max_bit_error_rate", finite_float, "RATE", "near_audio: most share of differing fingerprint bits"),
        ("min_overlap_share", finite_float, "SHARE", "near_audio: least share of the shorter utterance overlapped"),
        ("min_duration_ratio", finite_float, "RATIO", "near_audio: least shorter/longer duration"),
        ("min_offset_votes", non_negative_int, "VOTES", "near_audio: sub-fingerprints agreeing on an offset"),
        ("min_transcript_jaccard", finite_float, "JACCARD", "near_transcript: least estimated Jaccard similarity"),
        ("min_transcript_words", non_negative_int, "WORDS", "near_transcript: shorter transcripts are never compared"),
    ):
        batch.add_argument(
            f"--{name.replace('_', '-')}",
            type=kind,
            metavar=metavar,
            default=getattr(defaults, name),
            help=f"{help_text} (default {getattr(defaults, name)})",
        )
    batch.add_argument(
        "--audio-only", action="store_true", help="only audio makes a duplicate (check_transcripts false)"
    )
    batch.add_argument(
        "--lock-timeout-s", type=finite_float, metavar="S", default=60.0, help="longest wait for the index lock"
    )
    add_data_root_option(batch)
    add_quiet_option(batch)
    batch.set_defaults(run=run_batch)
    compact = commands.add_parser(
        "compact",
        help="run the index's due merges (those too large for a shard's run), with progress",
        description=COMPACT_DESCRIPTION,
        epilog=COMPACT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    compact.add_argument(
        "--max-merges", type=positive_int, metavar="N", default=None, help="stop after N merges (default: all due)"
    )
    compact.add_argument(
        "--lock-timeout-s", type=finite_float, metavar="S", default=60.0, help="longest wait for the index lock"
    )
    add_data_root_option(compact)
    add_quiet_option(compact)
    compact.set_defaults(run=run_compact)


def thresholds_from_args(args: argparse.Namespace) -> NearDuplicateThresholds:
    return NearDuplicateThresholds(
        max_bit_error_rate=args.max_bit_error_rate,
        min_overlap_share=args.min_overlap_share,
        min_duration_ratio=args.min_duration_ratio,
        min_offset_votes=args.min_offset_votes,
        min_transcript_jaccard=args.min_transcript_jaccard,
        min_transcript_words=args.min_transcript_words,
        check_transcripts=not args.audio_only,
    )


def progress_printer(quiet: bool, write: Callable[[str], None] | None = None) -> Callable[[str, int, int], None]:
    """A progress callback printing ``stage done/total`` on stderr: each stage's start and end, and in
    between at most every :data:`PROGRESS_EVERY_S` seconds."""
    write = write or (lambda line: print(line, file=sys.stderr, flush=True))
    last = {"at": 0.0}

    def report(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if quiet or (0 < done < total and now - last["at"] < PROGRESS_EVERY_S):
            return
        last["at"] = now
        write(f"near-duplicates batch: {stage} {done}/{total}")

    return report


def run_batch(args: argparse.Namespace) -> int:
    quiet = not progress_enabled(args.quiet)
    try:
        root = data_root_from_args(args, what="near-duplicates batch")
        shards = select_shards(root, args.shards, args.matching)
        thresholds = thresholds_from_args(args)
        options = dict(
            signals_from=args.signals_from,
            partitions=args.partitions,
            on_progress=progress_printer(quiet),
            lock_timeout_s=args.lock_timeout_s,
        )
        address = IN_PROCESS if args.in_process else args.ray_address
        with batch_engine(address) as (engine, where):
            if not quiet:
                print(f"near-duplicates batch: {len(shards)} shards, {where}", file=sys.stderr)
            summary = run_near_duplicates_batch(root, shards, thresholds, engine=engine, **options)
    except (ValueError, FileNotFoundError, CorpusIndexBusy, DataRootMissing) as error:
        print(f"speechdata near-duplicates batch: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    for shard in summary.shards:
        warning = recall_warning(shard.shard_id, shard.audio_key_load)
        if warning is not None:
            print(f"speechdata near-duplicates batch: warning: {warning}", file=sys.stderr)
    print(summary.describe())
    return 0


def run_compact(args: argparse.Namespace) -> int:
    quiet = not progress_enabled(args.quiet)
    try:
        root = data_root_from_args(args, what="near-duplicates compact")
        summary = compact_pending(
            root,
            max_merges=args.max_merges,
            on_progress=None if quiet else lambda line: print(f"near-duplicates compact: {line}", file=sys.stderr),
            timeout_s=args.lock_timeout_s,
        )
    except (ValueError, CorpusIndexBusy, DataRootMissing) as error:
        print(f"speechdata near-duplicates compact: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(summary.describe())
    return 0
