"""One GPU worker: keeps each model it is asked for loaded and runs shard jobs through it.

The same class serves both engines of :mod:`resources.gpu_workers`: in the step's own process
(``local``) and as a named, detached Ray actor (``ray``), where it outlives the Dagster runs that
use it, so a model loaded for one run serves the next. It imports neither Dagster nor Ray: a Ray
worker process loads only this module, the job's functions and what they import.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from speechdata.io.storage import guarded_changes

HOLD_FLAG_ENV = "SPEECHDATA_GPU_WORKER_HOLD"
"""Fault hook for the worker-death tests: the path of a flag file naming one shard id.

The first worker that reaches that shard (after its first batch is written, so its output temp file
is open) claims the flag by renaming it to ``<flag>.held``, writes its PID to ``<flag>.pid`` and
sleeps until it is killed. Unset in production: one environment lookup per progress report."""

HOLD_SECONDS = 300.0

Progress = Callable[..., None]

MAX_RESIDENT_MODELS = 4
"""Models a worker keeps loaded at once by default: the pipeline's four GPU models (CTC aligner,
Qwen3, WavLM, MetricX). A fifth model key (a new revision, another dtype) evicts the least recently
used one, so a pin changed during a backfill never piles old models up on the GPU."""

FENCE_CHECK_INTERVAL_S = 2.0
"""Between a shard's progress reports the worker reads its fence at most this often (an S3 lock is a
GET); every change to the data root is checked regardless."""


class Fence(Protocol):
    """The driver's hold on a shard (:class:`speechdata.io.shard_lock.WriteFence`): ``check(path)``
    raises once the shard is no longer the driver's to write."""

    def check(self, path: str = "") -> None: ...


@dataclass(frozen=True)
class ShardJob:
    """What a worker needs to compute one asset's shards: picklable, so Ray can ship it to an actor.

    The functions must be importable module-level functions (or ``functools.partial`` of them) with
    plain arguments: Ray pickles them by reference, and the worker imports their modules.
    """

    model_key: str
    """The model's identity and settings (model id, revision, device, dtype...): a worker loads
    each key once and keeps it."""
    load_model: Callable[[], Any]
    read_inputs: Callable[[str], Any]
    """``read_inputs(shard_id)``: the shard's inputs, read only (safe to read ahead of its lock)."""
    inputs_current: Callable[[Any], bool]
    """Whether inputs read ahead still match the data root (an input rewritten meanwhile is read again)."""
    run: Callable[..., Any]
    """``run(model, shard_id, inputs, on_progress)``: writes the shard's outputs, returns its result."""


@dataclass(frozen=True)
class ShardOutcome:
    """A shard's result and where and how it was computed."""

    result: Any
    worker: str
    """``<worker name> pid <pid> on <host>``."""
    model_load_s: float
    """Seconds spent loading the model for this shard: 0 when it was already resident."""
    model_loads: int
    """How many times this worker has loaded this model key in its lifetime (1 when resident)."""
    inputs_read_ahead: bool
    """Whether the inputs were read while the previous shard was computing."""
    input_wait_s: float
    compute_s: float


@dataclass
class _ReadAhead:
    """At most one shard's inputs, read on a thread: the worker's bounded prefetch."""

    key: tuple[str, str] | None = None
    thread: threading.Thread | None = None
    outcome: dict = field(default_factory=dict)

    def start(self, job: ShardJob, shard_id: str) -> None:
        self.key, outcome = (job.model_key, shard_id), {}
        self.outcome = outcome

        def read() -> None:
            try:
                outcome["inputs"] = job.read_inputs(shard_id)
            except Exception as exc:  # the shard's own call reads again and raises it there
                outcome["error"] = exc

        self.thread = threading.Thread(target=read, name=f"read-ahead-{shard_id}", daemon=True)
        self.thread.start()

    def take(self, job: ShardJob, shard_id: str) -> tuple[bool, Any]:
        """``(True, inputs)`` when this shard was read ahead (and is still current), else ``(False, None)``.

        Either way the worker lets go of what was read ahead: an idle resident worker holds no shard's
        inputs (the alignment stage's are the shard's decoded audio)."""
        if self.key != (job.model_key, shard_id) or self.thread is None:
            self.outcome = {}
            return False, None
        self.thread.join()
        outcome, self.key, self.thread, self.outcome = self.outcome, None, None, {}
        if "inputs" not in outcome or not job.inputs_current(outcome["inputs"]):
            return False, None
        return True, outcome["inputs"]


