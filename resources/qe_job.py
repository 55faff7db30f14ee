"""The ``qe_scores`` shard job for the GPU workers: MetricX loaded once per worker, one shard scored.

The worker reads the next shard's streaming segments (as MetricX input lines) while the current
shard is scored (``speechdata.translation.qe_stage.QeShardInputs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from resources.gpu_worker import Progress, ShardJob
from resources.qe import MetricXResource
from resources.torch_device import TorchDeviceResource
from speechdata.io.storage import DataRoot
from speechdata.translation.qe_stage import (
    QeShardInputs,
    QeSummary,
    qe_inputs_are_current,
    read_qe_inputs,
    run_qe_scores,
)


@dataclass(frozen=True)
class QeShardResult:
    summary: QeSummary
    device: str
    dtype: str
    gpu_memory_peak_gb: float | None


def qe_shard_job(data_root: DataRoot, qe: MetricXResource, torch_device: TorchDeviceResource) -> ShardJob:
    qe_fields, device_fields = qe.model_dump(), torch_device.model_dump()
    return ShardJob(
        model_key=f"qe:{qe.identity} cache={qe.model_cache_dir} on {torch_device.device}",
        load_model=partial(load_scorer, qe_fields, device_fields),
        read_inputs=partial(read_qe_inputs, data_root),
        inputs_current=partial(qe_inputs_are_current, data_root),
        run=partial(score_qe_shard, data_root, device_fields),
    )


def load_scorer(qe_fields: dict, device_fields: dict):
    return MetricXResource(**qe_fields).scorer(TorchDeviceResource(**device_fields))


def score_qe_shard(
    data_root: DataRoot,
    device_fields: dict,
    scorer,
    shard_id: str,
    inputs: QeShardInputs | None,
    on_progress: Progress | None,
) -> QeShardResult:
    device = TorchDeviceResource(**device_fields)
    device.reset_peak_memory()
    summary = run_qe_scores(data_root, shard_id, scorer, on_progress=on_progress, inputs=inputs)
    return QeShardResult(
        summary=summary,
        device=str(device.torch_device()),
        dtype=str(device.dtype()).removeprefix("torch."),
        gpu_memory_peak_gb=device.peak_memory_gb(),
    )
