"""[features] Qwen3 hidden states and pooled WavLM features, on the GPU pool."""

import time

import dagster as dg

from assets.alignment import frame_grids
from assets.gpu_pool import GPU_OP_TAGS, GPU_POOL
from assets.partitions import PER_SHARD_TAGS, shard_partitions
from assets.reporting import device_metadata, progress_logger, stage_metadata, utterance_check_results
from assets.shard_runs import GPU_BACKFILL_POLICY, ShardEvents, ShardResult, materialize_shards, shard_check_specs
from resources.encoders import QwenEncoder, WavLMEncoder, qwen_resource, wavlm_resource
from resources.model_pins import QWEN, WAVLM, model_that_runs
from resources.storage import DataRootResource, data_root_resource
from resources.torch_device import TorchDeviceResource, torch_device_resource
from speechdata.features.stage import check_feature_shapes, compute_qwen_hidden_states, compute_wavlm_features
from speechdata.io import layout

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
    tags=PER_SHARD_TAGS,
    kinds={"pytorch", "parquet"},
    owners=OWNERS,
    pool=GPU_POOL,
    op_tags=GPU_OP_TAGS,
    # The model pin is part of the code version: a new Qwen revision marks every shard stale.
    code_version=f"qwen_hidden_states-v1+{model_that_runs(QWEN).identity}",
    backfill_policy=GPU_BACKFILL_POLICY,
    check_specs=shard_check_specs("qwen_hidden_states", FEATURE_CHECKS),
)
def qwen_hidden_states(
    context: dg.AssetExecutionContext, data_root: DataRootResource, torch_device: TorchDeviceResource, qwen: QwenEncoder
) -> ShardEvents:
    """Qwen3-1.7B hidden states over exactly each utterance's `tokens` (the bridge's `qwen.npy`).

    File: `shards/<shard>/qwen_hidden_states.parquet`, one row per utterance (`utt_id`, `n_rows` = T,
    `dim` = 2048 in production, `data` = float16 C-order bytes). `hidden_states[-2]` of `AutoModel`:
    the un-normed output of layer 27 of 28; the last layer and the LM head are never run. Read with
    `speechdata.features.array_store.iter_arrays`. A backfill run computes up to k shards with one model load.
    """
    root = data_root.get()
    started = time.perf_counter()
    model = qwen.model(torch_device)
    load_s = time.perf_counter() - started
    context.log.info(f"{qwen.identity} loaded in {load_s:.1f} s for {len(context.partition_keys)} shards")

    def one_shard(shard_id: str) -> ShardResult:
        torch_device.reset_peak_memory()
        summary = compute_qwen_hidden_states(
            root,
            shard_id,
            model,
            device=torch_device.torch_device(),
            max_batch_tokens=torch_device.max_batch_tokens,
            on_progress=progress_logger(context, "encoded", shard_id),
        )
        grids = root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", "n_tokens"])
        failures = check_feature_shapes(
            root,
            layout.qwen_hidden_states(shard_id),
            dict(zip(grids["utt_id"].to_pylist(), grids["n_tokens"].to_pylist())),
            model.config.hidden_size,
        )
        return ShardResult(
            metadata={
                **stage_metadata(summary),
                **device_metadata(torch_device),
                "model": qwen.identity,
                "model_load_seconds": round(load_s, 3),
                "hidden_size": model.config.hidden_size,
            },
            checks=utterance_check_results(failures),
        )

    yield from materialize_shards(context, one_shard)


@dg.asset(
    deps=[frame_grids],
    partitions_def=shard_partitions,
    group_name=GROUP,
    tags=PER_SHARD_TAGS,
    kinds={"pytorch", "parquet"},
    owners=OWNERS,
    pool=GPU_POOL,
    op_tags=GPU_OP_TAGS,
    code_version=f"wavlm_features-v1+{model_that_runs(WAVLM).identity}",
    backfill_policy=GPU_BACKFILL_POLICY,
    check_specs=shard_check_specs("wavlm_features", FEATURE_CHECKS),
)
def wavlm_features(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    torch_device: TorchDeviceResource,
    wavlm: WavLMEncoder,
) -> ShardEvents:
    """WavLM-Large features on Mimi's 12.5 Hz clock (the bridge's `wavlm.npy`).

    File: `shards/<shard>/wavlm_features.parquet`, one float16 `[F, 1024]` matrix per utterance
    (same layout as `qwen_hidden_states`). The 24 kHz audio is resampled to 16 kHz on the device,
    the last hidden state (or a configured layer / weighted sum) is average-pooled with kernel 8,
    stride 4 and 2 frames of padding so that row `i` is centred on Mimi frame `i`, then fitted to
    exactly `F` frames of the frame grid. A backfill run computes up to k shards with one model load.
    """
    root = data_root.get()
    started = time.perf_counter()
    model = wavlm.model(torch_device)
    load_s = time.perf_counter() - started
    context.log.info(f"{wavlm.identity} loaded in {load_s:.1f} s for {len(context.partition_keys)} shards")

    def one_shard(shard_id: str) -> ShardResult:
        torch_device.reset_peak_memory()
        summary = compute_wavlm_features(
            root,
            shard_id,
            model,
            device=torch_device.torch_device(),
            dtype=torch_device.dtype(),
            max_batch_s=torch_device.max_batch_audio_s,
            layer=wavlm.layer,
            layer_weights=wavlm.layer_weights,
            on_progress=progress_logger(context, "encoded", shard_id),
        )
        grids = root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", "n_frames"])
        failures = check_feature_shapes(
            root,
            layout.wavlm_features(shard_id),
            dict(zip(grids["utt_id"].to_pylist(), grids["n_frames"].to_pylist())),
            model.config.hidden_size,
        )
        return ShardResult(
            metadata={
                **stage_metadata(summary),
                **device_metadata(torch_device),
                "model": wavlm.identity,
                "model_load_seconds": round(load_s, 3),
                "hidden_size": model.config.hidden_size,
            },
            checks=utterance_check_results(failures),
        )

    yield from materialize_shards(context, one_shard)


# --- the group: its definitions and the resources they need (assembled by dagster_project/definitions.py)

defs = dg.Definitions(assets=[qwen_hidden_states, wavlm_features])
RESOURCES = {
    "data_root": data_root_resource,
    "torch_device": torch_device_resource,
    "qwen": qwen_resource,
    "wavlm": wavlm_resource,
}
