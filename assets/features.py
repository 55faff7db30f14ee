"""[features] Qwen3 hidden states and pooled WavLM features, on the GPU pool."""

import dagster as dg

from assets.alignment import frame_grids
from assets.asset_policy import shard_asset
from assets.quality import quality_decisions
from assets.reporting import progress_logger, stage_metadata, utterance_check_results
from assets.shard_runs import ShardEvents, ShardResult, materialize_shards
from resources.encoders import QwenEncoder, WavLMEncoder
from resources.feature_jobs import FeatureKind, FeatureShardResult, feature_shard_job
from resources.gpu_workers import GpuWorkersResource
from resources.model_pins import QWEN, WAVLM, model_bound
from resources.storage import DataRootResource
from resources.torch_device import TorchDeviceResource

UI_POSITION = 3
FEATURE_CHECKS = {
    "shape_matches_frame_grid": "rows equal the frame grid (T for Qwen, F for WavLM), columns the hidden size",
    "finite": "no NaN or inf",
    "float16": "stored as float16",
}
FEATURE_ASSET = {
    "deps": [frame_grids, quality_decisions],
    "kinds": {"pytorch", "parquet"},
    "checks": FEATURE_CHECKS,
    "gpu": True,
}
"""What both feature assets declare: all but their code version."""


def materialize_features(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    torch_device: TorchDeviceResource,
    gpu_workers: GpuWorkersResource,
    kind: FeatureKind,
    encoder: QwenEncoder | WavLMEncoder,
) -> ShardEvents:
    """Encode each shard of the step on a GPU worker (its model loaded once and kept), check the stored shapes."""
    job = feature_shard_job(kind, data_root.get(), encoder, torch_device)
    with gpu_workers.shard_runner(context, job) as runner:

        def one_shard(shard_id: str) -> ShardResult:
            outcome = runner.run(shard_id, on_progress=progress_logger(context, "encoded", shard_id))
            result: FeatureShardResult = outcome.result
            device = {"device": result.device, "dtype": result.dtype}
            if result.gpu_memory_peak_gb is not None:
                device["gpu_memory_peak_gb"] = round(result.gpu_memory_peak_gb, 3)
            return ShardResult(
                metadata={
                    **stage_metadata(result.summary),
                    **device,
                    "model": encoder.identity,
                    "model_load_seconds": round(outcome.model_load_s, 3),
                    "gpu_engine": gpu_workers.engine,
                    "gpu_worker": outcome.worker,
                    "inputs_read_ahead": outcome.inputs_read_ahead,
                    "input_wait_s": round(outcome.input_wait_s, 3),
                    "hidden_size": result.hidden_size,
                },
                checks=utterance_check_results(result.check_failures),
            )

        yield from materialize_shards(context, one_shard)


# The model pin is part of the code version: a new model revision marks every shard stale.
@shard_asset(code_version=model_bound("qwen_hidden_states", "qwen_hidden_states-v2+", QWEN), **FEATURE_ASSET)
def qwen_hidden_states(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    torch_device: TorchDeviceResource,
    gpu_workers: GpuWorkersResource,
    qwen: QwenEncoder,
) -> ShardEvents:
    """Qwen3-1.7B hidden states over exactly each utterance's `tokens` (the bridge's `qwen.npy`).

    File: `shards/<shard>/qwen_hidden_states.parquet`, one row per utterance (`utt_id`, `n_rows` = T,
    `dim` = 2048 in production, `data` = float16 C-order bytes). `hidden_states[-2]` of `AutoModel`:
    the un-normed output of layer 27 of 28; the last layer and the LM head are never run. Read with
    `speechdata.features.array_store.iter_arrays`. The model stays loaded on its GPU worker across
    shards (and, on the Ray engine, across runs): docs/gpu-workers.md.
    """

    yield from materialize_features(context, data_root, torch_device, gpu_workers, "qwen", qwen)


@shard_asset(code_version=model_bound("wavlm_features", "wavlm_features-v2+", WAVLM), **FEATURE_ASSET)
def wavlm_features(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    torch_device: TorchDeviceResource,
    gpu_workers: GpuWorkersResource,
    wavlm: WavLMEncoder,
) -> ShardEvents:
    """WavLM-Large features on Mimi's 12.5 Hz clock (the bridge's `wavlm.npy`).

    File: `shards/<shard>/wavlm_features.parquet`, one float16 `[F, 1024]` matrix per utterance
    (same layout as `qwen_hidden_states`). The 24 kHz audio is resampled to 16 kHz on the device,
    the last hidden state (or a configured layer / weighted sum) is average-pooled with kernel 8,
    stride 4 and 2 frames of padding so that row `i` is centred on Mimi frame `i`, then fitted to
    exactly `F` frames of the frame grid. The model stays loaded on its GPU worker across shards
    (and, on the Ray engine, across runs): docs/gpu-workers.md.
    """

    yield from materialize_features(context, data_root, torch_device, gpu_workers, "wavlm", wavlm)


# --- the group: its definitions (assembled by dagster_project/loader.py)

defs = dg.Definitions(assets=[qwen_hidden_states, wavlm_features])
