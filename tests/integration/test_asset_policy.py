"""Every asset is declared through the one asset policy, and the groups are found and ordered by it."""

import types

import dagster as dg
import pytest

import assets
from assets.asset_policy import OWNERS, group_asset, shard_asset
from assets.gpu_pool import GPU_POOL
from assets.partitions import PER_SHARD_TAGS, country_partitions, shard_partitions
from assets.shard_runs import SHARD_BACKFILL_POLICY, SHARDS_PER_RUN


def declared_in(module_name: str, decorator, compute):
    compute.__module__ = module_name
    return decorator(compute)


def test_a_shard_asset_gets_the_group_of_its_module_and_the_shard_policy():
    def my_product(context):
        """A new group's shard product."""

    asset = declared_in(
        "assets.my_group",
        shard_asset(kinds={"parquet"}, code_version="my_product-v1", checks={"all_rows_kept": "rows in == rows out"}),
        my_product,
    )
    [spec] = asset.specs
    assert (spec.group_name, list(spec.owners), spec.partitions_def) == ("my_group", OWNERS, shard_partitions)
    assert PER_SHARD_TAGS.items() <= dict(spec.tags).items() and spec.kinds == {"parquet"}
    assert spec.code_version == "my_product-v1"
    assert asset.backfill_policy.max_partitions_per_run == SHARDS_PER_RUN
    [check] = asset.check_specs
    assert (check.name, check.blocking, check.partitions_def) == ("all_rows_kept", True, shard_partitions)
    assert asset.op.pool is None and "dagster-k8s/config" not in asset.op.tags


def test_a_gpu_shard_asset_waiting_for_later_inputs_is_in_the_gpu_pool_and_not_the_per_shard_job():
    def my_scores(context):
        """Scores of inputs that land after the shard."""

    asset = declared_in(
        "assets.my_group",
        shard_asset(kinds={"pytorch"}, code_version="my_scores-v1", gpu=True, in_per_shard_job=False),
        my_scores,
    )
    [spec] = asset.specs
    assert not PER_SHARD_TAGS.items() <= dict(spec.tags).items()
    assert asset.op.pool == GPU_POOL and "dagster-k8s/config" in asset.op.tags
    assert not asset.check_specs


def test_a_group_asset_keeps_its_own_partitions_and_its_checks_are_partitioned_like_it():
    def my_country_product(context):
        """A per-country product."""

    asset = declared_in(
        "assets.my_group",
        group_asset(
            kinds={"duckdb"},
            code_version="my_country_product-v1",
            partitions_def=country_partitions,
            checks={"no_leaks": "nothing leaks"},
        ),
        my_country_product,
    )
    [spec] = asset.specs
    assert (spec.group_name, spec.partitions_def, list(spec.owners)) == ("my_group", country_partitions, OWNERS)
    assert not dict(spec.tags).items() & PER_SHARD_TAGS.items()
    [check] = asset.check_specs
    # Evaluated per country, so the UI never charts two countries' check figures as one series.
    assert check.partitions_def == country_partitions and check.blocking


def test_every_asset_of_the_code_location_carries_the_policy():
    for module in assets.GROUP_MODULES:
        for asset in module.defs.assets:
            [spec] = asset.specs
            assert spec.group_name == module.__name__.removeprefix("assets."), spec.key
            assert list(spec.owners) == OWNERS, spec.key
            if spec.partitions_def == shard_partitions:
                assert asset.backfill_policy.max_partitions_per_run == SHARDS_PER_RUN, spec.key
                assert all(check.partitions_def == shard_partitions for check in asset.check_specs), spec.key


def test_a_shard_backfill_selects_assets_of_one_backfill_policy_and_only_non_shard_assets_differ():
    """What the UI's backfill dialog reads per asset (its GraphQL ``backfillPolicy``): one policy for
    every asset a shard backfill can select; the assets of another policy (none) are exactly those a
    whole-graph selection adds, partitioned by country or language or not at all."""
    from dagster_project.definitions import defs
    from tests import spec_snapshot

    graph = defs.resolve_asset_graph()
    nodes = {key.to_user_string(): graph.get(key) for key in graph.materializable_asset_keys}
    by_shard = {name for name, node in nodes.items() if node.partitions_def == shard_partitions}
    assert by_shard == set(spec_snapshot.job_asset_keys("per_shard_job")) | set(
        spec_snapshot.job_asset_keys("translation_job")
    )
    assert {nodes[name].backfill_policy for name in by_shard} == {SHARD_BACKFILL_POLICY}
    other_policies = {name for name, node in nodes.items() if node.backfill_policy != SHARD_BACKFILL_POLICY}
    assert other_policies == set(nodes) - by_shard
    assert all(nodes[name].backfill_policy is None for name in other_policies)


def test_a_group_asset_partitioned_by_shard_is_refused_naming_shard_asset():
    with pytest.raises(ValueError, match="shard_asset"):
        group_asset(kinds={"parquet"}, code_version="v1", partitions_def=shard_partitions)


def group(name: str, **attributes):
    return types.SimpleNamespace(__name__=name, defs=dg.Definitions(), **attributes)


def test_groups_are_listed_by_their_ui_position_and_helpers_are_not_groups():
    helper = types.SimpleNamespace(__name__="assets.reporting")
    found = assets.groups_in_ui_order([group("assets.b", UI_POSITION=2), helper, group("assets.a", UI_POSITION=1)])
    assert [module.__name__ for module in found] == ["assets.a", "assets.b"]
    assert [module.__name__ for module in assets.GROUP_MODULES][:2] == ["assets.ingest", "assets.alignment"]


def test_a_group_without_a_ui_position_or_sharing_one_fails_the_load_naming_it():
    with pytest.raises(ValueError, match=r"\['assets\.unplaced'\].*UI_POSITION"):
        assets.groups_in_ui_order([group("assets.unplaced"), group("assets.a", UI_POSITION=1)])
    with pytest.raises(ValueError, match=r"share a UI_POSITION: \{1: \['assets\.a', 'assets\.b'\]\}"):
        assets.groups_in_ui_order([group("assets.a", UI_POSITION=1), group("assets.b", UI_POSITION=1)])
