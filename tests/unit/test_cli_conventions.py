"""One set of command-line conventions for every ``speechdata`` command (docs/cli.md, "Conventions").

``--data-root URL`` everywhere (default ``$DATA_ROOT``, else ``./.data``), one error line naming a
missing root, help that reads as plain text, progress only on a terminal, and a dataset card whose
license is complete. These run the commands in-process (``speechdata.cli.run``); the console script
itself is covered by test_cli.py.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from speechdata.cli import build_parser, run
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from tests.conftest import encode, tone

REPO = Path(__file__).resolve().parents[2]


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every command and subcommand: (its words, its parser)."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


ALL_COMMANDS = list(_commands(build_parser()))
LEAF_COMMANDS = [
    (path, parser)
    for path, parser in ALL_COMMANDS
    if path and not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
]


def _ids(items):
    return [" ".join(path) or "speechdata" for path, _ in items]


@pytest.mark.parametrize(("path", "parser"), ALL_COMMANDS, ids=_ids(ALL_COMMANDS))
def test_every_help_reads_as_plain_text_without_rest_markup(path, parser, capsys):
    with pytest.raises(SystemExit) as exit_:
        run([*path, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: speechdata")
    for markup in ("``", ":func:", ":class:", ":mod:", ":data:", ":meth:"):
        assert markup not in text, f"{' '.join(path)} --help shows {markup!r}"


@pytest.mark.parametrize(("path", "parser"), LEAF_COMMANDS, ids=_ids(LEAF_COMMANDS))
def test_every_command_takes_data_root_as_an_option_defaulting_to_the_environment(path, parser):
    [option] = [a for a in parser._actions if "--data-root" in a.option_strings]
    assert not option.required and option.default is None
    assert option.metavar == "URL"
    assert "$DATA_ROOT" in option.help and "./.data" in option.help
    positionals = [a.dest for a in parser._actions if not a.option_strings and a.help is not argparse.SUPPRESS]
    assert "data_root" not in positionals


MISSING_ROOT_COMMANDS = {
    "catalog": ["catalog", "--named", "hours_per_shard"],
    "export nemo": ["export", "nemo", "--out", "{tmp}/out", "--quiet"],
    "export lhotse": ["export", "lhotse", "--out", "{tmp}/out", "--quiet"],
    "export moshi": ["export", "moshi", "--out", "{tmp}/out", "--quiet"],
    "mfa-corpus": ["mfa-corpus", "some-0001"],
    "land": ["land", "some-0001"],
    "import granary": ["import", "granary", "some-0001", "{tmp}/source.parquet"],
    "import segment-tars": ["import", "segment-tars", "{tmp}/source", "some-0001"],
    "import aligned-json": ["import", "aligned-json", "{tmp}/countries"],
    "import language-tars": ["import", "language-tars", "{tmp}/000001.tar", "--index", "{tmp}/index.parquet"],
    "shard status": ["shard", "status", "some-0001"],
    "shard run": ["shard", "run", "--all", "--url", "http://127.0.0.1:9"],
    "shard backfill": ["shard", "backfill", "--missing", "--url", "http://127.0.0.1:9"],
    "near-duplicates batch": ["near-duplicates", "batch", "--in-process"],
}


@pytest.mark.parametrize("name", MISSING_ROOT_COMMANDS)
def test_a_missing_data_root_fails_with_one_line_naming_it(name, tmp_path, capsys):
    missing = str(tmp_path / "does" / "not" / "exist")  # its parent is missing too: nobody creates it
    args = [arg.format(tmp=tmp_path) for arg in MISSING_ROOT_COMMANDS[name]]
    status = run([*args, "--data-root", missing])
    assert status != 0
    [line] = capsys.readouterr().err.strip().splitlines()
    assert missing in line and "does not exist" in line
    assert "no published sample" not in line
    assert not os.path.exists(missing)


def _granary_parquet(path: Path, rows: int = 2) -> str:
    table = pa.table(
        {
            "audio": [{"bytes": encode(tone(0.5, 16_000), 16_000), "path": f"{i}.wav"} for i in range(rows)],
            "text": [f"utterance {i}" for i in range(rows)],
        }
    )
    pq.write_table(table, path)
    return str(path)


def test_an_importer_creates_a_missing_root_whose_parent_exists(tmp_path, capsys):
    source = _granary_parquet(tmp_path / "train.parquet")
    root = tmp_path / "new-root"
    assert run(["import", "granary", "granary-0001", source, "--data-root", str(root), "--quiet"]) == 0
    assert DataRoot(str(root)).exists(layout.landing_success_marker("granary-0001"))
    assert "landed 2 rows" in capsys.readouterr().out


def test_data_root_comes_from_the_environment_when_the_option_is_absent(tmp_path, monkeypatch, capsys):
    source = _granary_parquet(tmp_path / "train.parquet")
    monkeypatch.setenv("DATA_ROOT", str(tmp_path / "from-env"))
    assert run(["import", "granary", "granary-0002", source, "--quiet"]) == 0
    assert DataRoot(str(tmp_path / "from-env")).exists(layout.landing_success_marker("granary-0002"))


def test_the_positional_data_root_still_works_for_one_release_with_a_deprecation_message(tmp_path, capsys):
    source = _granary_parquet(tmp_path / "train.parquet")
    root = tmp_path / "data"
    root.mkdir()
    assert run(["import", "granary", str(root), "granary-0003", source, "--quiet"]) == 0
    assert DataRoot(str(root)).exists(layout.landing_success_marker("granary-0003"))
    err = capsys.readouterr().err
    assert "deprecated" in err and f"--data-root {root}" in err

    missing = str(tmp_path / "gone" / "root")
    assert run(["mfa-corpus", missing, "some-0001", str(tmp_path / "corpus")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert "deprecated" in err[0] and f"--data-root {missing}" in err[0]
    assert missing in err[1] and "does not exist" in err[1]


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal, as an operator's is."""

    def isatty(self) -> bool:
        return True


