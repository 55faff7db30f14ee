"""[translation] Streaming English->Chinese segments from forced alignments, QE-scored and filtered."""

import dagster as dg
import pyarrow.compute as pc
from pydantic import Field

from assets.alignment import alignments
from assets.asset_policy import group_of, shard_asset
from assets.quality import quality_decisions
from assets.reporting import (
    column_schema,
    log_stage,
    markdown_preview,
    progress_logger,
    stage_metadata,
)
from assets.shard_runs import ShardEvents, ShardResult, materialize_shards
from resources.gpu_worker import ShardOutcome
from resources.gpu_workers import GpuWorkersResource
from resources.qe import MetricXResource
from resources.qe_job import QeShardResult, qe_shard_job
from resources.storage import DataRootResource
from resources.torch_device import TorchDeviceResource
from speechdata.io import layout
from speechdata.quality.decisions import excluded_utterances
from speechdata.translation.qe_stage import DEFAULT_THRESHOLD, run_streaming_pairs
from speechdata.translation.segments import DEFAULT_MAX_SKIP_WORDS
from speechdata.translation.stage import SegmentSettings, run_streaming_segments

UI_POSITION = 7


class StreamingSegmentsConfig(dg.Config):
    step_s: float = Field(1.0, description="Emission step: a chunk is emitted at second S when its end <= S + step.")
    max_skip_words: int = Field(
        DEFAULT_MAX_SKIP_WORDS, description="Aligned words a chunk may skip (words the LLM left out) and still match."
    )
    allowed_ids: list[str] | None = Field(None, description="Only these utterances (None: every aligned utterance).")
    min_alignment_score: float | None = Field(
        None, description="Only utterances whose alignment score (mean frame log-prob) is at least this."
    )


# The translation assets wait for the LLM segmentation, which lands after the shard.
@shard_asset(
    deps=[alignments, quality_decisions],
    kinds={"parquet", "json"},
    code_version="streaming_segments-v1",
    in_per_shard_job=False,
)
def streaming_segments(
    context: dg.AssetExecutionContext, config: StreamingSegmentsConfig, data_root: DataRootResource
) -> ShardEvents:
    """Bilingual streaming segments per latency level: what a simultaneous translator could emit each second.

    Inputs: the shard's word alignments (NeMo, or MFA TextGrids imported by `alignments` with
    `source: import`) and LLM segmentation JSONs landed at `landing/<shard>/segmentation/<utt_id>.json`
    (`low_latency`/`medium_latency`/`high_latency`, each parallel `English`/`Chinese` chunk lists).
    Chunks are matched monotonically to the aligned words and emitted at the first second S with
    `end <= S + step`. Files: `translation/segments/shard=<shard>/json/<utt_id>.json` (one bilingual document per utterance)
    and `.../segments.parquet` (one row per utterance, latency and segment). Malformed inputs,
    filtered utterances and utterances no chunk matches are in `shards/<shard>/rejects/streaming_segments.parquet`.
    """
    root = data_root.get()
    settings = SegmentSettings(
        step_ms=int(round(config.step_s * 1000)),
        max_skip_words=config.max_skip_words,
        allowed_ids=frozenset(config.allowed_ids) if config.allowed_ids is not None else None,
        min_alignment_score=config.min_alignment_score,
    )
    yield from materialize_shards(context, lambda shard_id: _segment_one_shard(context, root, settings, shard_id))


def _segment_one_shard(
    context: dg.AssetExecutionContext, root, settings: SegmentSettings, shard_id: str
) -> ShardResult:
    summary = run_streaming_segments(
        root, shard_id, settings, excluded=excluded_utterances(root, shard_id, "translation")
    )
    table = root.read_parquet(layout.streaming_segments(shard_id))
    log_stage(context, summary, "utterances", f", {table.num_rows} segments")
    return ShardResult(
        metadata={
            **stage_metadata(summary),
            "segments": table.num_rows,
            "segments_by_level": dg.MetadataValue.json(dict(summary.level_totals.segments)),
            "unmatched_chunk_share_by_level": dg.MetadataValue.json(summary.level_totals.unmatched_share()),
            "dagster/column_schema": column_schema(table.schema),
            "preview": markdown_preview(table, ["utt_id", "latency", "emit_ms", "source", "target"]),
        }
    )


