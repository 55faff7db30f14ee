"""The GPU worker timeline: compute alone is a duty cycle of 1; every fixed cost lowers it where it is paid."""

import pytest

from benchmarks.capacity.duty_cycle_simulation import (
    RunCosts,
    StageCosts,
    Task,
    Timeline,
    duty_cycle,
    simulate,
    union_length,
)

COMPUTE_ONLY = [StageCosts("ctc", 2.5, 0.0, 0.0, 0.0), StageCosts("qwen", 1.5, 0.0, 0.0, 0.0)]
NO_RUN_COSTS = RunCosts(0.0, 0.0, 0.0)
MODES = [("backfill", {"shards": 40, "shards_per_run": 4}), ("landing", {"shards": 20, "shards_per_run": 1})]


def with_costs(read=0.0, write=0.0, load=0.0):
    return [StageCosts(s.name, s.compute_s, read, write, load) for s in COMPUTE_ONLY]


@pytest.mark.parametrize("architecture", ["baseline", "resident"])
@pytest.mark.parametrize("mode, settings", MODES)
def test_without_fixed_costs_the_gpu_only_computes(architecture, mode, settings):
    figures = duty_cycle(architecture, mode, COMPUTE_ONLY, NO_RUN_COSTS, **settings)
    assert figures["duty_cycle"] == pytest.approx(1.0)
    assert figures["gpu_compute_s"] == pytest.approx(settings["shards"] * 4.0)


@pytest.mark.parametrize("mode, settings", MODES)
@pytest.mark.parametrize(
    "stages, run",
    [
        (with_costs(load=3.0), NO_RUN_COSTS),
        (with_costs(read=0.5), NO_RUN_COSTS),
        (with_costs(write=0.5), NO_RUN_COSTS),
        (COMPUTE_ONLY, RunCosts(0.0, 0.0, 0.7)),
    ],
    ids=["model_load", "read", "write", "step_start"],
)
def test_each_fixed_cost_lowers_the_baseline_and_more_of_it_lowers_it_further(mode, settings, stages, run):
    once = duty_cycle("baseline", mode, stages, run, **settings)["duty_cycle"]
    doubled_stages = [StageCosts(s.name, s.compute_s, 2 * s.read_s, 2 * s.write_s, 2 * s.model_load_s) for s in stages]
    doubled_run = RunCosts(2 * run.run_creation_s, 2 * run.run_start_s, 2 * run.step_start_s)
    twice = duty_cycle("baseline", mode, doubled_stages, doubled_run, **settings)["duty_cycle"]
    assert 0 < twice < once < 1.0


@pytest.mark.parametrize("cost", ["run_creation_s", "run_start_s"])
def test_run_creation_and_start_lower_a_baseline_backfill(cost):
    run = RunCosts(**{**vars(NO_RUN_COSTS), cost: 2.0})
    assert duty_cycle("baseline", "backfill", COMPUTE_ONLY, run, shards=40, shards_per_run=4)["duty_cycle"] < 1.0


def test_resident_worker_pays_a_model_load_once_not_per_run():
    stages = with_costs(load=3.0)
    resident = duty_cycle("resident", "backfill", stages, NO_RUN_COSTS, shards=40, shards_per_run=4)
    baseline = duty_cycle("baseline", "backfill", stages, NO_RUN_COSTS, shards=40, shards_per_run=4)
    assert resident["task_seconds_by_kind"]["model_load"] == pytest.approx(6.0)
    assert baseline["task_seconds_by_kind"]["model_load"] == pytest.approx(6.0 * 10)
    assert baseline["duty_cycle"] < resident["duty_cycle"] < 1.0


def test_resident_hides_reads_and_writes_shorter_than_compute_but_not_longer_ones():
    settings = {"shards": 40, "shards_per_run": 4}
    hidden = duty_cycle("resident", "backfill", with_costs(read=1.0, write=1.0), NO_RUN_COSTS, **settings)
    assert hidden["duty_cycle"] > 0.95
    # Reads slower than the GPU: the GPU waits for the prefetch thread.
    starved = duty_cycle("resident", "backfill", with_costs(read=4.0), NO_RUN_COSTS, **settings)
    assert starved["duty_cycle"] < 0.7


def test_orchestration_ahead_of_the_gpu_is_hidden_when_shorter_than_a_runs_compute():
    settings = {"shards": 40, "shards_per_run": 4}  # a run holds 16 s of compute
    hidden = duty_cycle("resident", "backfill", COMPUTE_ONLY, RunCosts(2.0, 6.0, 0.5), **settings)
    exposed = duty_cycle("resident", "backfill", COMPUTE_ONLY, RunCosts(20.0, 6.0, 0.5), **settings)
    assert hidden["duty_cycle"] > 0.9 > exposed["duty_cycle"]


def test_landing_charges_only_while_the_gpu_is_held():
    # One shard every 60 s with 4 s of compute: a GPU idle between shards is not overhead.
    figures = duty_cycle("baseline", "landing", with_costs(load=1.0), NO_RUN_COSTS, shards=5, shards_per_run=1)
    assert figures["makespan_s"] > 4 * 60
    assert figures["gpu_wall_s"] == pytest.approx(5 * (4.0 + 2 * 1.0))
    assert figures["duty_cycle"] == pytest.approx(4.0 / 6.0, abs=1e-3)


def test_a_resource_runs_one_task_at_a_time_in_submission_order():
    timeline = Timeline()
    first = timeline.add(Task("read", "reader", 2.0, False))
    timeline.add(Task("read", "reader", 1.0, False))
    timeline.add(Task("compute", "gpu", 1.0, True, after=(first,)))
    simulate(timeline)
    assert timeline.starts == [0.0, 2.0, 2.0]
    assert timeline.ends == [2.0, 3.0, 3.0]


def test_a_task_cannot_wait_for_a_later_one():
    timeline = Timeline()
    timeline.add(Task("compute", "gpu", 1.0, True, after=(1,)))
    timeline.add(Task("read", "reader", 1.0, False))
    with pytest.raises(ValueError, match="waits for a later task"):
        simulate(timeline)


def test_overlapping_intervals_count_once():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == pytest.approx(4.0)
    assert union_length([]) == 0.0


def test_run_workers_starting_at_once_hide_a_run_start_longer_than_a_runs_compute():
    settings = {"shards": 100, "shards_per_run": 4}  # a run holds 16 s of compute; its start takes 30 s
    slow_start = RunCosts(0.0, 30.0, 0.0)
    one_at_a_time = duty_cycle("resident", "backfill", COMPUTE_ONLY, slow_start, **settings, concurrent_runs=1)
    four_at_once = duty_cycle("resident", "backfill", COMPUTE_ONLY, slow_start, **settings, concurrent_runs=4)
    assert four_at_once["duty_cycle"] > 0.9 > 0.6 > one_at_a_time["duty_cycle"]
