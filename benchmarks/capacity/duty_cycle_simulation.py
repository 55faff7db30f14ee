"""One GPU worker's timeline, task by task: how much of it is GPU compute, for two architectures.

The timeline is a discrete-event simulation over resources that each run one task at a time, in
the order tasks were submitted (FIFO): a task starts when its resource is free, its shard has
arrived (``release_s``) and the tasks it waits for have ended (``after``) or started
(``after_start``: how a bounded prefetch is expressed). Tasks are submitted in an order where every
dependency comes first, so one pass in submission order gives every task's start and end.

Two architectures, each built from the same per-shard and per-run costs:

* **baseline** (today): everything on one ``serial`` resource. Per run of ``k`` shards: run
  creation, the run worker's start (a fresh interpreter importing the code location), then per
  GPU stage a step: its start, its model load, and per shard input read, GPU compute, output
  write, one after another;
* **resident** (resident GPU workers): resources that work at once. ``orchestrator``: run
  creation, one run after another (the backfill daemon); ``run_worker_<i>``: up to
  ``concurrent_runs`` runs starting (interpreter, code location) and starting their steps at once;
  both run ahead of the GPU (they overlap earlier shards' compute);
  ``reader``: a prefetch thread that reads the next item's inputs while the current one is on the
  GPU (at most ``prefetch_depth`` items ahead); ``gpu``: each model loaded once at the worker's
  start, then compute only; ``writer``: outputs written after their compute, beside the next one.

Duty cycle = GPU compute / GPU wall time. In a backfill the GPU is reserved for the whole
backfill, so its wall time is the makespan (first release to last task end). In steady landing
shards arrive far apart and a GPU with nothing landed is free for other work, so its wall time is
the union of the intervals in which a task holds the GPU: under the baseline every task of a GPU
step (a step process or pod owns its GPU from its start to its end: step start, model load,
reads, compute, writes), under the resident architecture only model loads and compute (reads and
writes run on the worker's other threads; run creation and run start in Dagster's processes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class StageCosts:
    """One GPU stage's costs: per shard (compute, reads, writes) and per model load."""

    name: str
    compute_s: float
    read_s: float
    write_s: float
    model_load_s: float


@dataclass(frozen=True)
class RunCosts:
    """What every Dagster run pays before its first step, and every step before its first line."""

    run_creation_s: float
    run_start_s: float
    step_start_s: float


@dataclass(frozen=True)
class Task:
    kind: str  # run_creation, run_start, step_start, model_load, read, compute, write
    resource: str
    duration_s: float
    holds_gpu: bool
    shard: int | None = None
    release_s: float = 0.0
    after: tuple[int, ...] = ()
    after_start: tuple[int, ...] = ()


@dataclass
class Timeline:
    tasks: list[Task] = field(default_factory=list)
    starts: list[float] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)

    def add(self, task: Task) -> int:
        self.tasks.append(task)
        return len(self.tasks) - 1


