"""Software-defined assets, one module per asset group. Each asset is thin: it reads its inputs
through a resource, calls ``speechdata`` and reports what it wrote."""

from assets.alignment import alignments, frame_grids
from assets.ingest import normalized_audio, raw_shards

ALL_ASSETS = [raw_shards, normalized_audio, alignments, frame_grids]

SHARD_ASSETS = [raw_shards, normalized_audio, alignments, frame_grids]
"""Every shard-partitioned asset: what the per-shard job (launched by the landing sensor) materializes."""

PER_SHARD_JOB_NAME = "per_shard_job"
