"""Ask the catalog questions from a terminal: SQL, named queries, exports of a selection.

    speechdata catalog "SELECT language, count(*) FROM samples GROUP BY 1"
    speechdata catalog --named hours_per_language
    speechdata catalog --list
    speechdata catalog --language en --min-score -2.5 --limit 20
    speechdata catalog --export-urls tars.txt --country us
    speechdata catalog --refresh [--full] [--named hours_per_shard]

(``python -m speechdata.catalog.cli`` and ``python -m dagster_project.catalog`` are aliases.)
Reads ``<DATA_ROOT>/catalog.duckdb`` (``DATA_ROOT``, default ``./.data``, or ``--data-root``) through a
connection that cannot write anything (:mod:`speechdata.catalog.readonly`): no query changes the
catalog or a file under the root. Filter values are bound as parameters. ``--refresh`` rebuilds the views and summary tables first, reading
only the manifests changed since the last refresh (``--full``: all of them), into a new file swapped
in whole: queries running meanwhile read the previous version.
Errors print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator

import duckdb

from speechdata.catalog.database_checks import BUILD_COMMAND, check_catalog_file
from speechdata.catalog.database_file import RefreshedCatalog, catalog_files, refresh_catalog_file
from speechdata.catalog.display import format_table
from speechdata.catalog.exports import export_tar_urls
from speechdata.catalog.queries import NAMED_QUERIES, run_query, select_samples
from speechdata.catalog.reading import CatalogNotBuilt, open_catalog_read_only
from speechdata.catalog.readonly import check_query_only
from speechdata.catalog.views import CATALOG_FILE
from speechdata.command_options import (
    add_data_root_option,
    add_quiet_option,
    data_root_from_args,
    finite_float,
    non_negative_int,
    with_progress,
)
from speechdata.io.duckdb_object_store import database_on_root
from speechdata.io.storage import DataRoot, filesystem_for, write_bytes_atomic

EXIT_ERROR = 2


class CatalogCliError(Exception):
    """A problem the user can fix; printed as one line."""


def check_own_files(root: DataRoot) -> None:
    """The catalog's own refusal (:class:`CatalogFileRefused`, naming the file and what it is) before
    the data root's confinement sees a catalog file that links out (which would refuse it too, by
    the rule for every path)."""
    if root.is_local:
        for path in catalog_files(f"{root.root}/{CATALOG_FILE}"):
            check_catalog_file(path)


@contextlib.contextmanager
def open_catalog(root: DataRoot) -> Iterator[duckdb.DuckDBPyConnection]:
    """A read-only connection to the root's catalog (from an object-store root: a local copy, whose
    views read the bucket through the root's fsspec filesystem). A refresh in progress does not
    get in the way: this reads the version before it, whole."""
    check_own_files(root)
    if not root.exists(CATALOG_FILE):
        raise CatalogNotBuilt(
            f"no catalog at {root.uri(CATALOG_FILE)}: build it with `{BUILD_COMMAND}` "
            "(or materialize the manifest_catalog asset)"
        )
    with (
        database_on_root(root, CATALOG_FILE, read_only=True) as local,
        open_catalog_read_only(local, root, root.uri(CATALOG_FILE)) as connection,
    ):
        yield connection


def refresh(root: DataRoot, full: bool = False) -> RefreshedCatalog:
    """Rebuild the catalog (reading only changed manifests unless ``full``) into a new file swapped in
    whole; an object-store root's file is built locally and uploaded whole."""
    check_own_files(root)
    with database_on_root(root, CATALOG_FILE) as local:
        return refresh_catalog_file(local, root, full=full)


def parse_where(items: list[str]) -> dict[str, str]:
    where = {}
    for item in items:
        column, sep, value = item.partition("=")
        if not sep or not column:
            raise CatalogCliError(f"--where wants COLUMN=VALUE, got {item!r}")
        where[column.strip()] = value
    return where


DESCRIPTION = "Query the DuckDB catalog of shard manifests and rejects ledgers."
EPILOG = """examples:
  speechdata catalog --named hours_per_language
  speechdata catalog "SELECT language, count(*) FROM samples GROUP BY 1"
  speechdata catalog --export-urls en.txt --language en --min-score -2.5"""


