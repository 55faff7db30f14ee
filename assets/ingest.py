"""[ingest] A landed shard, checked against the contract, and its audio at 24 kHz mono."""

from typing import Literal

import dagster as dg
from pydantic import Field

from assets.asset_policy import shard_asset
from assets.partitions import PER_SHARD_JOB_NAME, PER_SHARD_SELECTION
from assets.reporting import (
    accounting_check,
    column_schema,
    markdown_histogram,
    markdown_preview,
    progress_logger,
    rejects_sample,
    stage_metadata,
)
from assets.shard_runs import ShardEvents, ShardFailure, ShardResult, materialize_shards
from resources.storage import DataRootResource
from speechdata.audio.clock import SAMPLE_RATE
from speechdata.audio.codec import DEFAULT_AUDIO_CODEC
from speechdata.landing.contract import ContractError
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards

UI_POSITION = 1
"""Where the UI lists this group: the pipeline's order, from landing to publishing."""

RAW_SHARDS_ACCOUNTED = "every_landed_row_accounted_for"
AUDIO_ACCOUNTED = "every_indexed_utterance_normalized_or_rejected"


@shard_asset(
    kinds={"parquet"},
    code_version="raw_shards-v1",
    checks={RAW_SHARDS_ACCOUNTED: "Utterances in the index + rejected rows == rows in metadata.parquet."},
)
def raw_shards(context: dg.AssetExecutionContext, data_root: DataRootResource) -> ShardEvents:
    """The shard's utterance index: every landed utterance that meets the landing contract.

    Files: `shards/<shard>/utterances.parquet` (contract columns, extra columns carried through, and
    the probed audio header: `source_sample_rate`, `source_channels`, `source_frames`,
    `segment_start_s`, `segment_end_s`, `duration_s`) and `shards/<shard>/rejects/raw_shards.parquet`
    (`utt_id`, `stage`, `reason`, `detail`) for the rows that do not. A shard whose metadata is
    unusable (missing file, missing or mistyped column) fails with the file, column and rule.
    """
    yield from materialize_shards(context, lambda shard_id: _raw_shard(context, data_root, shard_id))


def _raw_shard(context: dg.AssetExecutionContext, data_root: DataRootResource, shard_id: str) -> ShardResult:
    try:
        summary = run_raw_shards(data_root.get(), shard_id)
        index = summary.index
    except ContractError as exc:
        raise _contract_breach(shard_id, exc) from exc
    context.log.info(
        f"{shard_id}: {summary.rows_out}/{summary.rows_in} utterances indexed, "
        f"{len(summary.rejects)} rejected {summary.rejects_by_reason}, {summary.hours:.3f} h"
    )
    return ShardResult(
        metadata={
            **stage_metadata(summary),
            "dagster/column_schema": column_schema(index.schema),
            "preview": markdown_preview(
                index, ["utt_id", "language", "country", "source_format", "source_sample_rate", "duration_s", "text"]
            ),
            # country_dataset_sensor reads this to refresh only the countries this shard feeds.
            "countries": dg.MetadataValue.json(sorted({c for c in index["country"].to_pylist() if c})),
            "rejects_sample": rejects_sample(summary.rejects),
            "duration_s_histogram": markdown_histogram(index["duration_s"].to_pylist(), "duration_s"),
        },
        checks=accounting_check(RAW_SHARDS_ACCOUNTED, summary, "landed", "indexed"),
    )


def _contract_breach(shard_id: str, exc: ContractError) -> ShardFailure:
    """The one reason a shard cannot be indexed, where people look first: the run's failure message,
    its metadata (shard, file, field, rule) and the shard's own check, each saying the same."""
    reason = {"file": exc.file, "field": exc.column or "", "rule": exc.rule}
    description = f"Shard {shard_id!r} breaks the landing contract: {exc}"
    return ShardFailure(
        shard_id,
        description=description,
        # `column` as well: the key the contract's own errors use (docs/landing-contract.md).
        metadata={**reason, "column": exc.column or ""},
        checks=[
            dg.AssetCheckResult(
                check_name=RAW_SHARDS_ACCOUNTED,
                passed=False,
                description=description,
                metadata={"shard": shard_id, "landing_contract": str(exc), "column": exc.column or "", **reason},
            )
        ],
    )


class NormalizedAudioConfig(dg.Config):
    workers: int = Field(0, description="Decoding processes; 0 = one per CPU core.")
    resampler: Literal["soxr", "torchaudio"] = Field(
        "soxr", description="soxr HQ is faster or equal at every common rate and sharper (README, Resampling)."
    )
    codec: Literal["flac16", "flac24", "pcm16"] = Field(
        DEFAULT_AUDIO_CODEC,
        description="pcm16: no encoding or decoding CPU; flac16/flac24: lossless, fewer bytes. flac16 and pcm16 "
        "give identical downstream products (docs/performance.md, Ingest).",
    )


@shard_asset(
    deps=[raw_shards],
    kinds={"parquet"},
    code_version="normalized_audio-v4",
    checks={AUDIO_ACCOUNTED: "Every utterance of the index is in the audio container or in the rejects."},
)
def normalized_audio(
    context: dg.AssetExecutionContext, config: NormalizedAudioConfig, data_root: DataRootResource
) -> ShardEvents:
    """The shard's audio at 24 kHz mono (Mimi's rate), cut to each utterance's segment.

    File: `shards/<shard>/audio_24k.parquet`, one row per utterance: `utt_id`, `sample_rate`,
    `n_samples`, `duration_s`, `codec` and `audio` (16-bit PCM bytes by default). Read it with
    `speechdata.audio.container.iter_container_audio`, or any parquet reader plus soundfile.
    Utterances that cannot be decoded are in `shards/<shard>/rejects/normalized_audio.parquet`.
    """

    def one_shard(shard_id: str) -> ShardResult:
        summary = run_normalized_audio(
            data_root.get(),
            shard_id,
            workers=config.workers,
            resampler=config.resampler,
            codec=config.codec,
            on_progress=progress_logger(context, "normalized", shard_id),
        )
        return _normalized_shard(context, shard_id, summary)

    yield from materialize_shards(context, one_shard)


def _normalized_shard(context: dg.AssetExecutionContext, shard_id: str, summary) -> ShardResult:
    context.log.info(
        f"{shard_id}: {summary.rows_out} utterances, {summary.hours:.3f} h at "
        f"{summary.audio_seconds_per_second:.0f} audio s/s, {len(summary.rejects)} rejected"
    )
    return ShardResult(
        metadata={**stage_metadata(summary), "sample_rate": SAMPLE_RATE},
        checks=accounting_check(AUDIO_ACCOUNTED, summary, "indexed", "normalized"),
    )


# --- the group: its definitions (assembled by dagster_project/loader.py)

per_shard_job = dg.define_asset_job(
    PER_SHARD_JOB_NAME,
    selection=PER_SHARD_SELECTION,
    description="Everything one shard feeds, from its landing validation on. Launched by landing_sensor.",
)

defs = dg.Definitions(assets=[raw_shards, normalized_audio], jobs=[per_shard_job])
