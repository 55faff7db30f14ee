"""``speechdata shard run|backfill`` before anything is launched: which assets and shards a command
line means, and the one-line errors for what does not exist. Launching itself, against a real
``dagster dev``, is in tests/e2e/test_backfills_from_the_ui.py."""

import socket

import pytest

from dagster_project.webserver_launch import AssetNode, SelectionError, choose_shards, select_assets
from speechdata.cli import run


def node(name: str, group: str, by_shard: bool = True) -> AssetNode:
    return AssetNode(name, group, by_shard, "speech_data_platform", "__repository__")


NODES = {
    n.name: n
    for n in (
        node("raw_shards", "ingest"),
        node("normalized_audio", "ingest"),
        node("frame_grids", "alignment"),
        node("hf_dataset", "publishing", by_shard=False),
        node("manifest_catalog", "catalog", by_shard=False),
    )
}
REGISTERED = ["demo-0001", "demo-0002", "lid-1", "lid-2"]


def test_no_selection_means_every_shard_asset_and_groups_add_their_shard_assets():
    assert select_assets(NODES) == ["frame_grids", "normalized_audio", "raw_shards"]
    assert select_assets(NODES, groups=["ingest"]) == ["normalized_audio", "raw_shards"]
    assert select_assets(NODES, ["frame_grids"], ["ingest"]) == ["frame_grids", "normalized_audio", "raw_shards"]


@pytest.mark.parametrize(
    ("names", "groups", "message"),
    [
        (["raw_shard"], [], "no asset named raw_shard (the shard assets: frame_grids, normalized_audio, raw_shards)"),
        (["hf_dataset"], [], "hf_dataset not partitioned by shard"),
        ([], ["ingestion"], "no asset group named ingestion"),
        ([], ["catalog"], "no shard asset in the groups catalog"),
    ],
)
def test_an_asset_or_group_that_is_not_there_or_not_by_shard_is_named(names, groups, message):
    with pytest.raises(SelectionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        select_assets(NODES, names, groups)


LANDING_FLOW = {
    n.name: n
    for n in (
        AssetNode("raw_shards", "ingest", True, "loc", "repo", (), ("per_shard_job",)),
        AssetNode("normalized_audio", "ingest", True, "loc", "repo", ("raw_shards",), ("per_shard_job",)),
        AssetNode("near_duplicates", "quality", True, "loc", "repo", ("normalized_audio",), ("per_shard_job",)),
        AssetNode("quality_decisions", "quality", True, "loc", "repo", ("near_duplicates",), ("per_shard_job",)),
        AssetNode("frame_grids", "alignment", True, "loc", "repo", ("normalized_audio",), ("per_shard_job",)),
        AssetNode("translations", "translation", True, "loc", "repo", ("quality_decisions",), ()),
        AssetNode("hf_dataset", "publishing", False, "loc", "repo", ("quality_decisions",), ("hf_dataset_job",)),
    )
}


def test_before_and_after_an_asset_split_the_landing_flow_around_it():
    assert select_assets(LANDING_FLOW, before="near_duplicates") == ["normalized_audio", "raw_shards"]
    # Everything else per_shard_job runs, the one asset left out; not translations (not in the job).
    assert select_assets(LANDING_FLOW, after="near_duplicates") == ["frame_grids", "quality_decisions"]
    # With a selection, they cut that instead.
    assert select_assets(LANDING_FLOW, groups=["quality", "translation"], after="near_duplicates") == [
        "quality_decisions",
        "translations",
    ]


@pytest.mark.parametrize(
    ("before", "after", "message"),
    [
        ("near_duplicate", None, "--before near_duplicate: no shard asset of that name"),
        (None, "hf_dataset", "--after hf_dataset: hf_dataset is not partitioned by shard"),
        ("raw_shards", None, "--before raw_shards: no selected shard asset is upstream of raw_shards"),
        ("raw_shards", "raw_shards", "--before and --after: name one of them"),
    ],
)
def test_a_bad_split_is_one_error_naming_it(before, after, message):
    with pytest.raises(SelectionError, match=message):
        select_assets(LANDING_FLOW, before=before, after=after)


def test_before_and_after_are_one_or_the_other_on_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run(["shard", "run", "--all", "--before", "a", "--after", "b", "--data-root", str(tmp_path)])
    assert exit_.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_shards_named_every_matching_and_missing():
    assert choose_shards(REGISTERED, named=["lid-2", "demo-0001", "lid-2"]) == ["lid-2", "demo-0001"]
    assert choose_shards(REGISTERED, every=True) == REGISTERED
    assert choose_shards(REGISTERED, matching="lid-*") == ["lid-1", "lid-2"]
    done = {"raw_shards": set(REGISTERED), "frame_grids": {"demo-0001", "lid-1"}}
    assert choose_shards(REGISTERED, materialized=done) == ["demo-0002", "lid-2"]


def test_an_unregistered_shard_an_empty_glob_and_nothing_missing_are_errors():
    with pytest.raises(SelectionError, match="shard nope-1 not registered"):
        choose_shards(REGISTERED, named=["demo-0001", "nope-1"])
    with pytest.raises(SelectionError, match="no registered shard matching 'x-\\*' \\(4 registered\\)"):
        choose_shards(REGISTERED, matching="x-*")
    with pytest.raises(SelectionError, match="no registered shard missing"):
        choose_shards(REGISTERED, materialized={"raw_shards": set(REGISTERED)})


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("command", ["run", "backfill"])
def test_an_unreachable_webserver_is_one_line_naming_its_url(command, tmp_path, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    status = run(["shard", command, "--all", "--url", url, "--data-root", str(tmp_path)])
    assert status == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"speechdata shard {command}: error: no Dagster webserver at {url}")


@pytest.mark.parametrize(
    "args",
    [["--select", "raw_shards"], ["--all", "--missing"], ["--shards", ","]],
    ids=["no shards", "two shard choices", "empty list"],
)
def test_a_command_line_without_one_shard_choice_is_bad_usage(args, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        run(["shard", "backfill", *args, "--data-root", str(tmp_path)])
    assert exit_.value.code == 2


def test_every_query_is_valid_against_the_installed_dagster_graphql_schema():
    """The fields asked for (an asset's dependencyKeys and jobNames among them) are the webserver's."""
    from dagster_graphql.schema import create_schema
    from graphql import parse, validate

    from dagster_project import webserver_launch

    schema = create_schema().graphql_schema
    queries = {
        name: value
        for name, value in vars(webserver_launch).items()
        if name.isupper() and isinstance(value, str) and value.split()[:1] in (["query"], ["mutation"])
    }
    assert "ASSET_NODES" in queries and "LAUNCH_BACKFILL" in queries and len(queries) == 7
    for name, query in queries.items():
        assert validate(schema, parse(query)) == [], name
