"""One figure for the shards a backfill run carries, quoted wherever people read it.

The figure is ``speechdata.io.env.DEFAULT_BACKFILL_SHARDS_PER_RUN``; the assets' backfill policy and
``speechdata shard backfill --help`` read it, and the docs that tell an operator what a backfill does
must quote the same number (the history in docs/performance.md keeps the figures of its time).
"""

import re
from pathlib import Path

import pytest

from speechdata.io.env import BACKFILL_SHARDS_PER_RUN_ENV, DEFAULT_BACKFILL_SHARDS_PER_RUN, backfill_shards_per_run

REPOSITORY = Path(__file__).resolve().parents[2]
QUOTING_DOCS = ("README.md", "docs/cli.md", "docs/operating-the-ui.md", "docs/deploying.md")
FIGURE_PHRASES = (
    re.compile(r"(\d+) shards per run"),
    re.compile(r"maximum of (\d+) partitions per run"),
    re.compile(r"ceil\(n / (\d+)\)"),
    re.compile(r"`SPEECHDATA_BACKFILL_SHARDS_PER_RUN` \| (\d+) \|"),
)
SPELLED_FIGURE = re.compile(r"\b(?:one|two|three|four|eight|sixteen|thirty-two|sixty-four) shards per run\b", re.I)


@pytest.mark.parametrize("doc", QUOTING_DOCS)
def test_doc_quotes_the_one_shards_per_run_figure(doc):
    text = (REPOSITORY / doc).read_text()
    quoted = [(pattern.pattern, int(match)) for pattern in FIGURE_PHRASES for match in pattern.findall(text)]
    assert quoted, f"{doc} never states the shards per backfill run"
    wrong = [(phrase, figure) for phrase, figure in quoted if figure != DEFAULT_BACKFILL_SHARDS_PER_RUN]
    assert not wrong, f"{doc} quotes {wrong}; the figure is {DEFAULT_BACKFILL_SHARDS_PER_RUN}"
    assert not SPELLED_FIGURE.findall(text), f"{doc}: write the figure as {DEFAULT_BACKFILL_SHARDS_PER_RUN}"


def test_the_pattern_catches_a_stale_figure():
    stale = "the daemon splits it (up to 4 shards per run) into `ceil(n / 4)` runs"
    assert [int(m) for pattern in FIGURE_PHRASES for m in pattern.findall(stale)] == [4, 4]


def test_backfill_help_quotes_the_figure_the_policy_uses(capsys, monkeypatch):
    from speechdata.cli import build_parser

    monkeypatch.delenv(BACKFILL_SHARDS_PER_RUN_ENV, raising=False)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["shard", "backfill", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert f"up to {DEFAULT_BACKFILL_SHARDS_PER_RUN} shards per run" in help_text
    assert BACKFILL_SHARDS_PER_RUN_ENV in help_text


def test_the_environment_overrides_the_figure(monkeypatch):
    monkeypatch.setenv(BACKFILL_SHARDS_PER_RUN_ENV, "8")
    assert backfill_shards_per_run() == 8
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv(BACKFILL_SHARDS_PER_RUN_ENV, bad)
        with pytest.raises(ValueError, match=BACKFILL_SHARDS_PER_RUN_ENV):
            backfill_shards_per_run()