class ShardWorker:
    """Runs shard jobs one at a time, with each job's model loaded once and kept."""

    def __init__(self, name: str, max_resident_models: int = MAX_RESIDENT_MODELS):
        if max_resident_models < 1:
            raise ValueError(f"max_resident_models={max_resident_models}: a worker keeps at least one model")
        self.name = name
        self.max_resident_models = max_resident_models
        self._models: OrderedDict[str, Any] = OrderedDict()
        """Resident models, least recently used first."""
        self._loads: Counter[str] = Counter()
        self._evictions: Counter[str] = Counter()
        self._shards_done = 0
        self._busy = False
        self._one_shard_at_a_time = threading.Lock()
        self._read_ahead = _ReadAhead()

    def describe(self) -> dict:
        """Who and what this worker is: pid, host, resident model keys, load counts, busy or idle."""
        return {
            "name": self.name,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "models": sorted(self._models),
            "model_loads": dict(self._loads),
            "model_evictions": dict(self._evictions),
            "shards_done": self._shards_done,
            "busy": self._busy,
        }

    def run_shard(
        self,
        job: ShardJob,
        shard_id: str,
        next_shard_id: str | None = None,
        on_progress: Progress | None = None,
        fence: Fence | None = None,
    ) -> ShardOutcome:
        """Compute ``shard_id``; meanwhile read ``next_shard_id``'s inputs (the caller's next shard).

        ``on_progress`` (in-process callers only: it is not shipped to an actor) gets the stage's
        ``(done, total, audio_s)`` reports. ``fence``: the driver's lock on the shard, given by a driver
        in another process. The shard does not start once the driver has let it go, stops at its next
        progress report after that, and makes no change to the data root without the fence's check
        passing just before: a call that outlives its driver (killed, its lock taken over by a later
        run) never overwrites or removes the later run's files."""
        with self._one_shard_at_a_time:
            self._busy = True
            try:
                if fence is None:
                    return self._run_shard(job, shard_id, next_shard_id, on_progress)
                fence.check()
                with guarded_changes(fence.check):
                    return self._run_shard(job, shard_id, next_shard_id, _checking_fence(fence, on_progress))
            finally:
                self._busy = False

    def _run_shard(
        self, job: ShardJob, shard_id: str, next_shard_id: str | None, on_progress: Progress | None
    ) -> ShardOutcome:
        started = time.perf_counter()
        read_ahead, inputs = self._read_ahead.take(job, shard_id)
        if not read_ahead:
            inputs = job.read_inputs(shard_id)
        input_wait_s = time.perf_counter() - started
        if next_shard_id is not None:
            self._read_ahead.start(job, next_shard_id)
        model, load_s = self._model(job)
        computing = time.perf_counter()
        result = job.run(model, shard_id, inputs, _with_hold_hook(shard_id, on_progress))
        self._shards_done += 1
        return ShardOutcome(
            result=result,
            worker=f"{self.name} pid {os.getpid()} on {socket.gethostname()}",
            model_load_s=load_s,
            model_loads=self._loads[job.model_key],
            inputs_read_ahead=read_ahead,
            input_wait_s=input_wait_s,
            compute_s=time.perf_counter() - computing,
        )

    def _model(self, job: ShardJob) -> tuple[Any, float]:
        if job.model_key in self._models:
            self._models.move_to_end(job.model_key)
            return self._models[job.model_key], 0.0
        while len(self._models) >= self.max_resident_models:
            self._evict_least_recently_used()
        started = time.perf_counter()
        try:
            model = job.load_model()
        except Exception as exc:
            if not (_is_out_of_memory(exc) and self._models):
                raise
            # The device is full of other resident models: free them all and load once more.
            while self._models:
                self._evict_least_recently_used()
            model = job.load_model()
        self._models[job.model_key] = model
        self._loads[job.model_key] += 1
        return model, time.perf_counter() - started

    def _evict_least_recently_used(self) -> None:
        key, _ = self._models.popitem(last=False)
        self._evictions[key] += 1
        _release_device_memory()


def _is_out_of_memory(exc: BaseException) -> bool:
    """A device out-of-memory error (torch's ``OutOfMemoryError``), recognised without importing torch."""
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def _release_device_memory() -> None:
    """Give an evicted model's memory back: its tensors are freed once unreachable, and torch's
    caching allocator keeps freed CUDA blocks until it is told to return them."""
    gc.collect()
    torch = sys.modules.get("torch")  # a worker that never imported torch holds no device memory
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def _checking_fence(fence: Fence, on_progress: Progress | None) -> Progress:
    last_check = time.monotonic()

    def check_then_report(*progress) -> None:
        nonlocal last_check
        if time.monotonic() - last_check >= FENCE_CHECK_INTERVAL_S:
            fence.check()
            last_check = time.monotonic()
        if on_progress is not None:
            on_progress(*progress)

    return check_then_report


def _with_hold_hook(shard_id: str, on_progress: Progress | None) -> Progress | None:
    flag = os.environ.get(HOLD_FLAG_ENV)
    if not flag:
        return on_progress

    def hold_once(*progress) -> None:
        if on_progress is not None:
            on_progress(*progress)
        try:
            with open(flag) as handle:
                if handle.read().strip() != shard_id:
                    return
            os.rename(flag, f"{flag}.held")  # atomic: one worker claims the flag, a retry finds none
        except FileNotFoundError:
            return
        with open(f"{flag}.pid.tmp", "w") as handle:
            handle.write(str(os.getpid()))
        os.replace(f"{flag}.pid.tmp", f"{flag}.pid")
        time.sleep(HOLD_SECONDS)

    return hold_once
