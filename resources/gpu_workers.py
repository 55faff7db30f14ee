"""The GPU worker pool: where the GPU assets run their shards, in the step's process or on Ray.

``local`` (the default: tests, ``make dev``): the step's own process runs each shard, with the
model cached per process. ``ray`` (``SPEECHDATA_GPU_ENGINE=ray``): the step hands each shard to a
pool of named, detached Ray actors (:class:`resources.gpu_worker.ShardWorker`) that outlive the
Dagster runs, so a model loaded for one run serves every later run on that worker. A shard whose
actor dies is submitted again to a live (or restarted) actor; the step records each shard once.
docs/gpu-workers.md has the settings and the exactly-once argument.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import dagster as dg
from pydantic import Field

from resources.gpu_worker import MAX_RESIDENT_MODELS, Progress, ShardJob, ShardOutcome, ShardWorker
from resources.settings import ResourceSettings
from speechdata.io.shard_lock import held_fence

ENGINE_ENV = "SPEECHDATA_GPU_ENGINE"
RAY_ADDRESS_ENV = "SPEECHDATA_RAY_ADDRESS"
WORKERS_PER_GPU_ENV = "SPEECHDATA_GPU_WORKERS_PER_GPU"
GPUS_PER_WORKER_ENV = "SPEECHDATA_GPUS_PER_WORKER"
MAX_RESIDENT_MODELS_ENV = "SPEECHDATA_GPU_MAX_RESIDENT_MODELS"

_LOCAL_WORKER = ShardWorker("local")
"""The ``local`` engine's worker: one per process, so its models live as long as the process."""


class WorkerPoolUnavailable(RuntimeError):
    """The Ray cluster has no worker for the pool, or every attempt at a shard lost its worker."""


class GpuWorkersResource(dg.ConfigurableResource):
    """Where GPU shards run: ``local`` (the step's process) or ``ray`` (resident actors on a Ray cluster)."""

    engine: Literal["local", "ray"] = Field("local", description="local: the step's process. ray: the Ray pool.")
    ray_address: str = Field("auto", description="ray.init address: auto, ray://host:10001 or host:6379.")
    namespace: str = Field("speechdata", description="Ray namespace of the pool's named actors.")
    pool_name: str = Field("gpu-worker", description="Actors are named <pool_name>-<i>.")
    accelerator: str = Field("GPU", description="The Ray resource a worker reserves (GPU, or a custom one).")
    workers_per_gpu: int = Field(1, ge=1, description="Workers sharing one GPU (each reserves 1/n of it).")
    gpus_per_worker: float = Field(1.0, gt=0, description="GPUs one worker reserves (a model that needs more).")
    max_workers: int | None = Field(None, ge=1, description="Cap on the pool size; default: fill the cluster.")
    max_restarts: int = Field(3, ge=0, description="Times Ray restarts a worker whose process died.")
    shard_attempts: int = Field(3, ge=1, description="Workers a shard is tried on before the step fails.")
    max_resident_models: int = Field(
        MAX_RESIDENT_MODELS,
        ge=1,
        description="Models a worker keeps loaded; one more evicts the least recently used (set when a worker starts).",
    )
    startup_timeout_s: float = Field(600.0, gt=0, description="How long to wait for a worker to come up.")

    @property
    def gpu_share_per_worker(self) -> float:
        if self.workers_per_gpu > 1 and self.gpus_per_worker != 1.0:
            raise ValueError(
                f"gpu_workers: workers_per_gpu={self.workers_per_gpu} and gpus_per_worker={self.gpus_per_worker} "
                "are exclusive: set one of them"
            )
        return self.gpus_per_worker / self.workers_per_gpu

    @contextmanager
    def shard_runner(self, context: dg.AssetExecutionContext, job: ShardJob) -> Iterator[ShardRunner]:
        """A runner for the step's shards, in ``context.partition_keys`` order (it reads each next one ahead)."""
        shards = list(context.partition_keys)
        if self.engine == "local":
            _LOCAL_WORKER.max_resident_models = self.max_resident_models
            yield LocalShardRunner(shards, job)
            return
        pool = RayWorkerPool(self)
        yield RayShardRunner(shards, job, pool, context.log)


