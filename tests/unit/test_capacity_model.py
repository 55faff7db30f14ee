"""The capacity model: pool rates add as harmonic sums, the slower pool limits, its slowest stage is named."""

import pytest

from benchmarks.capacity.capacity_model import MEASURED_CPU_STAGES, Stage, capacity, gpu_stages, pool_rate

STAGES = (
    Stage("decode", "cpu", 500.0, "test"),
    Stage("pack", "cpu", 500.0, "test"),
    Stage("encode", "gpu", 2000.0, "test"),
)


def test_a_pool_runs_its_stages_one_after_another_on_every_worker():
    assert pool_rate(STAGES, "cpu", 1) == pytest.approx(250.0)  # 1 / (1/500 + 1/500)
    assert pool_rate(STAGES, "cpu", 8) == pytest.approx(2000.0)
    assert pool_rate(STAGES, "gpu", 0) == 0.0


def test_the_slower_pool_sets_the_daily_hours_and_names_the_bottleneck():
    gpu_bound = capacity(STAGES, cpus=16, gpus=1)
    assert gpu_bound["bottleneck_pool"] == "gpu" and gpu_bound["bottleneck_stage"] == "encode"
    assert gpu_bound["audio_hours_per_day"] == pytest.approx(2000.0 * 24)
    cpu_bound = capacity(STAGES, cpus=4, gpus=1)
    assert cpu_bound["bottleneck_pool"] == "cpu" and cpu_bound["audio_hours_per_day"] == pytest.approx(1000.0 * 24)
    assert capacity(STAGES, cpus=4, gpus=0)["audio_hours_per_day"] == 0.0


def test_small_shards_are_dominated_by_per_step_startup():
    stages = MEASURED_CPU_STAGES + gpu_stages(mfu=0.15)
    small, large = (capacity(stages, 64, 8, shard_hours=h)["step_overhead_share"] for h in (1.0, 100.0))
    assert 0 < large < small < 1 and small > 0.5
