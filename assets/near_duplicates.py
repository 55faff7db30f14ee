"""[near_duplicates] Copies across the whole corpus: the same recording landed twice (re-encoded,
trimmed, gain-changed, resampled) or the same transcript under other audio."""

import time
from typing import Literal

import dagster as dg
from pydantic import Field

from assets.asset_policy import shard_asset
from assets.ingest import normalized_audio
from assets.partitions import shard_partitions
from assets.reporting import column_schema, markdown_rows, stage_metadata
from assets.shard_runs import ShardEvents, ShardResult, materialize_shards, run_ended_in
from resources.storage import DataRootResource
from speechdata.quality.near_dup_batch import (
    DEFAULT_PARTITIONS,
    run_near_duplicates_batch,
    select_shards,
    shards_with_audio,
)
from speechdata.quality.near_dup_batch_ray import IN_PROCESS, LOCAL, RAY_ADDRESS_ENV, batch_engine
from speechdata.quality.near_dup_candidates import AudioKeyLoad
from speechdata.quality.near_dup_compaction import compact_pending
from speechdata.quality.near_dup_index import DEFAULT_LOCK_TIMEOUT_S, CorpusIndexBusy
from speechdata.quality.near_dup_matching import FLAG_KINDS, KINDS, NearDuplicateThresholds
from speechdata.quality.near_duplicates import (
    COLUMN_DESCRIPTIONS,
    NEAR_DUPLICATES_SCHEMA,
    NearDuplicatesSummary,
    recall_warning,
    run_near_duplicates,
)

UI_POSITION = 26

SAMPLE_PAIRS = 20
"""Pairs shown in the materialization's sample table."""

_DEFAULTS = NearDuplicateThresholds()


class NearDuplicatesConfig(dg.Config):
    max_bit_error_rate: float = Field(
        _DEFAULTS.max_bit_error_rate,
        description="near_audio: most fingerprint bits that may differ over the aligned overlap (chance is 0.5).",
    )
    min_overlap_share: float = Field(
        _DEFAULTS.min_overlap_share, description="near_audio: least share of the shorter utterance the overlap covers."
    )
    min_duration_ratio: float = Field(
        _DEFAULTS.min_duration_ratio,
        description="near_audio: least shorter/longer duration ratio (a clip of a long recording is not a copy).",
    )
    min_offset_votes: int = Field(
        _DEFAULTS.min_offset_votes, description="near_audio: sub-fingerprints agreeing on an offset before verifying."
    )
    min_transcript_jaccard: float = Field(
        _DEFAULTS.min_transcript_jaccard,
        description="near_transcript: least estimated Jaccard similarity of the transcripts' character 5-grams.",
    )
    min_transcript_words: int = Field(
        _DEFAULTS.min_transcript_words, description="near_transcript: shorter transcripts are never compared."
    )
    check_transcripts: bool = Field(_DEFAULTS.check_transcripts, description="False: only audio makes a duplicate.")
    same_speaker_min_cosine: float = Field(
        _DEFAULTS.same_speaker_min_cosine,
        description="near_transcript: least speaker-embedding cosine for one speaker; less is an "
        "other_speaker_reading (kept).",
    )
    max_new_speech_seconds: float = Field(
        _DEFAULTS.max_new_speech_seconds,
        description="Containment: more speech than this outside an earlier utterance is new speech (never a copy).",
    )
    min_contained_seconds: float = Field(
        _DEFAULTS.min_contained_seconds, description="Containment: least speech of a contained clip, seconds."
    )
    min_envelope_correlation: float = Field(
        _DEFAULTS.min_envelope_correlation, description="shifted_audio: least loudness-envelope correlation."
    )
    min_shape_correlation: float = Field(
        _DEFAULTS.min_shape_correlation, description="shifted_audio: least spectral-shape correlation (best shift)."
    )
    max_tempo_change: float = Field(
        _DEFAULTS.max_tempo_change, description="shifted_audio: most ratio of the two speech spans' durations."
    )
    lock_timeout_s: float = Field(
        DEFAULT_LOCK_TIMEOUT_S,
        description="Longest wait for the corpus index's lock, or for shards reserved before this one to commit.",
    )

    def thresholds(self) -> NearDuplicateThresholds:
        return NearDuplicateThresholds(
            max_bit_error_rate=self.max_bit_error_rate,
            min_overlap_share=self.min_overlap_share,
            min_duration_ratio=self.min_duration_ratio,
            min_offset_votes=self.min_offset_votes,
            min_transcript_jaccard=self.min_transcript_jaccard,
            min_transcript_words=self.min_transcript_words,
            check_transcripts=self.check_transcripts,
            same_speaker_min_cosine=self.same_speaker_min_cosine,
            max_new_speech_seconds=self.max_new_speech_seconds,
            min_contained_seconds=self.min_contained_seconds,
            min_envelope_correlation=self.min_envelope_correlation,
            min_shape_correlation=self.min_shape_correlation,
            max_tempo_change=self.max_tempo_change,
        )