class ShardRunner:
    def __init__(self, shards: Sequence[str], job: ShardJob):
        self.shards = list(shards)
        self.job = job

    def next_shard(self, shard_id: str) -> str | None:
        position = self.shards.index(shard_id) + 1 if shard_id in self.shards else len(self.shards)
        return self.shards[position] if position < len(self.shards) else None

    def run(self, shard_id: str, on_progress: Progress | None = None) -> ShardOutcome:
        raise NotImplementedError


class LocalShardRunner(ShardRunner):
    def run(self, shard_id: str, on_progress: Progress | None = None) -> ShardOutcome:
        return _LOCAL_WORKER.run_shard(self.job, shard_id, self.next_shard(shard_id), on_progress)


class RayShardRunner(ShardRunner):
    """Runs each shard on one worker of the pool, and again on another when that worker dies."""

    def __init__(self, shards: Sequence[str], job: ShardJob, pool: RayWorkerPool, log):
        super().__init__(shards, job)
        self.pool = pool
        self.log = log
        self.worker_index: int | None = None
        """The step's worker: every shard goes to it (so its read-ahead is used) until it dies."""

    def run(self, shard_id: str, on_progress: Progress | None = None) -> ShardOutcome:
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        lost: list[str] = []
        step_fence = held_fence(shard_id)
        for attempt in range(1, self.pool.settings.shard_attempts + 1):
            if self.worker_index is None:
                self.worker_index = self.pool.pick(self.job.model_key)
            actor = self.pool.actor(self.worker_index)
            # The worker checks this attempt's fence before each change: a call that outlives this
            # step (killed, its lock then taken over by a later run), or this attempt (its worker out
            # of contact, the shard resubmitted elsewhere), cannot overwrite the files of what replaced it.
            fence = step_fence.next_attempt() if step_fence is not None else None
            call = actor.run_shard.remote(self.job, shard_id, self.next_shard(shard_id), None, fence)
            try:
                return ray.get(call)
            except RayActorError as exc:
                # The worker died (or its node did, or Ray lost contact) with this shard in flight.
                # Its outputs are written to temp names and renamed only when complete, and this
                # step still holds the shard's write lock, so the next attempt starts clean.
                name = self.pool.actor_name(self.worker_index)
                lost.append(f"{name}: {type(exc).__name__}")
                self.log.warning(
                    f"{shard_id}: lost GPU worker {name} during attempt {attempt} "
                    f"({type(exc).__name__}); submitting the shard again"
                )
                # Unavailable: the call may still run there, so the retry goes to the same worker
                # (it runs one shard at a time) once Ray has restarted it or reached it again.
                if not (isinstance(exc, ActorUnavailableError) and self.pool.reachable_again(self.worker_index)):
                    self.worker_index = None
            except BaseException:
                # The step is stopping (a failure raised by the shard's own code included): a call
                # still queued on the worker must not run after the step has let the shard go.
                ray.cancel(call)
                raise
        raise WorkerPoolUnavailable(f"{shard_id}: lost its GPU worker on all {len(lost)} attempts ({'; '.join(lost)})")


