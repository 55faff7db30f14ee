"""Shard manifests: one parquet row per packed bridge sample, the catalog's source of truth.

``manifests/shard=<shard_id>/part-0.parquet`` under the data root (hive-partitioned by shard, so
DuckDB and polars can read every shard's manifest with one glob). Every manifest has exactly the
columns below: the landed metadata's own columns (quality scores, speaker, ...) ride in ``extra``, one
JSON object per sample (:mod:`speechdata.landing.extras`), so no reader needs a union option.
"""

from __future__ import annotations

import pyarrow as pa

from speechdata.io import layout

MANIFEST_COLUMNS = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("tar_url", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("duration_s", pa.float64(), nullable=False),
        pa.field("n_frames", pa.int32(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("language", pa.string()),
        pa.field("country", pa.string()),
        pa.field("source", pa.string()),
        pa.field("text", pa.string()),
        pa.field("text_source", pa.string()),
        pa.field("asr_confidence", pa.float32()),
        pa.field("alignment_score", pa.float32()),
        pa.field("zero_duration_token_share", pa.float32()),
        pa.field("clipped_share", pa.float32()),
        pa.field("extra", pa.string(), nullable=False),
    ]
)
"""``tar_url`` is relative to the data root (``bridge/<shard>-NNNNNN.tar``), so a copied or moved root
still reads: resolve it with :func:`tar_location` against the root you read from.
``offset``/``size``: byte range of the sample's members (headers included) inside ``tar_url``, so
a reader can fetch one sample with a range request and read it with ``tarfile``.
``clipped_share``: the share of the source samples at full scale (the audio container's column;
null for audio normalized before it was measured)."""

MANIFESTS_DIR = layout.MANIFESTS


def manifest_path(shard_id: str) -> str:
    """The shard's manifest, relative to the data root (:func:`speechdata.io.layout.shard_manifest`)."""
    return layout.shard_manifest(shard_id)


def manifests_glob(root_uri: str) -> str:
    """Glob of every shard manifest under a data root (for DuckDB's ``read_parquet``)."""
    return f"{root_uri.rstrip('/')}/{MANIFESTS_DIR}/shard=*/part-0.parquet"


def tar_location(root_url: str, tar_url: str) -> str:
    """The URL of a manifest's ``tar_url`` under the data root at ``root_url``."""
    if "://" in tar_url or tar_url.startswith("/"):
        return tar_url  # written before references were relative
    if ".." in tar_url.split("/"):
        raise ValueError(f"tar_url {tar_url!r} leaves the data root")
    from speechdata.io.storage import DataRoot

    return DataRoot(root_url).uri(tar_url)