@shard_asset(deps=[normalized_audio], kinds={"parquet"}, code_version="near_duplicates-v2")
def near_duplicates(
    context: dg.AssetExecutionContext, config: NearDuplicatesConfig, data_root: DataRootResource
) -> ShardEvents:
    """The shard's utterances that copy an utterance indexed before them, anywhere in the corpus: the
    quality filter rejects each as `near_duplicate` in every product, and keeps the representative.

    File: `shards/<shard>/near_duplicates.parquet`: `utt_id`, `representative_shard`,
    `representative_utt` (the copy indexed first), `kind` (`exact_audio`, `near_audio`,
    `contained_audio`, `shifted_audio`, `near_transcript`) and `similarity` (0-1); no rows when the
    shard copies nothing. Beside it `near_duplicate_flags.parquet`: utterances kept though they match an
    earlier one (`other_speaker_reading`, `contains_earlier`). The shard is
    then added to the corpus index (`index/near_duplicates/`), which later shards are checked
    against; re-running a shard gives the same rows (docs/near-duplicates.md).
    """
    root = data_root.get()
    run_id = context.run.run_id

    def one_shard(shard_id: str) -> ShardResult:
        summary = run_near_duplicates(
            root,
            shard_id,
            config.thresholds(),
            lock_timeout_s=config.lock_timeout_s,
            run_id=run_id,
            holder_finished=lambda holder: bool(holder.run_id) and run_ended_in(context)(holder.run_id),
        )
        return _near_duplicates_result(context, summary)

    yield from materialize_shards(context, one_shard)


def _near_duplicates_result(context: dg.AssetExecutionContext, summary: NearDuplicatesSummary) -> ShardResult:
    by_kind = summary.by_kind
    context.log.info(
        f"{summary.shard_id}: {len(summary.duplicates)}/{summary.rows_out} utterances copy an earlier one {by_kind}, "
        f"checked against {summary.indexed_before} indexed utterances, index position {summary.index_position}"
        + (f", {len(summary.unchecked)} unchecked (not decodable or too long)" if summary.unchecked else "")
    )
    for line in summary.repairs:
        context.log.warning(f"{summary.shard_id}: repaired the near-duplicate index: {line}")
    recall_warning = summary.recall_warning()
    if recall_warning is not None:
        context.log.warning(recall_warning)
    if not summary.index_locked:
        context.log.warning(
            "the data root's store has no exclusive create (only local folders and S3 do): the corpus index "
            "was updated without its locks; run near_duplicates one step at a time there (docs/near-duplicates.md)"
        )
    pairs = [
        {
            "utt_id": d.utt_id,
            "kind": d.kind,
            "similarity": d.similarity,
            "matched": f"{d.matched_shard}/{d.matched_utt}",
            "representative": f"{d.representative_shard}/{d.representative_utt}",
        }
        for d in summary.duplicates[:SAMPLE_PAIRS]
    ]
    return ShardResult(
        metadata={
            **stage_metadata(summary),
            "dagster/row_count": len(summary.duplicates),
            "utterances_checked": summary.rows_out,
            **{f"duplicates_{kind}": by_kind[kind] for kind in KINDS},
            "duplicates_by_kind": dg.MetadataValue.json(by_kind),
            **{f"flags_{kind}": by_kind[kind] for kind in FLAG_KINDS},
            "pairs_sample": markdown_rows(pairs) if pairs else dg.MetadataValue.md("_no duplicates_"),
            "index_position": summary.index_position,
            "indexed_utterances_before": summary.indexed_before,
            "unchecked": dg.MetadataValue.json({u.utt_id: u.detail for u in summary.unchecked[:SAMPLE_PAIRS]}),
            "index_repairs": dg.MetadataValue.json(summary.repairs),
            "index_postings_read": summary.postings_read,
            "index_entries_read": summary.entries_read,
            **key_load_metadata(summary.audio_key_load),
            "dagster/column_schema": column_schema(NEAR_DUPLICATES_SCHEMA, COLUMN_DESCRIPTIONS),
        }
    )


def key_load_metadata(load: AudioKeyLoad) -> dict[str, int | float]:
    """What the fixed per-key cap kept out of the shard's audio vote: it grows with the corpus
    (docs/deploying.md, "Near duplicates past N hours")."""
    return {
        "audio_keys_looked_up": load.keys,
        "audio_keys_past_cap": load.keys_past_cap,
        "audio_keys_past_cap_share": round(load.share_past_cap, 6),
        "utterances_no_audio_key_voting": load.utterances_silenced,
    }


# --- the whole-corpus batch pass (docs/near-duplicates.md, "Whole-corpus batch pass")

BATCH_JOB_NAME = "near_duplicates_batch_job"
PROGRESS_EVERY_S = 10.0


