"""The feature assets' shard jobs for the GPU workers: load the encoder, encode a shard, check it.

A job names its resources by class and field values (a Dagster resource object itself does not
pickle), so a Ray actor rebuilds the same encoder and device settings as the step would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Literal

from resources.encoders import QwenEncoder, WavLMEncoder
from resources.gpu_worker import Progress, ShardJob
from resources.torch_device import TorchDeviceResource
from speechdata.accounting.stage import StageSummary
from speechdata.features.shard_inputs import (
    QwenShardInputs,
    WavlmShardInputs,
    inputs_are_current,
    read_qwen_inputs,
    read_wavlm_inputs,
)
from speechdata.features.stage import check_feature_shapes, run_qwen_hidden_states, run_wavlm_features
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.decisions import excluded_utterances

FeatureKind = Literal["qwen", "wavlm"]


@dataclass(frozen=True)
class FeatureShardResult:
    """One encoded shard: the stage's summary, the utterances failing each check, where it ran."""

    summary: StageSummary
    check_failures: dict[str, list[str]]
    hidden_size: int
    device: str
    dtype: str
    gpu_memory_peak_gb: float | None


def feature_shard_job(
    kind: FeatureKind, data_root: DataRoot, encoder: QwenEncoder | WavLMEncoder, torch_device: TorchDeviceResource
) -> ShardJob:
    encoder_fields, device_fields = encoder.model_dump(), torch_device.model_dump()
    return ShardJob(
        # The device as configured ("auto" included): the worker resolves it on its own machine.
        model_key=f"{kind}:{encoder.identity} on {torch_device.device}",
        load_model=partial(load_encoder, kind, encoder_fields, device_fields),
        read_inputs=partial(read_qwen_inputs if kind == "qwen" else read_wavlm_inputs, data_root),
        inputs_current=partial(inputs_are_current, data_root),
        run=partial(encode_feature_shard, kind, data_root, encoder_fields, device_fields),
    )


def load_encoder(kind: FeatureKind, encoder_fields: dict, device_fields: dict):
    encoder = (QwenEncoder if kind == "qwen" else WavLMEncoder)(**encoder_fields)
    return encoder.model(TorchDeviceResource(**device_fields))


def encode_feature_shard(
    kind: FeatureKind,
    data_root: DataRoot,
    encoder_fields: dict,
    device_fields: dict,
    model,
    shard_id: str,
    inputs: QwenShardInputs | WavlmShardInputs | None,
    on_progress: Progress | None,
) -> FeatureShardResult:
    device = TorchDeviceResource(**device_fields)
    device.reset_peak_memory()
    # The bridge's quality decisions apply here, before any GPU forward: a left-out utterance is a
    # reject of this stage with the quality reason, and never reaches the encoder.
    excluded = excluded_utterances(data_root, shard_id, "bridge")
    if kind == "qwen":
        summary = run_qwen_hidden_states(
            data_root,
            shard_id,
            model,
            device=device.torch_device(),
            max_batch_tokens=device.max_batch_tokens,
            on_progress=on_progress,
            inputs=inputs,
            excluded=excluded,
        )
        store, rows_column = layout.qwen_hidden_states(shard_id), "n_tokens"
    else:
        encoder = WavLMEncoder(**encoder_fields)
        summary = run_wavlm_features(
            data_root,
            shard_id,
            model,
            device=device.torch_device(),
            dtype=device.dtype(),
            max_batch_s=device.max_batch_audio_s,
            layer=encoder.layer,
            layer_weights=encoder.layer_weights,
            on_progress=on_progress,
            inputs=inputs,
            excluded=excluded,
        )
        store, rows_column = layout.wavlm_features(shard_id), "n_frames"
    grids = data_root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", rows_column])
    failures = check_feature_shapes(
        data_root,
        store,
        dict(zip(grids["utt_id"].to_pylist(), grids[rows_column].to_pylist(), strict=True)),
        model.config.hidden_size,
    )
    return FeatureShardResult(
        summary=summary,
        check_failures=failures,
        hidden_size=model.config.hidden_size,
        device=str(device.torch_device()),
        dtype=str(device.dtype()).removeprefix("torch."),
        gpu_memory_peak_gb=device.peak_memory_gb(),
    )
