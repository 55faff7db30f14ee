"""[features] Qwen3 hidden states and pooled WavLM features, on the GPU pool."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import dagster as dg

from assets.alignment import frame_grids
from assets.asset_policy import shard_asset
from assets.quality import quality_decisions
from assets.reporting import device_metadata, progress_logger, stage_metadata, utterance_check_results
from assets.shard_runs import ShardEvents, ShardResult, load_model_for_step, materialize_shards
from resources.encoders import QwenEncoder, WavLMEncoder
from resources.model_pins import QWEN, WAVLM, model_that_runs
from resources.storage import DataRootResource
from resources.torch_device import TorchDeviceResource
from speechdata.features.stage import check_feature_shapes, run_qwen_hidden_states, run_wavlm_features
from speechdata.io import layout
from speechdata.quality.decisions import excluded_utterances
from speechdata.stage import StageSummary

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


@dataclass(frozen=True)
class FeatureProduct:
    """What differs between the two feature assets; everything else is :func:`materialize_features`."""

    encoder: QwenEncoder | WavLMEncoder
    store_path: Callable[[str], str]
    """The shard's array store, relative to the data root (``layout.<product>``)."""
    rows_column: str
    """The frame-grid column that fixes each utterance's row count: ``n_tokens`` (T) or ``n_frames`` (F)."""
    run: Callable[..., StageSummary]
    """``run(data_root, shard_id, model, on_progress=...)``: the stage that writes the store."""


def materialize_features(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    torch_device: TorchDeviceResource,
    product: FeatureProduct,
) -> ShardEvents:
    """Load the encoder once for every shard of the step, encode each shard, check the stored shapes."""
    root = data_root.get()
    model, load_s = load_model_for_step(context, product.encoder.identity, lambda: product.encoder.model(torch_device))

    def one_shard(shard_id: str) -> ShardResult:
        torch_device.reset_peak_memory()
        # The bridge's quality decisions apply here, before any GPU forward: a left-out utterance is a
        # reject of this stage with the quality reason, and never reaches the encoder.
        excluded = excluded_utterances(root, shard_id, "bridge")
        summary = product.run(
            root, shard_id, model, on_progress=progress_logger(context, "encoded", shard_id), excluded=excluded
        )
        grids = root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", product.rows_column])
        failures = check_feature_shapes(
            root,
            product.store_path(shard_id),
            dict(zip(grids["utt_id"].to_pylist(), grids[product.rows_column].to_pylist(), strict=True)),
            model.config.hidden_size,
        )
        return ShardResult(
            metadata={
                **stage_metadata(summary),
                **device_metadata(torch_device),
                "model": product.encoder.identity,
                "model_load_seconds": round(load_s, 3),
                "hidden_size": model.config.hidden_size,
            },
            checks=utterance_check_results(failures),
        )

    yield from materialize_shards(context, one_shard)


# The model pin is part of the code version: a new model revision marks every shard stale.
@shard_asset(code_version=f"qwen_hidden_states-v1+{model_that_runs(QWEN).identity}", **FEATURE_ASSET)
def qwen_hidden_states(
    context: dg.AssetExecutionContext, data_root: DataRootResource, torch_device: TorchDeviceResource, qwen: QwenEncoder
) -> ShardEvents:
    """Qwen3-1.7B hidden states over exactly each utterance's `tokens` (the bridge's `qwen.npy`).

    File: `shards/<shard>/qwen_hidden_states.parquet`, one row per utterance (`utt_id`, `n_rows` = T,
    `dim` = 2048 in production, `data` = float16 C-order bytes). `hidden_states[-2]` of `AutoModel`:
    the un-normed output of layer 27 of 28; the last layer and the LM head are never run. Read with
    `speechdata.features.array_store.iter_arrays`. A backfill run computes up to k shards with one model load.
    """

    run = partial(
        run_qwen_hidden_states, device=torch_device.torch_device(), max_batch_tokens=torch_device.max_batch_tokens
    )
    yield from materialize_features(
        context, data_root, torch_device, FeatureProduct(qwen, layout.qwen_hidden_states, "n_tokens", run)
    )


@shard_asset(code_version=f"wavlm_features-v1+{model_that_runs(WAVLM).identity}", **FEATURE_ASSET)
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

    run = partial(
        run_wavlm_features,
        device=torch_device.torch_device(),
        dtype=torch_device.dtype(),
        max_batch_s=torch_device.max_batch_audio_s,
        layer=wavlm.layer,
        layer_weights=wavlm.layer_weights,
    )
    yield from materialize_features(
        context, data_root, torch_device, FeatureProduct(wavlm, layout.wavlm_features, "n_frames", run)
    )


# --- the group: its definitions (assembled by dagster_project/loader.py)

defs = dg.Definitions(assets=[qwen_hidden_states, wavlm_features])
