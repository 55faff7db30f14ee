"""[vad] Speech segments per shard and the language -> shards index the VAD-chunked loader reads."""

import dagster as dg
from pydantic import Field

from assets.asset_policy import group_asset, shard_asset
from assets.ingest import raw_shards
from assets.partitions import language_partitions
from assets.reporting import column_schema, markdown_preview, progress_logger, stage_metadata
from assets.shard_runs import ShardEvents, ShardResult, materialize_shards
from resources.storage import DataRootResource
from resources.vad import SileroVadResource
from speechdata.io import layout
from speechdata.vad.chunks import DEFAULT_CHUNK_S, DEFAULT_NUM_CHUNKS
from speechdata.vad.language_index import LANGUAGE_INDEX_SCHEMA, update_language_shard_index
from speechdata.vad.stage import run_vad_segments
from speechdata.vad.tar_retention import remove_unreferenced_packed_tars

UI_POSITION = 9

VAD_ACCOUNTED = "every_indexed_utterance_segmented_or_rejected"


class ChunkingConfig(dg.Config):
    chunk_s: float = Field(DEFAULT_CHUNK_S, description="Chunk length the loader cuts (for the usable-hours figures).")
    num_chunks: int = Field(DEFAULT_NUM_CHUNKS, description="Most chunks the loader takes per file.")


@shard_asset(
    deps=[raw_shards],
    kinds={"parquet", "pytorch"},
    code_version="vad_segments-v2",
    checks={VAD_ACCOUNTED: "Every utterance of the index has its file in the segments table or is rejected."},
)
def vad_segments(
    context: dg.AssetExecutionContext, config: ChunkingConfig, data_root: DataRootResource, vad: SileroVadResource
) -> ShardEvents:
    """Where the speech is in every audio file of the shard, for the VAD-chunked training loader.

    File: `shards/<shard>/vad_segments.parquet`, one row per audio file: `audio_path`, `language`,
    `utt_ids`, `duration_s`, `speech_s`, `start_s`/`end_s` (lists, seconds from the file's start),
    `segments_source` (`silero`, or `import` when the shard landed `vad_segments.parquet`), and the
    tar the loader streams (`tar_path`, `tar_key`) with the SHA-1 of the file's bytes (`audio_sha1`).
    Segments come from Silero VAD at 16 kHz (thresholds on the `vad` resource). A shard that landed an
    `audio/` directory gets it packed, bytes untouched, into `shards/<shard>/audio-<sha16>.tar`. Undecodable files: `shards/<shard>/rejects/vad_segments.parquet`.
    """
    root = data_root.get()
    model = vad.model()
    yield from materialize_shards(
        context, lambda shard_id: _segment_one_shard(context, config, root, vad, model, shard_id)
    )


def _segment_one_shard(
    context, config: ChunkingConfig, root, vad: SileroVadResource, model, shard_id: str
) -> ShardResult:
    summary = run_vad_segments(
        root,
        shard_id,
        model,
        vad.params(),
        batch_files=vad.batch_files,
        on_progress=progress_logger(context, "segmented files of", shard_id),
    )
    table = summary.table
    files = table.num_rows
    covered = {u for ids in table["utt_ids"].to_pylist() for u in ids} | {r.utt_id for r in summary.rejects}
    index_ids = set(root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id"])["utt_id"].to_pylist())
    audio_s, speech_s = summary.audio_seconds, summary.speech_seconds
    context.log.info(
        f"{shard_id}: {files} files, {audio_s / 3600:.3f} h, speech share {speech_s / max(audio_s, 1e-9):.3f}, "
        f"{len(summary.rejects)} utterances rejected, {audio_s / max(summary.compute_seconds, 1e-9):.0f} audio s/s"
    )
    return ShardResult(
        metadata={
            **stage_metadata(summary),
            "dagster/row_count": files,
            "speech_hours": round(speech_s / 3600.0, 6),
            "speech_share": round(speech_s / audio_s, 4) if audio_s else 0.0,
            "segments_per_file": round(sum(table["n_segments"].to_pylist()) / files, 3) if files else 0.0,
            "files_with_no_speech": sum(1 for n in table["n_segments"].to_pylist() if n == 0),
            "imported_files": summary.imported_files,
            "dropped_imported_segments": summary.dropped_imported_segments,
            "files_not_streamable": summary.files_not_streamable,
            "usable_chunk_hours_by_language": dg.MetadataValue.json(
                summary.usable_chunk_hours_by_language(config.chunk_s, config.num_chunks)
            ),
            "vad_params": dg.MetadataValue.json({k: str(v) for k, v in vad.params().as_dict().items()}),
            "dagster/column_schema": column_schema(table.schema),
            "preview": markdown_preview(
                table, ["audio_path", "language", "duration_s", "speech_s", "n_segments", "segments_source"]
            ),
        },
        checks=[
            dg.AssetCheckResult(
                check_name=VAD_ACCOUNTED,
                passed=index_ids <= covered,
                metadata={"indexed": len(index_ids), "unaccounted": len(index_ids - covered)},
            )
        ],
    )


@group_asset(
    deps=[dg.AssetDep(vad_segments, partition_mapping=dg.AllPartitionMapping())],
    partitions_def=language_partitions,
    kinds={"parquet", "duckdb"},
    code_version="language_shard_index-v2",
)
def language_shard_index(
    context: dg.AssetExecutionContext, config: ChunkingConfig, data_root: DataRootResource
) -> dg.MaterializeResult:
    """Which shards (and which tars and files in them) hold this language: what
    `speechdata.vad.language_index.build_urls(langs, data_root)` answers from.

    Files: `language_index/language=<lang>/shard-<shard>.parquet`, one per shard holding the
    language, one row per tar: `tar_path` (the tar the loader streams), `files`, `streamable_files`,
    `tar_keys`, `hours`, `speech_hours` and `usable_chunk_hours` (what the loader yields per epoch at
    `chunk_s`/`num_chunks`); `_state/language_index/language=<lang>.parquet` records the version of
    each shard's inputs its part was built from. Only the shards whose `vad_segments` or ledger
    inputs changed since the last run are read and have their `vad` ledger checked; re-materialize
    (or backfill all languages) after new shards are segmented.
    """
    language = context.partition_key
    root = data_root.get()
    update = update_language_shard_index(root, language, chunk_s=config.chunk_s, num_chunks=config.num_chunks)
    # Tars the changed shards' earlier parts named, if no other table names them.
    remove_unreferenced_packed_tars(root, update.shards_changed)
    total = update.totals
    context.log.info(
        f"{language}: {update.shards} shards, {total['files']} files, {total['usable_chunk_hours']:.3f} usable chunk "
        f"hours; {len(update.shards_checked)} shards changed"
    )
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": update.shards,
            "files": total["files"],
            "streamable_files": total["streamable_files"],
            "hours": round(total["hours"], 6),
            "speech_hours": round(total["speech_hours"], 6),
            "usable_chunk_hours": round(total["usable_chunk_hours"], 6),
            "shards_checked": len(update.shards_checked),
            "parts_written": len(update.parts_written),
            "parts_removed": len(update.parts_removed),
            "index_uri": dg.MetadataValue.path(root.uri(layout.language_shard_index_dir(language))),
            "dagster/column_schema": column_schema(LANGUAGE_INDEX_SCHEMA),
            "preview": markdown_preview(update.written, ["shard", "tar_path", "files", "hours", "usable_chunk_hours"]),
        }
    )


# --- the group: its definitions (assembled by dagster_project/loader.py)

defs = dg.Definitions(assets=[vad_segments, language_shard_index])