class NearDuplicatesBatchConfig(NearDuplicatesConfig):
    shards: list[str] = Field(
        default_factory=list,
        description="Shard ids to decide, in the order new ones are indexed; empty: every registered shard "
        "with normalized audio (matching `matching`), in registration order.",
    )
    matching: str | None = Field(None, description="Glob on shard ids, used when `shards` is empty.")
    signals_from: Literal["audio", "index"] = Field(
        "audio",
        description="index: indexed shards reuse their stored signals (a threshold change, audio unchanged).",
    )
    ray_address: str = Field(
        "",
        description=f"Ray cluster: auto, <head>:6379, ray://<head>:10001, {LOCAL} (a Ray instance in the step) or "
        f"{IN_PROCESS} (no Ray); empty: ${RAY_ADDRESS_ENV}, else {LOCAL}.",
    )
    partitions: int = Field(DEFAULT_PARTITIONS, ge=1, description="Key partitions: parallel join tasks.")


@dg.op(
    description="Decide near duplicates for many shards at once on Ray (first import, threshold change): the same "
    "files and index as near_duplicates shard by shard, recorded as its materializations.",
)
def near_duplicates_batch(
    context: dg.OpExecutionContext, config: NearDuplicatesBatchConfig, data_root: DataRootResource
) -> None:
    root = data_root.get()
    registered = context.instance.get_dynamic_partitions(shard_partitions.name)
    with_audio = set(shards_with_audio(root))
    shards = select_shards(root, config.shards, config.matching, [s for s in registered if s in with_audio])
    last_logged = {"at": 0.0}

    def log_progress(stage: str, done: int, total: int) -> None:
        now = time.monotonic()
        if 0 < done < total and now - last_logged["at"] < PROGRESS_EVERY_S:
            return
        last_logged["at"] = now
        context.log.info(f"near-duplicates batch: {stage} {done}/{total}")

    with batch_engine(config.ray_address or None) as (engine, where):
        context.log.info(f"near-duplicates batch: {len(shards)} shards, {where}")
        summary = run_near_duplicates_batch(
            root,
            shards,
            config.thresholds(),
            engine=engine,
            signals_from=config.signals_from,
            partitions=config.partitions,
            on_progress=log_progress,
            lock_timeout_s=config.lock_timeout_s,
            run_id=context.run.run_id,
            holder_finished=lambda holder: bool(holder.run_id) and run_ended_in(context)(holder.run_id),
        )
    context.log.info(f"near-duplicates batch: {summary.describe()}")
    known = set(registered)
    for shard in summary.shards:
        warning = recall_warning(shard.shard_id, shard.audio_key_load)
        if warning is not None:
            context.log.warning(warning)
        if shard.shard_id in known:
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=near_duplicates.key,
                    partition=shard.shard_id,
                    description="written by near_duplicates_batch_job",
                    metadata={
                        "dagster/row_count": len(shard.duplicates),
                        "utterances_checked": shard.utterances,
                        **{f"duplicates_{kind}": count for kind, count in shard.by_kind.items()},
                        "index_position": shard.index_position,
                        **key_load_metadata(shard.audio_key_load),
                        "batch_run": True,
                    },
                )
            )


@dg.job(
    name=BATCH_JOB_NAME,
    description="The whole-corpus near-duplicate pass on Ray: launch it from the Launchpad with thresholds and a "
    "shard selection (docs/near-duplicates.md).",
)
def near_duplicates_batch_job():
    near_duplicates_batch()


# --- the index's large merges (docs/near-duplicates.md, "Merges: in the shard's run and in the compaction job")

COMPACTION_JOB_NAME = "near_duplicates_compaction_job"


class NearDuplicatesCompactionConfig(dg.Config):
    max_merges: int = Field(0, ge=0, description="Stop after this many merges; 0: run every due merge.")
    lock_timeout_s: float = Field(
        DEFAULT_LOCK_TIMEOUT_S, description="Longest wait for the corpus index's lock (taken for each merge's switch)."
    )


@dg.op(
    description="Run the near-duplicate index's due merges, lowest level first: those too large for a shard's own "
    "run (above SPEECHDATA_NEAR_DUP_INLINE_MERGE_LEVEL); shards keep committing meanwhile.",
)
def near_duplicates_compaction(
    context: dg.OpExecutionContext, config: NearDuplicatesCompactionConfig, data_root: DataRootResource
) -> None:
    try:
        summary = compact_pending(
            data_root.get(),
            max_merges=config.max_merges or None,
            on_progress=lambda line: context.log.info(f"near-duplicates compact: {line}"),
            timeout_s=config.lock_timeout_s,
            run_id=context.run_id,
            holder_finished=lambda holder: bool(holder.run_id) and run_ended_in(context)(holder.run_id),
        )
    except CorpusIndexBusy as busy:  # the run's failure says what to do, not a traceback
        raise dg.Failure(description=f"{busy} (this job's config: lock_timeout_s)") from busy
    context.log.info(summary.describe())


@dg.job(
    name=COMPACTION_JOB_NAME,
    description="The near-duplicate index's large merges, off the shards' runs: launched by "
    "near_duplicates_compaction_sensor when one is due, or from the Launchpad (docs/near-duplicates.md).",
)
def near_duplicates_compaction_job():
    near_duplicates_compaction()


# --- the group: its definitions (assembled by dagster_project/loader.py)

defs = dg.Definitions(assets=[near_duplicates], jobs=[near_duplicates_batch_job, near_duplicates_compaction_job])
