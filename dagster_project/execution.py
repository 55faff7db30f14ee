"""The executor switch: how a run's steps execute, chosen by ``SPEECHDATA_EXECUTOR``.

- ``in_process`` (default; ``make dev``, a single machine): every step of a run in the run's own
  process, so torch, NeMo and each model are loaded once per run instead of once per step
  (``benchmarks/orchestration/bench_backfill_policy.py`` compares the executors; docs/performance.md has the
  figures). GPU steps are still limited by the ``gpu`` pool across runs.
- ``multiprocess``: each step in its own process on the run's machine, at most
  ``SPEECHDATA_MAX_CONCURRENT_STEPS`` at once (default: the CPU count, at most 4: every step process
  loads its own models). Worth it when steps are long and independent on a many-core machine.
- ``k8s`` (the Helm deployment): dagster-k8s's ``k8s_job_executor``, each step its own Kubernetes Job
  in the user-code image, at most ``SPEECHDATA_MAX_CONCURRENT_STEPS`` pods per run (default 16).
  GPU steps get their GPU, node selector and toleration from their ``dagster-k8s/config`` op tags
  (:mod:`assets.gpu_pool`); every step pod gets the CPU and memory requests below, which the GPU
  steps' tags extend rather than replace (dagster-k8s deep-merges them).

Scale-out is Dagster's and Kubernetes': this module only picks and configures existing executors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import dagster as dg

EXECUTOR_ENV = "SPEECHDATA_EXECUTOR"
MAX_CONCURRENT_STEPS_ENV = "SPEECHDATA_MAX_CONCURRENT_STEPS"
EXECUTORS = ("in_process", "multiprocess", "k8s")

DEFAULT_K8S_MAX_CONCURRENT_STEPS = 16

STEP_POD_RESOURCES = {"requests": {"cpu": "1", "memory": "4Gi"}, "limits": {"memory": "16Gi"}}
"""Every step pod's container: one CPU and 4 GiB guaranteed (the models of a CPU stage fit), 16 GiB cap."""


def executor_kind(environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    kind = environ.get(EXECUTOR_ENV, "in_process").strip() or "in_process"
    if kind not in EXECUTORS:
        raise ValueError(f"{EXECUTOR_ENV} must be one of {', '.join(EXECUTORS)}, got {kind!r}")
    return kind


def max_concurrent_steps(environ: Mapping[str, str] | None = None) -> int:
    environ = os.environ if environ is None else environ
    value = environ.get(MAX_CONCURRENT_STEPS_ENV, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{MAX_CONCURRENT_STEPS_ENV} must be a positive integer, got {value!r}")
        return int(value)
    if executor_kind(environ) == "k8s":
        return DEFAULT_K8S_MAX_CONCURRENT_STEPS
    return max(1, min(os.cpu_count() or 1, 4))


def k8s_executor_config(environ: Mapping[str, str] | None = None) -> dict:
    """Run config of the ``k8s_job_executor`` (the image, namespace and env come from the Helm
    deployment: the user-code deployment's image and the run launcher's settings)."""
    return {
        "max_concurrent": max_concurrent_steps(environ),
        "step_k8s_config": {"container_config": {"resources": STEP_POD_RESOURCES}},
    }


def executor_from_env(environ: Mapping[str, str] | None = None) -> dg.ExecutorDefinition:
    """The default executor of every job in the code location."""
    if executor_kind(environ) == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor.configured(k8s_executor_config(environ), name="k8s_job_executor")
    if executor_kind(environ) == "in_process":
        return dg.in_process_executor
    return dg.multiprocess_executor.configured(
        {"max_concurrent": max_concurrent_steps(environ)}, name="multiprocess_capped"
    )