def _refresh_catalog(root: Path, monkeypatch, *extra: str, terminal: bool) -> str:
    stderr = _Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    assert run(["catalog", "--refresh", "--data-root", str(root), *extra]) == 0
    return stderr.getvalue()


def test_long_commands_show_progress_on_a_terminal_only_and_not_with_quiet(tmp_path, monkeypatch):
    root = tmp_path / "data"
    root.mkdir()
    assert "catalog --refresh" in _refresh_catalog(root, monkeypatch, terminal=True)
    assert "catalog --refresh" not in _refresh_catalog(root, monkeypatch, "--quiet", terminal=True)
    assert "catalog --refresh" not in _refresh_catalog(root, monkeypatch, terminal=False)


def test_an_import_shows_progress_on_a_terminal_only(tmp_path, monkeypatch, capsys):
    source = _granary_parquet(tmp_path / "train.parquet")
    root = tmp_path / "data"
    for shard_id, quiet, terminal, shown in (
        ("granary-0011", [], True, True),
        ("granary-0012", ["--quiet"], True, False),
        ("granary-0013", [], False, False),
    ):
        stderr = _Terminal() if terminal else io.StringIO()
        monkeypatch.setattr("sys.stderr", stderr)
        assert run(["import", "granary", shard_id, source, "--data-root", str(root), *quiet]) == 0
        assert ("import granary" in stderr.getvalue()) is shown, (shard_id, stderr.getvalue())


def test_land_takes_a_bare_shard_id_under_the_data_root(tmp_path, capsys):
    root = DataRoot(str(tmp_path / "data"))
    root.write_bytes(f"{layout.landing_audio_dir('bare-0001')}/a.wav", encode(tone(1.0, 16_000), 16_000))
    rows = [{"utt_id": "u1", "audio_path": "a.wav", "language": "en"}]
    root.write_parquet(layout.landing_metadata("bare-0001"), pa.Table.from_pylist(rows))
    assert run(["land", "bare-0001", "--data-root", root.root]) == 0
    assert root.exists(layout.landing_success_marker("bare-0001"))
    assert "1 of 1 utterances usable" in capsys.readouterr().out


@pytest.mark.parametrize(("path", "parser"), LEAF_COMMANDS, ids=_ids(LEAF_COMMANDS))
def test_every_long_command_has_quiet(path, parser):
    if path in (("land",), ("mfa-corpus",)):
        return  # one shard's validation or corpus: seconds, and their output is the result itself
    assert any("--quiet" in a.option_strings for a in parser._actions), " ".join(path)


def _front_matter(card: str) -> dict:
    _, yaml_text, _ = card.split("---\n", 2)
    return yaml.safe_load(yaml_text)


