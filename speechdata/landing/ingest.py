"""The two ingest steps end to end: landed shard -> utterance index -> 24 kHz mono audio container.

Each step is a shard stage (``speechdata.accounting.stage``): it reads from and writes to the data root
atomically, replaces its own outputs on a re-run, and returns a summary for the caller to report.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.accounting.stage import StageSummary
from speechdata.audio import budget
from speechdata.audio.codec import DEFAULT_AUDIO_CODEC, AudioCodec, ResamplerName
from speechdata.audio.container import AUDIO_CONTAINER_SCHEMA, CONTAINER_PARQUET_OPTIONS, AudioContainerWriter
from speechdata.audio.truth import MAX_CLIPPED_SHARE
from speechdata.io import layout
from speechdata.io.faults import fault_point
from speechdata.io.storage import DataRoot
from speechdata.landing.normalize import SEGMENT_COLUMNS, normalize_shard
from speechdata.landing.normalize import STAGE as NORMALIZE_STAGE
from speechdata.landing.raw_shard import STAGE as RAW_STAGE
from speechdata.landing.raw_shard import validate_landed_shard


@dataclass(frozen=True, kw_only=True)
class RawShardsSummary(StageSummary):
    """The stage's summary, with the utterance index it wrote."""

    index: pa.Table


def run_raw_shards(data_root: DataRoot, shard_id: str) -> RawShardsSummary:
    """Validate ``landing/<shard_id>``, write its utterance index and ``raw_shards`` rejects."""
    started = time.perf_counter()
    validation = validate_landed_shard(data_root, shard_id)
    data_root.write_parquet(layout.utterance_index(shard_id), validation.index)
    data_root.write_parquet(layout.rejects(shard_id, RAW_STAGE), rejects_table(validation.rejects))
    return RawShardsSummary(
        shard_id=shard_id,
        rows_in=validation.landed_rows,
        rows_out=validation.index.num_rows,
        rejects=validation.rejects,
        audio_seconds=validation.hours * 3600.0,
        compute_seconds=time.perf_counter() - started,
        outputs={
            "index": data_root.uri(layout.utterance_index(shard_id)),
            "rejects": data_root.uri(layout.rejects(shard_id, RAW_STAGE)),
        },
        index=validation.index,
    )


def run_normalized_audio(
    data_root: DataRoot,
    shard_id: str,
    *,
    workers: int = 1,
    resampler: ResamplerName = "soxr",
    codec: AudioCodec = DEFAULT_AUDIO_CODEC,
    on_progress: Callable[[int, int], None] | None = None,
    max_clipped_share: float = MAX_CLIPPED_SHARE,
) -> StageSummary:
    """Decode, cut, downmix and resample every indexed utterance into the shard's audio container.

    Utterances without signal (NaN, digital silence, channels cancelling in the downmix) and those
    with more than ``max_clipped_share`` of their samples at full scale are rejects
    (:mod:`speechdata.audio.truth`); memory is bounded whatever the shard's size
    (:mod:`speechdata.landing.normalize`).
    """
    started = time.perf_counter()
    index = data_root.read_parquet(layout.utterance_index(shard_id), columns=list(SEGMENT_COLUMNS))
    rejects: list[Reject] = []
    with data_root.parquet_writer(
        layout.normalized_audio(shard_id), AUDIO_CONTAINER_SCHEMA, **CONTAINER_PARQUET_OPTIONS
    ) as parquet:
        # Past the whole-decode budget an utterance was normalized in streamed chunks (landing.long_form).
        container = AudioContainerWriter(parquet, max_utterance_s=budget.MAX_LONG_FORM_SECONDS)
        for item in normalize_shard(
            data_root,
            shard_id,
            index,
            workers=workers,
            resampler=resampler,
            codec=codec,
            on_progress=on_progress,
            max_clipped_share=max_clipped_share,
        ):
            if isinstance(item, Reject):
                rejects.append(item)
            else:
                container.add(item)
                fault_point("ingest")  # a kill here leaves a half-written temp beside audio_24k.parquet
        container.flush()
    data_root.write_parquet(layout.rejects(shard_id, NORMALIZE_STAGE), rejects_table(rejects))
    return StageSummary(
        shard_id=shard_id,
        rows_in=index.num_rows,
        rows_out=container.rows,
        rejects=rejects,
        audio_seconds=container.audio_seconds,
        compute_seconds=time.perf_counter() - started,
        outputs={
            "audio": data_root.uri(layout.normalized_audio(shard_id)),
            "rejects": data_root.uri(layout.rejects(shard_id, NORMALIZE_STAGE)),
        },
    )
