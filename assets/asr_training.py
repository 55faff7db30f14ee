"""[asr_training] 16 kHz FLAC per utterance and the ASR fine-tuning manifests."""

import dagster as dg
import pyarrow as pa
from pydantic import Field

from assets.asset_policy import group_asset, shard_asset
from assets.ingest import raw_shards
from assets.quality import quality_decisions
from assets.reporting import (
    accounting_check,
    column_schema,
    markdown_preview,
    markdown_rows,
    progress_logger,
    stage_metadata,
    unbalanced_ledger_failure,
)
from assets.shard_runs import ShardEvents, ShardResult, materialize_shards
from resources.storage import DataRootResource
from speechdata.accounting.ledger_gate import UnbalancedLedger, require_balanced
from speechdata.accounting.ledgers import produced_utterances
from speechdata.asr.flac import run_asr_flac
from speechdata.asr.incremental import arrow_schema
from speechdata.asr.manifest import AsrManifestConfig
from speechdata.asr.manifest_rows import MANIFEST_SCHEMA
from speechdata.asr.stage import build_and_write_asr_manifests
from speechdata.bridge.segments import SEGMENT_KEY_SEPARATOR
from speechdata.io import layout
from speechdata.quality.decisions import excluded_utterances
from speechdata.quality.trims import kept_spans

UI_POSITION = 8
FLAC_ACCOUNTED = "every_indexed_utterance_extracted_or_rejected"
NO_RECORDING_LEAKS = "no_recording_in_two_splits"


@shard_asset(
    deps=[raw_shards, quality_decisions],
    kinds={"flac", "parquet"},
    code_version="asr_flac-v4",
    checks={FLAC_ACCOUNTED: "Every utterance of the index has a FLAC file or an asr_flac reject."},
)
def asr_flac(context: dg.AssetExecutionContext, data_root: DataRootResource) -> ShardEvents:
    """The shard's utterances as 16 kHz mono 16-bit FLAC files, the files ASR training reads.

    Files: `asr/flac/<shard>/<utt_id>-<sha16>.flac` (named by the SHA-1 of the PCM), the index `shards/<shard>/asr_flac.parquet` (`utt_id`,
    `flac_path`, `n_samples`, `duration_s`, `audio_sha1` of the PCM, used for deduplication) and
    `shards/<shard>/rejects/asr_flac.parquet`. A landed tar is audited before anything is read: members
    with `..` or absolute names, links and devices are never read or written, and are listed here
    (`unsafe_tar_members`); an utterance that points at one is rejected with the reason. A long
    recording the aligner cut into segments is one FLAC per segment (`<utt_id>+<index>`, `text` = its
    words), each read by seeking in the landed file; one past the whole-decode budget without segments
    is rejected `audio_over_memory_budget` (not aligned).
    """
    yield from materialize_shards(context, lambda shard_id: _extract_one_shard(context, data_root, shard_id))


def _extract_one_shard(context: dg.AssetExecutionContext, data_root: DataRootResource, shard_id: str) -> ShardResult:
    root = data_root.get()
    summary = run_asr_flac(
        root,
        shard_id,
        on_progress=progress_logger(context, "extracted", shard_id),
        excluded=excluded_utterances(root, shard_id, "asr"),
        kept_spans=kept_spans(root, shard_id, "asr"),
    )
    unsafe = summary.unsafe_members
    for member in unsafe:
        context.log.warning(f"{shard_id}: unsafe tar member not read: {member.reason}: {member.detail}")
    return ShardResult(
        metadata={
            **stage_metadata(summary),
            "sample_rate": 16_000,
            "long_recording_segments": summary.segments,
            "unsafe_tar_members": len(unsafe),
            "unsafe_tar_member_examples": dg.MetadataValue.json(
                [{"member": m.name, "reason": m.reason} for m in unsafe[:10]]
            ),
        },
        checks=accounting_check(
            FLAC_ACCOUNTED,
            summary,
            "indexed",
            "extracted",
            # A segment of a long recording that could not be cut is a reject of its own key; the
            # recording is accounted for by its other segments, or by a reject under its own id.
            rejected=len({r.utt_id for r in summary.rejects if SEGMENT_KEY_SEPARATOR not in r.utt_id}),
        ),
    )


class AsrManifestAssetConfig(dg.Config):
    min_duration_s: float = Field(0.5, description="Shorter utterances are removed (reason duration_out_of_range).")
    max_duration_s: float = Field(20.0, description="Longer ones too: the sampler's last bucket is 16-20 s.")
    min_quality: float | None = Field(
        None, description="Minimum of `quality_column`; null quality fails it. None: no filter."
    )
    quality_column: str = Field(
        "tx_quality_score", description="The utterance-index column holding the transcript quality."
    )
    validation_share: float = Field(0.05, description="Share of recordings (not utterances) in the validation split.")
    split_salt: str = Field("asr-split-v1", description="Changing it reshuffles which recordings are held out.")
    eval_per_language: int = Field(10, description="Utterances per language in the eval subset of validation.")
    language_corrections: str | None = Field(
        None,
        description="Corrections table (parquet or csv; path under the data root or URL). "
        "None: asr/language_corrections.parquet if it exists.",
    )
    combined_files: bool = Field(
        False,
        description="Also write the corpus-wide train/validation/removed files, a streamed concatenation of the "
        "per-shard parts whose cost grows with the corpus (skipped when nothing changed). Default: the parts under "
        "asr/manifests/parts/ are the manifests, so a new shard costs the same at any corpus size.",
    )


