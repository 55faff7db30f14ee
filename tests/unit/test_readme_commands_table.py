"""README.md's commands tables list every ``speechdata`` command and every make target, and nothing
else: the CLI's argparse subparsers and the Makefile's ``.PHONY`` line are the lists compared."""

from __future__ import annotations

import argparse
import itertools
import re
from pathlib import Path

from speechdata.cli import build_parser

REPO = Path(__file__).resolve().parents[2]
COMMAND_WORD = re.compile(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*")


def cli_commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> set[str]:
    """Every leaf command, as its words after ``speechdata`` (``import granary``, ``shard status``)."""
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subparsers:
        return {" ".join(path)}
    return set().union(*(cli_commands(sub, (*path, name)) for name, sub in subparsers[0].choices.items()))


def makefile_phony_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {target for line in re.findall(r"^\.PHONY:(.*)$", text, re.MULTILINE) for target in line.split()}


def commands_section_rows() -> list[str]:
    """The first cells of the tables under README's ``## Commands``, backticks off, ``\\|`` as ``|``."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [row.replace("\\|", "\0").split("|")[1].strip().strip("`").replace("\0", "|") for row in rows]


def listed_commands(rows: list[str]) -> set[str]:
    """``speechdata export nemo|lhotse|moshi --out DIR`` lists three commands: the leading lowercase
    words, each alternation expanded; the first placeholder or option ends the command."""
    listed = set()
    for row in rows:
        words = row.split()
        if words[0] != "speechdata":
            continue
        command = list(itertools.takewhile(COMMAND_WORD.fullmatch, words[1:]))
        listed |= {" ".join(combo) for combo in itertools.product(*(word.split("|") for word in command))}
    return listed


def listed_make_targets(rows: list[str]) -> set[str]:
    return {row.split()[1] for row in rows if row.split()[0] == "make"}


def test_every_speechdata_command_is_in_the_readme_commands_table_and_no_other():
    commands = cli_commands(build_parser())
    assert {"import granary", "export moshi", "shard status", "shard backfill"} <= commands  # the walk works
    assert listed_commands(commands_section_rows()) == commands


def test_every_make_target_is_in_the_readme_commands_table_and_no_other():
    targets = makefile_phony_targets()
    assert {"demo", "test", "check"} <= targets
    assert listed_make_targets(commands_section_rows()) == targets
