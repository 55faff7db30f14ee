"""The published ASR manifests read back, and the corpus-wide files streamed from the per-shard parts.

A part's rows are a slice of the corpus-wide file, byte for byte but their path prefix
(:data:`MANIFEST_TO_ROOT` against the parts' :data:`~speechdata.asr.incremental.PART_TO_ROOT`).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from speechdata.asr.incremental import PART_TO_ROOT, arrow_schema, with_audio_root
from speechdata.asr.manifest import AsrManifestBuild
from speechdata.asr.manifest_rows import MANIFEST_SCHEMA, REMOVED_SCHEMA
from speechdata.asr.manifest_state import AsrManifestTotals
from speechdata.io import layout
from speechdata.io.storage import DataRoot, atomic_open

MANIFEST_TO_ROOT = "../.."
"""``audio_filepath`` is relative to the manifest's own directory (``asr/manifests/``): NeMo resolves
a relative path against the manifest's directory (``get_full_path``), and so does
:class:`speechdata.asr.dataset.AsrManifestDataset`; the data root can then be copied or moved.
The per-shard parts (``asr/manifests/parts/<split>/``) are two levels deeper: their rows keep the
same ``audio_filepath`` (so a part is a slice of the corpus-wide file, byte for byte), and a reader
of a part resolves it against ``asr/manifests/`` (:func:`speechdata.asr.dataset.manifest_base_dir`)."""


def concatenate_parquet(data_root: DataRoot, target: str, kind: str, shard_ids: list[str], schema: dict) -> None:
    """``target`` from every shard's part, in shard order, one part in memory at a time."""
    with data_root.parquet_writer(target, arrow_schema(schema)) as writer:
        for shard_id in shard_ids:
            part = read_part_arrow(data_root, kind, shard_id)
            if part.num_rows:
                writer.write_table(part)


def concatenate_jsonl(data_root: DataRoot, target: str, kind: str, shard_ids: list[str]) -> None:
    """``target`` from every shard's JSONL part, byte for byte but each line's path prefix: every line
    starts with ``{"audio_filepath":"<PART_TO_ROOT>/``, which becomes ``<MANIFEST_TO_ROOT>/``."""
    part_prefix = f'{{"audio_filepath":"{PART_TO_ROOT}/'.encode()
    manifest_prefix = f'{{"audio_filepath":"{MANIFEST_TO_ROOT}/'.encode()
    with atomic_open(data_root.fs, data_root.path(target)) as handle:
        for shard_id in shard_ids:
            data = data_root.fs.cat_file(data_root.path(layout.asr_manifest_part(kind, shard_id, "jsonl")))
            lines = data.count(b"\n")
            if data.count(b"\n" + part_prefix) + data.startswith(part_prefix) != lines:
                raise ValueError(
                    f"{layout.asr_manifest_part(kind, shard_id, 'jsonl')}: a line without the part's path prefix"
                )
            handle.write(data.replace(part_prefix, manifest_prefix))


def read_part_arrow(data_root: DataRoot, kind: str, shard_id: str) -> pa.Table:
    """A shard's part as the corpus-wide file holds it (``audio_filepath`` relative to ``asr/manifests/``)."""
    part = data_root.read_parquet(layout.asr_manifest_part(kind, shard_id))
    if kind == "removed":
        return part
    # Through polars, not pyarrow.compute: the latter's string kernels import pandas (seconds).
    return with_audio_root(pl.from_arrow(part), MANIFEST_TO_ROOT).to_arrow()


def read_part(data_root: DataRoot, kind: str, shard_id: str) -> pl.DataFrame:
    return pl.from_arrow(read_part_arrow(data_root, kind, shard_id))


def read_published_build(data_root: DataRoot, summary_totals: AsrManifestTotals | None = None) -> AsrManifestBuild:
    """The published manifests as one :class:`AsrManifestBuild` (the corpus-wide files, else the parts)."""

    def read(kind: str, schema: dict) -> pl.DataFrame:
        whole = layout.asr_manifest_removed() if kind == "removed" else layout.asr_manifest(kind)
        if data_root.exists(whole):
            return pl.from_arrow(data_root.read_parquet(whole))
        shard_ids = sorted(
            p.rstrip("/").rsplit("/", 1)[-1].removesuffix(".parquet")
            for p in data_root.glob(layout.asr_manifest_part(kind, "*"))
        )
        frames = [read_part(data_root, kind, shard_id) for shard_id in shard_ids]
        return pl.concat(frames) if frames else pl.DataFrame(schema=schema)

    t = summary_totals or AsrManifestTotals()
    return AsrManifestBuild(
        train=read("train", MANIFEST_SCHEMA),
        validation=read("validation", MANIFEST_SCHEMA),
        eval=read("eval", MANIFEST_SCHEMA),
        removed=read("removed", REMOVED_SCHEMA),
        relabeled=t.relabeled,
        recordings=t.recordings,
        validation_share=t.validation_share,
        forced_validation=t.forced_validation,
    )
