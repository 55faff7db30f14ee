"""[alignment] Forced alignment and the 12.5 Hz frame grid in text-token space."""

from typing import Literal

import dagster as dg
from pydantic import Field

from assets.asset_policy import shard_asset
from assets.ingest import normalized_audio
from assets.reporting import (
    column_schema,
    log_stage,
    markdown_preview,
    progress_logger,
    stage_metadata,
    utterance_check_results,
)
from assets.shard_runs import ShardEvents, ShardResult, materialize_shards
from resources.aligner import CtcAlignerResource, profile_aligner_identity
from resources.alignment_job import alignment_shard_job
from resources.gpu_workers import GpuWorkersResource
from resources.model_pins import QWEN, model_bound
from resources.storage import DataRootResource
from resources.text_tokenizer import TextTokenizerResource
from speechdata.alignment.pseudo_labels import with_text_sources
from speechdata.alignment.stage import run_alignments_from_import
from speechdata.audio.clock import SAMPLES_PER_FRAME
from speechdata.bridge.frame_grid import GRID_RULE_VERSION
from speechdata.bridge.grid_stage import run_frame_grids, verify_frame_grids
from speechdata.io import layout

UI_POSITION = 2


class AlignmentsConfig(dg.Config):
    source: Literal["nemo", "import"] = Field(
        "nemo",
        description=(
            "nemo: align with the language's NeMo CTC model. import: read alignments landed beside the shard "
            "(landing/<shard>/alignments/<utt_id>.ctm or .TextGrid)."
        ),
    )
    write_ctm: bool = Field(True, description="Also write NFA-format CTM files per utterance (nemo only).")


@shard_asset(
    deps=[normalized_audio],
    kinds={"pytorch", "parquet"},
    # The aligner that runs is part of the code version: switching profile or moving the parakeet pin
    # marks alignments (and what is built from them) stale.
    code_version=model_bound("alignments", "alignments-v4+aligner-", profile_aligner_identity),
    # The CTC model runs on the GPU when there is one: on Kubernetes the step goes to a GPU node,
    # and it shares the `gpu` pool with the feature steps.
    gpu=True,
)
def alignments(
    context: dg.AssetExecutionContext,
    config: AlignmentsConfig,
    data_root: DataRootResource,
    gpu_workers: GpuWorkersResource,
    aligner: CtcAlignerResource,
) -> ShardEvents:
    """Word and token time spans of every utterance, from NeMo CTC forced alignment (or imported).

    Files: `shards/<shard>/alignments.parquet` (`utt_id`, `level` word/token, `index`, `text`,
    `start_ms`, `end_ms`, `score`; integer ms from the start of the utterance's own audio),
    `shards/<shard>/alignment_scores.parquet` (one row per utterance: `aligner`, `score` = mean frame
    log-prob on the Viterbi path, for filtering) and NeMo Forced Aligner-format CTMs in
    `shards/<shard>/ctm/{words,tokens}/<utt_id>.ctm`. Utterances in a language with no configured
    model, with an empty transcript, or with text the model's vocabulary cannot express are in
    `shards/<shard>/rejects/alignments.parquet`. The CTC models stay loaded on their GPU worker
    across shards (and, on the Ray engine, across runs), and the worker reads the next shard's
    transcripts and audio while the current one aligns: docs/gpu-workers.md.
    """
    root = data_root.get()
    if config.source == "import":
        yield from materialize_shards(
            context,
            lambda shard_id: _shard_result(
                context, config, root, aligner, run_alignments_from_import(root, shard_id), shard_id
            ),
        )
        return
    job = alignment_shard_job(root, aligner, config.write_ctm)
    with gpu_workers.shard_runner(context, job) as runner:

        def one_shard(shard_id: str) -> ShardResult:
            outcome = runner.run(shard_id, on_progress=progress_logger(context, "aligned", shard_id))
            result = _shard_result(context, config, root, aligner, outcome.result, shard_id)
            result.metadata.update(
                {
                    "gpu_engine": gpu_workers.engine,
                    "gpu_worker": outcome.worker,
                    "inputs_read_ahead": outcome.inputs_read_ahead,
                    "input_wait_s": round(outcome.input_wait_s, 3),
                }
            )
            return result

        yield from materialize_shards(context, one_shard)


