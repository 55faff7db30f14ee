"""Software-defined assets, one module per asset group. Each asset is thin: it reads its inputs
through a resource, calls ``speechdata`` and reports what it wrote."""

from assets.alignment import alignments, frame_grids
from assets.catalog import manifest_catalog
from assets.features import qwen_hidden_states, wavlm_features
from assets.ingest import normalized_audio, raw_shards
from assets.packaging import bridge_tars, shard_manifest
from assets.vad import language_shard_index, vad_segments

SHARD_ASSETS = [
    raw_shards, normalized_audio, alignments, frame_grids, qwen_hidden_states, wavlm_features,
    bridge_tars, shard_manifest, vad_segments,
]
"""Every shard-partitioned asset: what the per-shard job (launched by the landing sensor) materializes."""

ALL_ASSETS = [*SHARD_ASSETS, manifest_catalog, language_shard_index]

PER_SHARD_JOB_NAME = "per_shard_job"