def simulate(timeline: Timeline) -> Timeline:
    """Fill in every task's start and end (FIFO per resource, dependencies first)."""
    free_at: dict[str, float] = {}
    starts: list[float] = []
    ends: list[float] = []
    for index, task in enumerate(timeline.tasks):
        if any(d >= index for d in task.after + task.after_start):
            raise ValueError(f"task {index} ({task.kind}) waits for a later task")
        start = max(
            [free_at.get(task.resource, 0.0), task.release_s]
            + [ends[d] for d in task.after]
            + [starts[d] for d in task.after_start]
        )
        starts.append(start)
        ends.append(start + task.duration_s)
        free_at[task.resource] = ends[-1]
    timeline.starts, timeline.ends = starts, ends
    return timeline


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def figures(timeline: Timeline, mode: str) -> dict:
    """Duty cycle and the time split of a simulated timeline; ``mode`` is ``backfill`` or ``landing``."""
    tasks = timeline.tasks
    compute = sum(t.duration_s for t in tasks if t.kind == "compute")
    first_release = min((t.release_s for t in tasks), default=0.0)
    makespan = max(timeline.ends, default=0.0) - first_release
    held = union_length([(s, e) for t, s, e in zip(tasks, timeline.starts, timeline.ends, strict=True) if t.holds_gpu])
    wall = makespan if mode == "backfill" else held
    by_kind: dict[str, float] = {}
    for task in tasks:
        by_kind[task.kind] = by_kind.get(task.kind, 0.0) + task.duration_s
    latencies: dict[int, float] = {}
    for task, end in zip(tasks, timeline.ends, strict=True):
        if task.shard is not None:
            latencies[task.shard] = max(latencies.get(task.shard, 0.0), end - task.release_s)
    ordered = sorted(latencies.values())
    return {
        "duty_cycle": round(compute / wall, 4) if wall > 0 else 1.0,
        "gpu_compute_s": round(compute, 3),
        "gpu_wall_s": round(wall, 3),
        "makespan_s": round(makespan, 3),
        "task_seconds_by_kind": {kind: round(seconds, 3) for kind, seconds in by_kind.items()},
        "shard_latency_median_s": round(ordered[(len(ordered) - 1) // 2], 3) if ordered else None,
        "shard_latency_max_s": round(ordered[-1], 3) if ordered else None,
    }


def runs_of(arrivals_s: Sequence[float], shards_per_run: int) -> list[list[int]]:
    return [list(range(i, min(i + shards_per_run, len(arrivals_s)))) for i in range(0, len(arrivals_s), shards_per_run)]


def baseline_timeline(
    stages: Sequence[StageCosts], run: RunCosts, arrivals_s: Sequence[float], shards_per_run: int
) -> Timeline:
    """Today: per run, creation and start; per GPU step, its start and its own model load; per shard,
    read, compute and write; all on one serial timeline."""
    timeline = Timeline()
    for shards in runs_of(arrivals_s, shards_per_run):
        release = max(arrivals_s[s] for s in shards)  # a run is made for shards that have landed
        timeline.add(Task("run_creation", "serial", run.run_creation_s, False, shards[0], release))
        timeline.add(Task("run_start", "serial", run.run_start_s, False, shards[0], release))
        for stage in stages:
            timeline.add(Task("step_start", "serial", run.step_start_s, True, shards[0], release))
            timeline.add(Task("model_load", "serial", stage.model_load_s, True, shards[0], release))
            for shard in shards:
                for kind, seconds in (("read", stage.read_s), ("compute", stage.compute_s), ("write", stage.write_s)):
                    timeline.add(Task(kind, "serial", seconds, True, shard, arrivals_s[shard]))
    return simulate(timeline)


def resident_timeline(
    stages: Sequence[StageCosts],
    run: RunCosts,
    arrivals_s: Sequence[float],
    shards_per_run: int,
    prefetch_depth: int = 1,
    concurrent_runs: int = 4,
) -> Timeline:
    """Resident GPU workers: models loaded once at the worker's start; orchestration, reads and
    writes on their own resources, overlapping compute; reads at most ``prefetch_depth`` items ahead.
    Runs are created one after another (one backfill daemon); up to ``concurrent_runs`` run workers
    start and start their steps at once, each in its own process."""
    timeline = Timeline()
    start = min(arrivals_s, default=0.0)
    loads = [timeline.add(Task("model_load", "gpu", s.model_load_s, True, None, start)) for s in stages]
    computes: list[int] = []
    for number, shards in enumerate(runs_of(arrivals_s, shards_per_run)):
        release = max(arrivals_s[s] for s in shards)
        created = timeline.add(Task("run_creation", "orchestrator", run.run_creation_s, False, shards[0], release))
        worker = f"run_worker_{number % concurrent_runs}"
        timeline.add(Task("run_start", worker, run.run_start_s, False, shards[0], release, (created,)))
        step_started = {
            stage.name: timeline.add(Task("step_start", worker, run.step_start_s, False, shards[0], release))
            for stage in stages
        }
        for shard in shards:
            for stage in stages:
                ahead = (computes[-prefetch_depth],) if len(computes) >= prefetch_depth else ()
                read = timeline.add(
                    Task(
                        "read",
                        "reader",
                        stage.read_s,
                        False,
                        shard,
                        arrivals_s[shard],
                        (step_started[stage.name],),
                        ahead,
                    )
                )
                compute = timeline.add(
                    Task("compute", "gpu", stage.compute_s, True, shard, arrivals_s[shard], (read, *loads))
                )
                computes.append(compute)
                timeline.add(Task("write", "writer", stage.write_s, False, shard, arrivals_s[shard], (compute,)))
    return simulate(timeline)


ARCHITECTURES = {"baseline": baseline_timeline, "resident": resident_timeline}


def duty_cycle(
    architecture: str,
    mode: str,
    stages: Sequence[StageCosts],
    run: RunCosts,
    shards: int,
    shards_per_run: int,
    landing_interval_s: float = 60.0,
    **architecture_options,
) -> dict:
    """Simulate ``shards`` shards (a backfill: all at once; landing: one per ``landing_interval_s``)."""
    if mode == "backfill":
        arrivals = [0.0] * shards
    elif mode == "landing":
        arrivals = [i * landing_interval_s for i in range(shards)]
    else:
        raise ValueError(f"mode must be backfill or landing, got {mode!r}")
    timeline = ARCHITECTURES[architecture](stages, run, arrivals, shards_per_run, **architecture_options)
    return figures(timeline, mode)