@shard_asset(
    deps=[streaming_segments],
    kinds={"pytorch", "parquet"},
    code_version="qe_scores-v1",
    gpu=True,
    in_per_shard_job=False,
)
def qe_scores(
    context: dg.AssetExecutionContext,
    data_root: DataRootResource,
    torch_device: TorchDeviceResource,
    gpu_workers: GpuWorkersResource,
    qe: MetricXResource,
) -> ShardEvents:
    """MetricX-24 QE error scores (0 best, 25 worst) for every streaming segment of the shard.

    Files: `translation/qe/shard=<shard>/metricx_input.jsonl` (one line per segment: `source` =
    English, `hypothesis` = Chinese, `utt_id`, `latency`, `segment_index`, `emit_ms`),
    `metricx_output.jsonl` (the same lines plus `prediction`, as `metricx24.predict --qe` writes)
    and `scores.parquet`. Runs on a GPU worker whose model stays loaded across shards (and, on the Ray
    engine, across runs) and which reads the next shard's segments while the current one is scored:
    docs/gpu-workers.md.
    """
    job = qe_shard_job(data_root.get(), qe, torch_device)
    with gpu_workers.shard_runner(context, job) as runner:

        def one_shard(shard_id: str) -> ShardResult:
            outcome = runner.run(shard_id, on_progress=progress_logger(context, "scored", shard_id))
            return ShardResult(metadata=_qe_metadata(outcome, qe, gpu_workers.engine))

        yield from materialize_shards(context, one_shard)


def _qe_metadata(outcome: ShardOutcome, qe: MetricXResource, engine: str) -> dict:
    result: QeShardResult = outcome.result
    summary = result.summary
    device = {"device": result.device, "dtype": result.dtype}
    if result.gpu_memory_peak_gb is not None:
        device["gpu_memory_peak_gb"] = round(result.gpu_memory_peak_gb, 3)
    return {
        "dagster/row_count": summary.rows_out,
        "model": qe.identity,
        **device,
        "mean_prediction": summary.mean_prediction,
        "mean_prediction_by_level": dg.MetadataValue.json(summary.mean_prediction_by_level),
        "segments_per_second": round(summary.segments_per_second, 1),
        "compute_seconds": round(summary.compute_seconds, 3),
        "model_load_seconds": round(outcome.model_load_s, 3),
        "gpu_engine": engine,
        "gpu_worker": outcome.worker,
        "inputs_read_ahead": outcome.inputs_read_ahead,
        "input_wait_s": round(outcome.input_wait_s, 3),
        **{f"{name}_uri": dg.MetadataValue.path(uri) for name, uri in summary.outputs.items()},
    }


class StreamingPairsConfig(dg.Config):
    threshold: float = Field(DEFAULT_THRESHOLD, description="Keep segments whose MetricX error score is <= this.")


@shard_asset(deps=[qe_scores], kinds={"parquet", "json"}, code_version="streaming_pairs-v1", in_per_shard_job=False)
def streaming_pairs(
    context: dg.AssetExecutionContext, config: StreamingPairsConfig, data_root: DataRootResource
) -> ShardEvents:
    """The streaming translation pairs good enough to train on: segments whose MetricX score is <= threshold.

    Files: `translation/pairs/shard=<shard>/pairs.jsonl` and `pairs.parquet` (`utt_id`, `latency`,
    `segment_index`, `emit_ms`, `source`, `hypothesis`, `prediction`). Lower MetricX is better; the
    default threshold is 5.0. Metadata shows the kept share per latency level.
    """
    yield from materialize_shards(
        context, lambda shard_id: _pairs_one_shard(context, config, data_root.get(), shard_id)
    )


def _pairs_one_shard(
    context: dg.AssetExecutionContext, config: StreamingPairsConfig, root, shard_id: str
) -> ShardResult:
    summary = run_streaming_pairs(root, shard_id, config.threshold)
    kept = root.read_parquet(layout.streaming_pairs(shard_id))
    context.log.info(f"{shard_id}: kept {summary.kept}/{summary.scored} segments at threshold {summary.threshold}")
    return ShardResult(
        metadata={
            "dagster/row_count": summary.kept,
            "scored": summary.scored,
            "threshold": summary.threshold,
            "kept_share": round(summary.kept_share, 6),
            "kept_share_by_level": dg.MetadataValue.json(summary.kept_share_by_level),
            "max_kept_prediction": pc.max(kept["prediction"]).as_py() if kept.num_rows else None,
            **{f"{name}_uri": dg.MetadataValue.path(uri) for name, uri in summary.outputs.items()},
            "dagster/column_schema": column_schema(kept.schema),
            "preview": markdown_preview(kept, ["utt_id", "latency", "source", "hypothesis", "prediction"]),
        }
    )


# --- the group: its definitions (assembled by dagster_project/loader.py)

TRANSLATION_JOB_NAME = "translation_job"

translation_job = dg.define_asset_job(
    TRANSLATION_JOB_NAME,
    selection=dg.AssetSelection.groups(group_of(__name__)),
    description="Streaming segments, MetricX QE and filtered pairs for a shard whose LLM segmentation has landed.",
)

defs = dg.Definitions(assets=[streaming_segments, qe_scores, streaming_pairs], jobs=[translation_job])
