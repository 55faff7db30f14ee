"""[features] Qwen3 hidden states and pooled WavLM features, on the GPU pool."""

import dagster as dg

from assets.alignment import frame_grids
from assets.gpu_pool import GPU_OP_TAGS, GPU_POOL
from assets.partitions import shard_partitions
from assets.reporting import device_metadata, progress_logger, stage_metadata, utterance_check_results
from resources.encoders import QwenEncoder, WavLMEncoder
from resources.storage import DataRootResource
from resources.torch_device import TorchDeviceResource
from speechdata import layout
from speechdata.feature_stage import check_feature_shapes, compute_qwen_hidden_states, compute_wavlm_features

GROUP = "features"
OWNERS = ["team:speech-data"]
FEATURE_CHECKS = {
    "shape_matches_frame_grid": "rows equal the frame grid (T for Qwen, F for WavLM), columns the hidden size",
    "finite": "no NaN or inf",
    "float16": "stored as float16",
}


@dg.asset(
    deps=[frame_grids],
    partitions_def=shard_partitions,
    group_name=GROUP,
    kinds={"pytorch", "parquet"},
    owners=OWNERS,
    pool=GPU_POOL,
    op_tags=GPU_OP_TAGS,
    code_version="qwen_hidden_states-v1",
    check_specs=[
        dg.AssetCheckSpec(name, asset="qwen_hidden_states", blocking=True, description=text)
        for name, text in FEATURE_CHECKS.items()
    ],
)
def qwen_hidden_states(
    context: dg.AssetExecutionContext, data_root: DataRootResource, torch_device: TorchDeviceResource, qwen: QwenEncoder
) -> dg.MaterializeResult:
    """Qwen3-1.7B hidden states over exactly each utterance's `tokens` (the bridge's `qwen.npy`).

    File: `shards/<shard>/qwen_hidden_states.parquet`, one row per utterance (`utt_id`, `n_rows` = T,
    `dim` = 2048 in production, `data` = float16 C-order bytes). `hidden_states[-2]` of `AutoModel`:
    the un-normed output of layer 27 of 28; the last layer and the LM head are never run. Read with
    `speechdata.array_store.iter_arrays`.
    """
    shard_id = context.partition_key
    root = data_root.get()
    model = qwen.model(torch_device)
    summary = compute_qwen_hidden_states(
        root, shard_id, model, device=torch_device.torch_device(),
        max_batch_tokens=torch_device.max_batch_tokens, on_progress=progress_logger(context, "encoded"),
    )
    grids = root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", "n_tokens"])
    failures = check_feature_shapes(
        root, layout.qwen_hidden_states(shard_id),
        dict(zip(grids["utt_id"].to_pylist(), grids["n_tokens"].to_pylist())), model.config.hidden_size,
    )
    return dg.MaterializeResult(
        metadata={**stage_metadata(summary), **device_metadata(torch_device), "model": qwen.identity,
                  "hidden_size": model.config.hidden_size},
        check_results=utterance_check_results(failures),
    )


@dg.asset(
    deps=[frame_grids],
    partitions_def=shard_partitions,
    group_name=GROUP,
    kinds={"pytorch", "parquet"},
    owners=OWNERS,
    pool=GPU_POOL,
    op_tags=GPU_OP_TAGS,
    code_version="wavlm_features-v1",
    check_specs=[
        dg.AssetCheckSpec(name, asset="wavlm_features", blocking=True, description=text)
        for name, text in FEATURE_CHECKS.items()
    ],
)
def wavlm_features(
    context: dg.AssetExecutionContext, data_root: DataRootResource, torch_device: TorchDeviceResource, wavlm: WavLMEncoder
) -> dg.MaterializeResult:
    """WavLM-Large features on Mimi's 12.5 Hz clock (the bridge's `wavlm.npy`).

    File: `shards/<shard>/wavlm_features.parquet`, one float16 `[F, 1024]` matrix per utterance
    (same layout as `qwen_hidden_states`). The 24 kHz audio is resampled to 16 kHz on the device,
    the last hidden state (or a configured layer / weighted sum) is average-pooled with kernel 8,
    stride 4 and 2 frames of padding so that row `i` is centred on Mimi frame `i`, then fitted to
    exactly `F` frames of the frame grid.
    """
    shard_id = context.partition_key
    root = data_root.get()
    model = wavlm.model(torch_device)
    summary = compute_wavlm_features(
        root, shard_id, model, device=torch_device.torch_device(), dtype=torch_device.dtype(),
        max_batch_s=torch_device.max_batch_audio_s, layer=wavlm.layer, layer_weights=wavlm.layer_weights,
        on_progress=progress_logger(context, "encoded"),
    )
    grids = root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", "n_frames"])
    failures = check_feature_shapes(
        root, layout.wavlm_features(shard_id),
        dict(zip(grids["utt_id"].to_pylist(), grids["n_frames"].to_pylist())), model.config.hidden_size,
    )
    return dg.MaterializeResult(
        metadata={**stage_metadata(summary), **device_metadata(torch_device), "model": wavlm.identity,
                  "hidden_size": model.config.hidden_size},
        check_results=utterance_check_results(failures),
    )