class RayWorkerPool:
    """The pool's actors on the cluster at ``settings.ray_address``: found by name, created when missing."""

    def __init__(self, settings: GpuWorkersResource):
        import ray

        self.settings = settings
        if not ray.is_initialized():
            ray.init(
                address=settings.ray_address,
                namespace=settings.namespace,
                include_dashboard=False,
                log_to_driver=False,
            )
        self.size = self._pool_size()

    def _pool_size(self) -> int:
        import ray

        share = self.settings.gpu_share_per_worker
        available = ray.cluster_resources().get(self.settings.accelerator, 0.0)
        fits = math.floor(available / share + 1e-9)
        if fits < 1:
            raise WorkerPoolUnavailable(
                f"gpu_workers: the Ray cluster at {self.settings.ray_address!r} has {available} "
                f"{self.settings.accelerator!r}; a worker needs {share}"
            )
        return min(fits, self.settings.max_workers or fits)

    def actor_name(self, index: int) -> str:
        return f"{self.settings.pool_name}-{index}"

    def actor(self, index: int):
        """The pool's ``index``-th actor: the running one, or a new one when it is gone for good."""
        import ray

        share = self.settings.gpu_share_per_worker
        reservation = (
            {"num_gpus": share}
            if self.settings.accelerator == "GPU"
            else {"resources": {self.settings.accelerator: share}}
        )
        return (
            ray.remote(ShardWorker)
            .options(
                name=self.actor_name(index),
                namespace=self.settings.namespace,
                lifetime="detached",
                get_if_exists=True,
                max_restarts=self.settings.max_restarts,
                # A shard is never retried by Ray itself: the driver resubmits it, knowing the shard.
                max_task_retries=0,
                # describe() answers while a shard runs; the worker runs one shard at a time itself.
                max_concurrency=4,
                num_cpus=0,
                **reservation,
            )
            .remote(self.actor_name(index), self.settings.max_resident_models)
        )

    def pick(self, model_key: str) -> int:
        """An idle worker that already has the model, else an idle one, else the least busy that answers."""
        import ray

        actors = {index: self.actor(index) for index in range(self.size)}
        calls = {actor.describe.remote(): index for index, actor in actors.items()}
        ready, _ = ray.wait(list(calls), num_returns=len(calls), timeout=5.0)
        if not ready:
            ready, _ = ray.wait(list(calls), num_returns=1, timeout=self.settings.startup_timeout_s)
        states = {}
        for call in ready:
            try:
                states[calls[call]] = ray.get(call)
            except Exception:  # a worker that cannot answer is not picked
                continue
        if not states:
            raise WorkerPoolUnavailable(
                f"gpu_workers: no worker of pool {self.settings.pool_name!r} answered within "
                f"{self.settings.startup_timeout_s:.0f} s"
            )
        return min(states, key=lambda index: (states[index]["busy"], model_key not in states[index]["models"], index))

    def reachable_again(self, index: int) -> bool:
        """Wait until the ``index``-th worker answers (restarted, or back in contact): True; False when
        Ray declares it dead or it stays silent for ``startup_timeout_s``."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnavailableError, GetTimeoutError

        deadline = time.monotonic() + self.settings.startup_timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get(self.actor(index).describe.remote(), timeout=max(deadline - time.monotonic(), 0.1))
                return True
            except ActorUnavailableError:
                time.sleep(1.0)
            except (ActorDiedError, GetTimeoutError):
                return False
        return False

    def describe(self) -> list[dict]:
        """Every worker's state (``ShardWorker.describe``), waiting for workers still starting."""
        import ray

        return ray.get([self.actor(index).describe.remote() for index in range(self.size)])


def gpu_workers_resource(settings: ResourceSettings, environ: dict[str, str] | None = None) -> GpuWorkersResource:
    environ = os.environ if environ is None else environ
    engine = environ.get(ENGINE_ENV, "local")
    if engine not in ("local", "ray"):
        raise ValueError(f"{ENGINE_ENV}={engine!r}: expected local or ray")
    return GpuWorkersResource(
        engine=engine,
        ray_address=environ.get(RAY_ADDRESS_ENV, "auto"),
        workers_per_gpu=int(environ.get(WORKERS_PER_GPU_ENV, "1")),
        gpus_per_worker=float(environ.get(GPUS_PER_WORKER_ENV, "1")),
        max_resident_models=int(environ.get(MAX_RESIDENT_MODELS_ENV, str(MAX_RESIDENT_MODELS))),
    )
