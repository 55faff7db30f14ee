"""Software-defined assets, one module per asset group. Each asset is thin: it reads its inputs
through a resource, calls ``speechdata`` and reports what it wrote."""

from assets.alignment import alignments, frame_grids
from assets.asr_training import asr_flac, asr_manifest
from assets.catalog import manifest_catalog
from assets.features import qwen_hidden_states, wavlm_features
from assets.ingest import normalized_audio, raw_shards
from assets.packaging import bridge_tars, shard_manifest
from assets.publishing import PUBLISHING_ASSETS, hf_dataset, hf_hub_upload, hf_split_assignments  # noqa: F401 (re-exported)
from assets.translation import qe_scores, streaming_pairs, streaming_segments
from assets.vad import language_shard_index, vad_segments

SHARD_ASSETS = [
    raw_shards,
    normalized_audio,
    alignments,
    frame_grids,
    qwen_hidden_states,
    wavlm_features,
    bridge_tars,
    shard_manifest,
    asr_flac,
    vad_segments,
]
"""Every shard-partitioned asset: what the per-shard job (launched by the landing sensor) materializes."""

ON_DEMAND_SHARD_ASSETS = [streaming_segments, qe_scores, streaming_pairs]
"""Shard-partitioned, but not in the per-shard job: they need inputs landed later (the LLM
segmentation JSONs), so they run from the translation job or a backfill for the shards that have them."""

ALL_ASSETS = [
    *SHARD_ASSETS,
    manifest_catalog,
    asr_manifest,
    language_shard_index,
    *ON_DEMAND_SHARD_ASSETS,
    *PUBLISHING_ASSETS,
]

PER_SHARD_JOB_NAME = "per_shard_job"
TRANSLATION_JOB_NAME = "translation_job"
