"""``speechdata shard status|run|backfill``: a shard's state, and runs and backfills from a shell.

The commands that need Dagster: ``speechdata.cli`` registers this module (it imports no Dagster at
import time, so ``speechdata --help`` and the other commands stay Dagster-free and fast) and each
command imports the Dagster side when it runs. ``status`` reads the Dagster instance
(``DAGSTER_HOME``) and the data root; ``run`` and ``backfill`` go through the webserver's GraphQL
API, as the UI does (:mod:`dagster_project.webserver_launch`), so the daemon processes them and the
UI's Runs and Backfills pages show them.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys

from speechdata.command_options import (
    add_data_root_option,
    add_quiet_option,
    data_root_from_args,
    key_type,
    progress_enabled,
)
from speechdata.io.env import BACKFILL_SHARDS_PER_RUN_ENV, DEFAULT_BACKFILL_SHARDS_PER_RUN

DEFAULT_WEBSERVER_URL = "http://localhost:3000"
WEBSERVER_URL_ENV = "DAGSTER_WEBSERVER_URL"
LAUNCHED_BY_TAG = "speechdata/launched_by"
EXIT_FAILED = 1
EXIT_BAD_SELECTION = 2
MAKE_DEV_HOME = ".dagster_home"
"""The instance folder ``make dev`` and ``make demo`` use when ``DAGSTER_HOME`` is unset (the Makefile's default)."""
NEEDS_PLATFORM = "needs the platform extra (pip install 'speech-data-platform[platform]')"

DESCRIPTION = """A shard's state, and runs and backfills of shard assets launched through Dagster.

status reads the Dagster instance in $DAGSTER_HOME (or --dagster-home) and the data root. run and
backfill go through the Dagster webserver (--url, else $DAGSTER_WEBSERVER_URL, else
http://localhost:3000, what make dev serves), exactly as the UI launches them: the runs and the
backfill are in the UI's Runs and Backfills pages and the daemon processes them."""

EPILOG = """examples:
  speechdata shard status demo-0001
  speechdata shard run --shards demo-0001 --select raw_shards,normalized_audio --wait
  speechdata shard backfill --missing --group features,packaging"""


def register(subparsers) -> None:
    """The speechdata shard command and its subcommands."""
    parser = subparsers.add_parser(
        "shard",
        help="a shard's status; run or backfill shard assets through Dagster (needs the platform extra)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(title="commands", dest="shard_command", metavar="COMMAND", required=True)
    _register_status(commands)
    _register_launch(
        commands,
        "run",
        "launch one run per shard of the selected assets",
        "Launch one run per shard of the selected shard assets (the UI's Launch 1 run), through the webserver.",
        "  speechdata shard run --shards demo-0001 --select raw_shards,normalized_audio --wait\n"
        "  speechdata shard run --matching 'lid-*' --group vad",
    )
    _register_launch(
        commands,
        "backfill",
        "launch one backfill of the selected assets over many shards",
        "Launch one backfill of the selected shard assets over the shards (the UI's Launch backfill), through\n"
        "the webserver: the daemon runs it under the assets' backfill policy (up to "
        f"{DEFAULT_BACKFILL_SHARDS_PER_RUN} shards per run;\n${BACKFILL_SHARDS_PER_RUN_ENV} "
        "in the code location's environment sets another figure).",
        "  speechdata shard backfill --all --select frame_grids,qwen_hidden_states,wavlm_features\n"
        "  speechdata shard backfill --missing --wait\n"
        "  speechdata shard backfill --shards a-0001,a-0002 --group packaging --launched-by alice\n"
        "  speechdata shard backfill --all --before near_duplicates --wait   # a first import: docs/deploying.md\n"
        "  speechdata shard backfill --all --after near_duplicates --wait",
    )


def _register_status(commands) -> None:
    parser = commands.add_parser(
        "status",
        help="whether a shard is registered and landed, each shard asset's latest outcome, its ledgers",
        description=(
            "One shard's state: registered (the 'shard' dynamic partition), landed (files, fingerprint),\n"
            "each shard asset's latest materialization (time, run, data and code version) or failure\n"
            "(with its reason), and its ledgers (landed, produced, rejected per product, rejects by reason)."
        ),
        epilog="examples:\n  speechdata shard status demo-0001\n  speechdata shard status demo-0001 --json | jq .assets",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("shard_id", metavar="SHARD_ID", type=key_type("shard"))
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout, for scripts")
    parser.add_argument(
        "--dagster-home",
        metavar="DIR",
        default=None,
        help=f"the Dagster instance's folder (default: $DAGSTER_HOME, else ./{MAKE_DEV_HOME}, the one make dev uses)",
    )
    add_data_root_option(parser)
    add_quiet_option(parser)
    parser.set_defaults(run=run_status)


def _register_launch(commands, name: str, summary: str, description: str, examples: str) -> None:
    parser = commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog=f"examples:\n{examples}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    shards = parser.add_mutually_exclusive_group(required=True)
    shards.add_argument("--shards", metavar="A,B,C", type=_shard_list, help="these shards (each must be registered)")
    shards.add_argument("--all", action="store_true", help="every registered shard")
    shards.add_argument(
        "--missing", action="store_true", help="registered shards where some selected asset has no materialization"
    )
    shards.add_argument("--matching", metavar="GLOB", help="registered shards whose id matches GLOB (fnmatch: 'lid-*')")
    parser.add_argument(
        "--select", metavar="ASSET,...", type=_comma_list, default=[], help="shard assets (default: every one)"
    )
    parser.add_argument(
        "--group", metavar="GROUP,...", type=_comma_list, default=[], help="every shard asset of these groups"
    )
    split = parser.add_mutually_exclusive_group()
    split.add_argument(
        "--before",
        metavar="ASSET",
        default=None,
        help="only the selected assets ASSET reads, directly or not (default selection: per_shard_job's)",
    )
    split.add_argument(
        "--after",
        metavar="ASSET",
        default=None,
        help="the selected assets but ASSET and those it reads (default selection: per_shard_job's)",
    )
    parser.add_argument(
        "--url",
        default=None,
        help=f"the Dagster webserver (default: ${WEBSERVER_URL_ENV}, else {DEFAULT_WEBSERVER_URL})",
    )
    parser.add_argument(
        "--launched-by",
        metavar="WHO",
        default=None,
        help=f"the {LAUNCHED_BY_TAG} tag of the runs (default: speechdata-cli:<user>)",
    )
    parser.add_argument("--wait", action="store_true", help="follow to the end; exit 1 when a run fails")
    add_data_root_option(parser)
    add_quiet_option(parser)
    parser.set_defaults(run=run_launch, launch_as=name)


def _comma_list(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _shard_list(text: str) -> list[str]:
    """``--shards A,B``: each a valid shard id (an invalid one exits 2 naming it)."""
    return [_shard_key(item) for item in _comma_list(text)]


_shard_key = key_type("shard")


def run_status(args: argparse.Namespace) -> int:
    command = "speechdata shard status"
    try:
        data_root = data_root_from_args(args, what="shard status")
        import dagster as dg

        from dagster_project.shard_status import shard_asset_keys, shard_status, status_text
    except ImportError as error:
        print(f"{command}: error: {NEEDS_PLATFORM}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, OSError) as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    home = instance_home(args.dagster_home)
    if not os.path.isdir(home):
        given = "--dagster-home" if args.dagster_home else "$DAGSTER_HOME" if os.environ.get("DAGSTER_HOME") else None
        where = (
            f"{home!r} ({given}) does not exist"
            if given
            else f"neither --dagster-home nor $DAGSTER_HOME is set and {home!r} (make dev's) does not exist"
        )
        print(
            f"{command}: error: no Dagster instance: {where}; `make dev` or `make demo` creates ./{MAKE_DEV_HOME}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    # The instance's dagster.yaml names its storage folder as {env: DAGSTER_HOME} (deploy/local):
    # point the variable at the folder asked for, or its storage would be another instance's.
    os.environ["DAGSTER_HOME"] = os.path.abspath(home)
    from dagster_project.definitions import defs
    from speechdata.command_options import with_progress

    def progress(items):
        return with_progress(items, description=f"{args.shard_id} assets", quiet=args.quiet)

    try:
        with dg.DagsterInstance.from_config(home) as instance:
            status = shard_status(
                instance,
                data_root,
                args.shard_id,
                shard_asset_keys(defs),
                progress,
                instance_home=os.path.abspath(home),
            )
    except (ValueError, OSError) as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    except dg.DagsterError as error:
        registering = (
            "; shards are registered there by the landing sensor of `make dev`, once landing/<shard>/_SUCCESS "
            "is written"
            if isinstance(error, dg.DagsterInvalidSubsetError)
            else ""
        )
        print(
            f"{command}: error: {type(error).__name__}: {error} (instance {os.path.abspath(home)}{registering})",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(json.dumps(status.as_json(), indent=2) if args.json else status_text(status))
    return 0


def instance_home(given: str | None) -> str:
    """``--dagster-home``, else ``$DAGSTER_HOME``, else ``./.dagster_home``: where ``make dev`` keeps it."""
    return given or os.environ.get("DAGSTER_HOME") or os.path.abspath(MAKE_DEV_HOME)


def run_launch(args: argparse.Namespace) -> int:
    command = f"speechdata shard {args.launch_as}"
    try:
        data_root = data_root_from_args(args, what=f"shard {args.launch_as}")
        from dagster_project import webserver_launch as launch
    except ImportError as error:
        print(f"{command}: error: {NEEDS_PLATFORM}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except (ValueError, OSError) as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    web = launch.Webserver(args.url or os.environ.get(WEBSERVER_URL_ENV) or DEFAULT_WEBSERVER_URL)
    try:
        nodes = launch.asset_nodes(web)
        assets = launch.select_assets(nodes, args.select, args.group, before=args.before, after=args.after)
        registered = launch.registered_shards(web, assets[0])
        shards = launch.choose_shards(
            registered,
            named=args.shards,
            every=args.all,
            matching=args.matching,
            materialized=launch.materialized_shards(web, assets) if args.missing else None,
        )
    except launch.SelectionError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_BAD_SELECTION
    except launch.WebserverError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED
    _warn_about_unlanded(command, data_root, shards)
    tags = {LAUNCHED_BY_TAG: args.launched_by or f"speechdata-cli:{_user()}"}
    try:
        if args.launch_as == "run":
            return _run(web, launch, nodes, assets, shards, tags, args)
        return _backfill(web, launch, assets, shards, tags, args)
    except launch.WebserverError as error:
        print(f"{command}: error: {error}", file=sys.stderr)
        return EXIT_FAILED


def _run(web, launch, nodes, assets, shards, tags, args) -> int:
    run_ids = launch.launch_runs(web, nodes, assets, shards, tags)
    print(f"{len(run_ids)} runs of {len(assets)} assets ({', '.join(assets)}); runs: {web.url}/runs")
    for shard, run_id in run_ids.items():
        print(f"run {run_id} shard {shard}: {web.run_url(run_id)}")
    if not args.wait:
        return 0
    bar = _bar(len(run_ids), "runs", args.quiet)
    statuses = launch.wait_for_runs(web, list(run_ids.values()), lambda run_id, status: bar.update(1))
    bar.close()
    failed = {run_id: status for run_id, status in statuses.items() if status != "SUCCESS"}
    for shard, run_id in run_ids.items():
        print(f"run {run_id} shard {shard}: {statuses[run_id]}")
    return EXIT_FAILED if failed else 0


def _backfill(web, launch, assets, shards, tags, args) -> int:
    title = f"{tags[LAUNCHED_BY_TAG]}: {len(assets)} assets x {len(shards)} shards"
    backfill_id = launch.launch_backfill(web, assets, shards, tags, title)
    print(f"backfill {backfill_id} of {len(assets)} assets ({', '.join(assets)}) over {len(shards)} shards")
    print(f"backfill {backfill_id}: {web.backfill_url(backfill_id)}")
    if not args.wait:
        return 0
    bar = _bar(None, "asset partitions", args.quiet)

    def on_progress(done: int, targeted: int) -> None:
        bar.total = targeted or None
        bar.n = done
        bar.refresh()

    status, runs = launch.wait_for_backfill(web, backfill_id, on_progress)
    bar.close()
    for run in runs:
        print(f"run {run['runId']}: {run['status']} {web.run_url(run['runId'])}")
    print(f"backfill {backfill_id}: {status}")
    failed = status not in launch.SUCCESSFUL_BACKFILL or any(run["status"] != "SUCCESS" for run in runs)
    return EXIT_FAILED if failed else 0


def _warn_about_unlanded(command: str, data_root, shards: list[str]) -> None:
    """A registered shard with nothing landed under this data root fails in its run: say so now."""
    from speechdata.io import layout

    for shard in shards:
        if not layout.is_valid_shard_id(shard):  # a hand-added partition key: never a path under the root
            print(f"{command}: warning: {shard!r} is not a valid shard id; its run will refuse it", file=sys.stderr)
        elif not data_root.exists(layout.landing_metadata(shard)):
            print(
                f"{command}: warning: shard {shard}: no {data_root.uri(layout.landing_metadata(shard))} "
                "(another data root than the deployment's, or not landed)",
                file=sys.stderr,
            )


def _bar(total: int | None, unit: str, quiet: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit.split()[-1], desc=unit, file=sys.stderr, disable=not progress_enabled(quiet))


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