def test_the_default_dataset_card_license_is_complete():
    from speechdata.hf.card import dataset_card

    found = {"de": {"train_1": {"rows": 3, "bytes": 10, "files": 1}}}
    meta = _front_matter(dataset_card("ds", found, {"de": "de"}))
    assert meta["license"] == "other"
    # The Hub requires both with "other": a lowercase dashed name, and a URL or a file in the repo.
    assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*", meta["license_name"])
    assert meta["license_link"].startswith(("https://", "LICENSE"))

    named = _front_matter(
        dataset_card(
            "ds", found, {"de": "de"}, license="other", license_name="corpus-1.0", license_link="https://x.org/l"
        )
    )
    assert (named["license_name"], named["license_link"]) == ("corpus-1.0", "https://x.org/l")
    open_license = _front_matter(dataset_card("ds", found, {"de": "de"}, license="cc-by-4.0"))
    assert open_license["license"] == "cc-by-4.0" and "license_name" not in open_license


def test_the_dataset_settings_resource_configures_the_card_license():
    from resources.hub import HfDatasetSettings

    settings = HfDatasetSettings(license="other", license_name="corpus-1.0", license_link="https://x.org/l")
    assert (settings.license, settings.license_name, settings.license_link) == (
        "other",
        "corpus-1.0",
        "https://x.org/l",
    )
    assert HfDatasetSettings().license_name is None  # the card's placeholder then


def _documented_commands(text: str) -> set[str]:
    return set(re.findall(r"speechdata ((?:import |export |shard |near-duplicates )?[a-z][a-z-]*)", text))


def test_readme_and_docs_cli_list_every_command():
    leaves = {" ".join(path) for path, _ in LEAF_COMMANDS}
    readme_table = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `speechdata")]
    listed = set()
    for line in readme_table:
        listed |= _documented_commands(line.replace("\\|", "|"))
        if "export nemo|lhotse|moshi" in line.replace("\\|", "|"):
            listed |= {"export nemo", "export lhotse", "export moshi"}
    assert leaves <= listed, sorted(leaves - listed)
    assert not any("DATA_ROOT SHARD_ID" in line for line in readme_table)
    docs = (REPO / "docs" / "cli.md").read_text()
    for leaf in leaves:
        assert f"usage: speechdata {leaf}" in docs, leaf
    for option in ("--data-root URL", "--quiet"):
        assert option in docs


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _session_processes(session_id: int) -> dict[int, str]:
    """Live processes of a session, from /proc: pid -> command line."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
            command = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, _parent, _group, session = stat[stat.rindex(")") + 2 :].split()[:4]
        if state != "Z" and int(session) == session_id:
            found[int(name)] = command
    return found


CODE_SERVER_HEARTBEAT_TIMEOUT_S = 45
"""``dagster dev`` starts its code servers with ``--heartbeat-timeout 45``: one still importing the
code location when the stop comes (5-7 s on a slow 2-core VM) is not stopped by its parent, and
exits by itself once its parent's heartbeats stop."""


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_make_dev_stops_dagster_and_its_children_on_sigterm(tmp_path):
    # -o setup: the environment is already installed; the target must not reinstall it.
    make = subprocess.Popen(
        ["make", "--no-print-directory", "-o", "setup", "dev", f"PORT={_free_port()}", f"DAGSTER_HOME={tmp_path}"],
        cwd=REPO,
        start_new_session=True,  # its own session: every descendant is found by session id
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # 35 s to start, then the stop: at once for a started webserver and daemon, and within the
        # heartbeat timeout for a code server that was still starting.
        deadline = time.monotonic() + 35
        while time.monotonic() < deadline:
            running = " ".join(_session_processes(make.pid).values())
            if "dagster_webserver" in running and "dagster._daemon" in running:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"dagster dev did not start its webserver and daemon in 35 s: {running}")
        os.kill(make.pid, signal.SIGTERM)
        deadline = time.monotonic() + CODE_SERVER_HEARTBEAT_TIMEOUT_S + 15
        while _session_processes(make.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _session_processes(make.pid) == {}, "still running after SIGTERM"
        assert make.wait(timeout=1) != 0  # make reports the signal
    finally:
        for pid in _session_processes(make.pid):
            os.kill(pid, signal.SIGKILL)
        if make.poll() is None:
            make.kill()


def test_the_code_locations_shard_command_comes_from_the_entry_point_group_not_the_core():
    from speechdata import cli

    assert "dagster_project.operations_cli" in cli.entry_point_command_modules()
    assert "shard" in {path[0] for path, _ in ALL_COMMANDS if path}
    # The core names no module of the code location, in code or in a string.
    assert "dagster_project" not in "".join(cli.COMMANDS)
    assert "dagster_project" not in (REPO / "speechdata" / "cli.py").read_text(encoding="utf-8")