@group_asset(
    deps=[asr_flac],
    kinds={"parquet", "polars"},
    code_version="asr_manifest-v4",
    checks={NO_RECORDING_LEAKS: "No recording has utterances in both train and validation."},
)
def asr_manifest(
    context: dg.AssetExecutionContext, config: AsrManifestAssetConfig, data_root: DataRootResource
) -> dg.MaterializeResult:
    """The ASR fine-tuning manifests (`v2` layout) over every shard with extracted FLAC.

    Files under `asr/manifests/`: `train`, `validation` and `eval` (N per language from validation)
    as `.parquet` (`utt_id`, `shard_id`, `text` = `<|lang|> cleaned transcript`, `duration`, `lang`,
    `audio_filepath`, `recording_id`, `original_language`, ...) and NeMo `.jsonl` (`audio_filepath`,
    `duration`, `text`, `lang`); `removed.parquet` holds every utterance left out and the filter that
    removed it. Language tags are corrected from the corrections table, duplicates (same audio, or
    same text and duration in one recording) removed, and the split is by recording.
    Train with `speechdata.asr.dataset.AsrManifestDataset` and `DurationBucketBatchSampler`.
    Incremental: only the shards whose inputs changed since the last run are read and have their
    `asr` ledger checked; only the shards whose rows' decisions can change get their per-shard parts
    (`asr/manifests/parts/<split>/<shard>.{parquet,jsonl}`) rewritten; the corpus-wide files are
    concatenated from the parts. Nothing is written while a changed shard's `asr` ledger does not
    balance: the run fails naming the shard and its unaccounted utterances, and the previous
    manifests stay.
    """
    root = data_root.get()

    def gate(shard_id: str) -> None:
        require_balanced(root, shard_id, "asr", produced_utterances(root, shard_id, "asr") or set())

    try:
        summary = build_and_write_asr_manifests(
            root,
            AsrManifestConfig(
                min_duration_s=config.min_duration_s,
                max_duration_s=config.max_duration_s,
                min_quality=config.min_quality,
                validation_share=config.validation_share,
                split_salt=config.split_salt,
                eval_per_language=config.eval_per_language,
            ),
            quality_column=config.quality_column,
            corrections_location=config.language_corrections,
            gate=gate,
            combined=config.combined_files,
        )
    except UnbalancedLedger as exc:
        raise unbalanced_ledger_failure(exc) from exc
    totals = summary.totals
    hours = totals.hours_by_language_and_split()
    context.log.info(
        f"{summary.shards} shards ({len(summary.shards_changed)} changed, {len(summary.shards_rewritten)} rewritten), "
        f"{summary.input_rows} utterances -> train {totals.train_rows}, validation {totals.validation_rows}, "
        f"removed {totals.removed_by_reason}"
    )
    train_hours = sum(h for _, h in totals.hours.get("train", {}).values())
    validation_hours = sum(h for _, h in totals.hours.get("validation", {}).values())
    preview = _preview_part(root, summary.shards_rewritten)
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": totals.train_rows + totals.validation_rows,
            "flacs_removed": summary.flacs_removed,
            "shards": summary.shards,
            "shards_changed": len(summary.shards_changed),
            "shards_rewritten": len(summary.shards_rewritten),
            "utterances_in": summary.input_rows,
            "train_rows": totals.train_rows,
            "validation_rows": totals.validation_rows,
            "eval_rows": totals.eval_rows,
            "hours_train": round(float(train_hours), 6),
            "hours_validation": round(float(validation_hours), 6),
            "hours_by_language_and_split": markdown_rows(hours.to_dicts()),
            "removed_by_reason": dg.MetadataValue.json(totals.removed_by_reason),
            "languages_relabeled": dg.MetadataValue.json(totals.relabeled),
            "compute_seconds": round(summary.compute_seconds, 3),
            "empty_splits": dg.MetadataValue.json(totals.empty_splits),
            "validation_recording_forced": totals.forced_validation or "",
            **{f"{name}_uri": dg.MetadataValue.path(uri) for name, uri in summary.outputs.items()},
            "dagster/column_schema": column_schema(arrow_schema(MANIFEST_SCHEMA)),
            "preview": markdown_preview(preview, ["utt_id", "lang", "duration", "text"]),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name=NO_RECORDING_LEAKS,
                passed=totals.recordings_in_both_splits == 0,
                metadata={"recordings_in_both_splits": totals.recordings_in_both_splits},
            )
        ],
    )


def _preview_part(root, shard_ids: list[str]) -> pa.Table:
    """The first rewritten shard's train rows (the corpus-wide file is not read for a preview)."""
    for shard_id in shard_ids:
        part = layout.asr_manifest_part("train", shard_id)
        if root.exists(part):
            return root.read_parquet(part)
    return arrow_schema(MANIFEST_SCHEMA).empty_table()


# --- the group: its definitions (assembled by dagster_project/loader.py)

defs = dg.Definitions(assets=[asr_flac, asr_manifest])