def _shard_result(
    context, config: AlignmentsConfig, root, aligner: CtcAlignerResource, summary, shard_id: str
) -> ShardResult:
    scores = root.read_parquet(layout.alignment_scores(shard_id))
    log_stage(context, summary, "aligned")
    return ShardResult(
        metadata={
            **stage_metadata(summary),
            "source": config.source,
            "models": dg.MetadataValue.json(aligner.models),
            "mean_alignment_score": round(
                sum(s or 0.0 for s in scores["score"].to_pylist()) / max(scores.num_rows, 1), 4
            ),
            "preview": markdown_preview(scores, ["utt_id", "aligner", "score", "n_words", "n_frames"]),
        }
    )


GRID_CHECKS = {
    "frames_accounted": "sum(dur) + silence frames == F for every utterance",
    "grid_monotone": "token indices along the grid never decrease",
    "frame_count_matches_audio": f"F == ceil(n_samples / {SAMPLES_PER_FRAME})",
    "token_count_matches_tokenizer": "tokens equal the tokenizer's tokens of the transcript",
}


@shard_asset(
    deps=[alignments],
    kinds={"parquet"},
    # The grid rule's version and the Qwen tokenizer's pin are part of the code version: changing
    # either marks every shard's grids stale in the UI, and a backfill of the stale set redoes them.
    code_version=model_bound("frame_grids", f"frame_grids-v1+grid-{GRID_RULE_VERSION}+tokenizer-", QWEN),
    checks=GRID_CHECKS,
)
def frame_grids(
    context: dg.AssetExecutionContext, data_root: DataRootResource, text_tokenizer: TextTokenizerResource
) -> ShardEvents:
    """The 12.5 Hz bridge grid: which text token owns each 80 ms Mimi frame, per utterance.

    File: `shards/<shard>/frame_grids.parquet`, one row per utterance with `tokens` (Qwen token ids,
    int32 [T]), `grid` (token index per frame, -1 = silence, int32 [F]), `dur` (frames per token, int32
    [T], may be 0), the token spans in ms, and counts. Rules: docs/bridge-tuples.md.
    Read it with `pyarrow.parquet.read_table` or DuckDB.
    """
    root = data_root.get()
    tokenizer = text_tokenizer.get()
    yield from materialize_shards(
        context, lambda shard_id: _grid_one_shard(context, root, tokenizer, text_tokenizer.identity, shard_id)
    )


def _grid_one_shard(context, root, tokenizer, tokenizer_identity: str, shard_id: str) -> ShardResult:
    summary = run_frame_grids(root, shard_id, tokenizer)
    table = root.read_parquet(layout.frame_grids(shard_id))
    # The text each grid spells: the landed one, or the aligner's pseudo-label where none landed.
    index = with_text_sources(
        root, shard_id, root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id", "text"])
    )
    failures = verify_frame_grids(
        table, dict(zip(index["utt_id"].to_pylist(), index["text"].to_pylist(), strict=True)), tokenizer
    )
    failed_by_check = {
        "frames_accounted": failures.frames_accounted,
        "grid_monotone": failures.monotone,
        "frame_count_matches_audio": failures.frame_count,
        "token_count_matches_tokenizer": failures.token_count,
    }
    context.log.info(
        f"{shard_id}: {summary.rows_out} grids, zero-frame tokens {summary.zero_duration_token_share:.1%}, "
        f"silence frames {summary.silence_frame_share:.1%}"
    )
    return ShardResult(
        metadata={
            **stage_metadata(summary),
            "grid_rule_version": GRID_RULE_VERSION,
            "tokenizer": tokenizer_identity,
            "tokens": summary.tokens,
            "frames": summary.frames,
            "zero_duration_token_share": round(summary.zero_duration_token_share, 6),
            "silence_frame_share": round(summary.silence_frame_share, 6),
            "dagster/column_schema": column_schema(table.schema),
            "preview": _grid_preview(table),
        },
        checks=utterance_check_results(failed_by_check),
    )


def _grid_preview(table) -> dg.MetadataValue:
    """The first utterance's grid as text: one character per frame (token index mod 10, '.' = silence)."""
    if table.num_rows == 0:
        return dg.MetadataValue.md("_no grids_")
    row = table.slice(0, 1).to_pylist()[0]
    cells = "".join("." if g == -1 else str(g % 10) for g in row["grid"])
    return dg.MetadataValue.md(
        f"**{row['utt_id']}**: {row['n_tokens']} tokens, {row['n_frames']} frames "
        f"({row['silence_frames']} silent, {row['zero_duration_tokens']} zero-frame tokens)\n\n```\n{cells}\n```"
    )


# --- the group: its definitions (assembled by dagster_project/loader.py)

defs = dg.Definitions(assets=[alignments, frame_grids])
