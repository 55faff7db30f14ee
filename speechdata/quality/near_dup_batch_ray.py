"""The batch pass's Ray engine: each task of :mod:`speechdata.quality.near_dup_batch` a Ray task.

The same tasks as :class:`~speechdata.quality.near_dup_batch.LocalEngine` runs in one process, on
every CPU of a Ray cluster: the signals, keys, candidate joins and writes are Ray tasks, their
outputs stay in Ray's object store (spilled to disk when it fills) and reach the next stage's tasks
without passing through the driver, which only keeps each shard's utterance ids and the matches.
Ray is imported when a pass runs, never by the code location or the other commands. Every task is
idempotent (its writes are atomic and named by content), so Ray retries a task whose worker died.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

RAY_ADDRESS_ENV = "SPEECHDATA_RAY_ADDRESS"
"""The cluster the GPU workers use too (docs/gpu-workers.md); the batch pass's default address."""
LOCAL = "local"
"""Address meaning: start a Ray instance on this machine for the pass, and stop it after."""

_REMOTE: dict[Callable[..., Any], Any] = {}


def _remote(fn: Callable[..., Any]):
    import ray

    if fn not in _REMOTE:
        _REMOTE[fn] = ray.remote(fn)
    return _REMOTE[fn]


def _single(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn``'s one-value tuple, unpacked: Ray gives one object for ``num_returns=1``, not a tuple of one."""
    (value,) = fn(*args)
    return value


@dataclass(frozen=True)
class RayEngine:
    """Runs each task on the Ray cluster ``ray.init`` connected this process to (:func:`ray_connection`)."""

    cpus_per_task: float = 1.0
    max_retries: int = 3

    def submit(self, fn: Callable[..., Any], args: Sequence[Any], returns: int | None = None) -> Any:
        options = {"num_cpus": self.cpus_per_task, "max_retries": self.max_retries}
        if returns is None:
            return _remote(fn).options(**options).remote(*args)
        if returns == 1:
            return [_remote(_single).options(**options).remote(fn, *args)]
        return list(_remote(fn).options(num_returns=returns, **options).remote(*args))

    def fetch(self, handle: Any) -> Any:
        import ray

        return ray.get(handle)

    def completed(self, handles: Sequence[Any]) -> Iterator[int]:
        import ray

        pending = list(handles)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            yield from range(len(ready))


def default_address(environ: dict[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    return environ.get(RAY_ADDRESS_ENV) or LOCAL


@contextlib.contextmanager
def ray_connection(address: str = LOCAL, *, num_cpus: int | None = None) -> Iterator[str]:
    """Connect this process to the cluster at ``address`` (``auto``, ``<head>:6379``,
    ``ray://<head>:10001``), or start a Ray instance here for ``local`` (``num_cpus``: its CPUs,
    default all); yields a description of the cluster. A process already connected stays so."""
    import ray

    if ray.is_initialized():
        yield _describe(ray)
        return
    local = address == LOCAL
    # "local" always starts an instance of its own: with None, Ray joins whatever cluster it last
    # recorded on this machine (another process's), and then refuses num_cpus
    ray.init(
        address=LOCAL if local else address,
        num_cpus=num_cpus if local else None,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield _describe(ray)
    finally:
        ray.shutdown()


def _describe(ray) -> str:
    resources = ray.cluster_resources()
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    return f"{nodes} node(s), {resources.get('CPU', 0):.0f} CPUs"


IN_PROCESS = "in-process"
"""Address meaning: no Ray at all, every task in this process (:class:`LocalEngine`)."""


@contextlib.contextmanager
def batch_engine(address: str | None = None) -> Iterator[tuple[Any, str]]:
    """The engine for ``address`` (None: ``$SPEECHDATA_RAY_ADDRESS``, else ``local``) and a description
    of where it runs: :data:`IN_PROCESS` gives the in-process engine, anything else Ray's."""
    from speechdata.quality.near_dup_batch import LocalEngine

    address = address or default_address()
    if address == IN_PROCESS:
        yield LocalEngine(), "in this process"
        return
    with ray_connection(address) as cluster:
        yield RayEngine(), f"Ray at {address}: {cluster}"