def register(subparsers) -> None:
    """The speechdata catalog subcommand."""
    parser = subparsers.add_parser(
        "catalog",
        help="query the DuckDB catalog (SQL, named queries, exports)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    parser.set_defaults(run=lambda args: run(args, parser))


def build_parser(prog: str = "python -m speechdata.catalog.cli") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sql", nargs="?", help="a SQL query over samples, rejects and the summary tables")
    actions = parser.add_argument_group("what to do (one of)")
    actions.add_argument("--named", metavar="NAME", help="run a named query (see --list)")
    actions.add_argument("--list", action="store_true", help="list the named queries")
    actions.add_argument(
        "--export-nemo", metavar="PATH", help="moved: use 'speechdata export nemo' (NeMo tarred or plain datasets)"
    )
    actions.add_argument("--export-urls", metavar="PATH", help="write the selection's distinct tar URLs, one a line")
    parser.add_argument("--refresh", action="store_true", help="rebuild the catalog's views and summary tables first")
    parser.add_argument(
        "--full",
        action="store_true",
        help="with --refresh: re-read every manifest and ledger, not only those changed since the last refresh",
    )
    selection = parser.add_argument_group("selection (printed, or exported with --export-*)")
    selection.add_argument("--language", action="append", help="keep this language (repeatable)")
    selection.add_argument("--country", action="append", help="keep this country (repeatable)")
    selection.add_argument("--min-score", type=finite_float, help="minimum alignment_score (inclusive)")
    selection.add_argument("--min-duration", type=finite_float, help="minimum duration_s (inclusive)")
    selection.add_argument("--max-duration", type=finite_float, help="maximum duration_s (inclusive)")
    selection.add_argument(
        "--where", action="append", default=[], metavar="COLUMN=VALUE", help="equality filter (repeatable)"
    )
    selection.add_argument("--limit", type=non_negative_int, help="at most this many samples")
    parser.add_argument("--max-rows", type=non_negative_int, default=50, help="rows to print (default 50)")
    add_data_root_option(parser)
    add_quiet_option(parser)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    return run(parser.parse_args(argv), parser)


def _checked_usage(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[list[str], bool]:
    """The actions chosen and whether selection filters were given; ``parser.error`` (exit 2) on a
    combination that cannot be carried out."""
    filters = any(
        value not in (None, [])
        for value in (
            args.language,
            args.country,
            args.min_score,
            args.min_duration,
            args.max_duration,
            args.where,
            args.limit,
        )
    )
    chosen = [
        name
        for name, on in (
            ("SQL", args.sql is not None),
            ("--named", args.named is not None),
            ("--list", args.list),
            ("--export-nemo", args.export_nemo is not None),
            ("--export-urls", args.export_urls is not None),
        )
        if on
    ]
    if len(chosen) > 1:
        parser.error(f"choose one of SQL, --named, --list, --export-nemo, --export-urls (got {', '.join(chosen)})")
    if filters and chosen and chosen[0] in ("SQL", "--named", "--list"):
        parser.error(f"selection filters apply to a selection or an export, not to {chosen[0]}")
    if args.full and not args.refresh:
        parser.error("--full applies to --refresh")
    if not chosen and not filters and not args.refresh:
        parser.error("nothing to do: give SQL, --named, --list, --export-*, selection filters or --refresh")
    return chosen, filters


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Carry out parsed arguments; ``parser.error`` (exit 2) on bad usage."""
    chosen, filters = _checked_usage(args, parser)

    if args.export_nemo is not None:
        print(
            "catalog: error: --export-nemo moved: `speechdata export nemo --data-root ROOT --out DIR "
            "[--plain] [--language L] [--min-score X]` writes a NeMo dataset its loaders read as is",
            file=sys.stderr,
        )
        return EXIT_ERROR
    if args.list:
        for name, sql in NAMED_QUERIES.items():
            print(f"{name}\n    {' '.join(sql.split())}")
        return 0
    try:
        root = data_root_from_args(args, what="catalog")
        if args.refresh:
            for _ in with_progress([root], description="catalog --refresh", quiet=args.quiet, total=1):
                refreshed = refresh(root, full=args.full)
            _report_refresh(refreshed)
            if not chosen and not filters:
                return 0
        with open_catalog(root) as connection:
            _query(connection, args, root)
    except (CatalogCliError, ValueError, duckdb.Error, OSError) as error:
        # DuckDB's messages go on with the query and a caret on later lines: the first says what went wrong.
        lines = str(error).strip().splitlines()
        message = lines[0] if lines else type(error).__name__
        if message.startswith("Traceback"):  # raised in Python under DuckDB (the read-only filesystem): its last line
            message = lines[-1]
        print(f"catalog: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def _query(connection, args: argparse.Namespace, root) -> None:
    """A named query, the user's SQL, or a selection of samples (printed, or its tar URLs written)."""
    if args.named is not None:
        if args.named not in NAMED_QUERIES:
            raise CatalogCliError(f"no named query {args.named!r}; known: {', '.join(NAMED_QUERIES)}")
        print(format_table(run_query(connection, NAMED_QUERIES[args.named]), max_rows=args.max_rows))
        return
    if args.sql is not None:
        check_query_only(connection, args.sql)
        print(format_table(run_query(connection, args.sql), max_rows=args.max_rows))
        return
    table = select_samples(
        connection,
        where=parse_where(args.where),
        min_alignment_score=args.min_score,
        min_duration_s=args.min_duration,
        max_duration_s=args.max_duration,
        languages=args.language,
        countries=args.country,
        limit=args.limit,
    )
    if args.export_urls is not None:
        urls = export_tar_urls(table, root.url)
        fs, path = filesystem_for(args.export_urls)
        write_bytes_atomic(fs, path, "".join(f"{url}\n" for url in urls).encode("utf-8"))
        print(f"wrote {len(urls)} tar URLs ({table.num_rows} samples) to {args.export_urls}")
    else:
        print(format_table(table, max_rows=args.max_rows))


def _report_refresh(refreshed: RefreshedCatalog) -> None:
    """The refresh's totals on stdout; a rebuild from scratch says why on stderr."""
    summary = refreshed.summary
    if refreshed.rebuilt_because:
        print(f"catalog: rebuilt from scratch: {refreshed.rebuilt_because}", file=sys.stderr)
    print(
        f"catalog refreshed: {summary.shards} shards, {summary.samples} samples, {summary.hours:.2f} h, "
        f"{summary.rejected_utterances} rejected utterances; languages: {', '.join(summary.languages) or '-'}; "
        f"countries: {', '.join(summary.countries) or '-'}; "
        f"manifests read {summary.manifests_read}, reused {summary.manifests_reused}; "
        f"shard accounting recounted for {summary.accounting_shards_read} shards"
    )


if __name__ == "__main__":
    sys.exit(main())
