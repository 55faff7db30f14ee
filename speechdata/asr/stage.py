"""Read every shard's ASR inputs, build the manifests (:mod:`speechdata.asr.manifest`), write them.

Outputs (atomic, replaced as a whole on a re-run), under ``asr/manifests/``: ``train``,
``validation`` and ``eval`` as ``.parquet`` (every column) and ``.jsonl`` (NeMo), and
``removed.parquet`` (every utterance left out, with the filter). Per-shard reading is a handful of
columnar reads per shard; all row work happens in polars.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv

from speechdata.asr.flac_retention import remove_unreferenced_flacs
from speechdata.asr.manifest import (
    FLAC_COLUMNS,
    UTTERANCE_COLUMNS,
    AsrManifestBuild,
    AsrManifestConfig,
    build_asr_manifest,
    conform,
    nemo_jsonl_bytes,
)
from speechdata.faults import fault_point
from speechdata.io import layout
from speechdata.io.storage import DataRoot, filesystem_for, read_parquet
from speechdata.landing.extras import unpack_extras

SPLITS = ("train", "validation", "eval")


@dataclass(frozen=True)
class AsrManifestSummary:
    build: AsrManifestBuild
    shards: int
    input_rows: int
    compute_seconds: float
    outputs: dict[str, str] = field(default_factory=dict)
    flacs_removed: int = 0
    """FLACs no index or manifest named any more, removed after the manifests were written."""


def shards_with_asr_flac(data_root: DataRoot) -> list[str]:
    """Shards whose ``asr_flac`` index exists (the manifest's inputs)."""
    return sorted(path.split("/")[-2] for path in data_root.glob(layout.asr_flac_index("*")))


def read_asr_inputs(
    data_root: DataRoot, shard_ids: list[str], quality_column: str = "tx_quality_score"
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every shard's utterance index (as ``UTTERANCE_COLUMNS``, ``quality`` from ``quality_column``)
    and FLAC index (``FLAC_COLUMNS``), concatenated."""
    utterances, flac = [], []
    for shard_id in shard_ids:
        # The landed metadata's own columns (quality, recording id) ride in the ``extra`` namespace.
        landed = unpack_extras(
            data_root.read_parquet(layout.utterance_index(shard_id)),
            [pa.field(quality_column, pa.float64()), pa.field("recording_id", pa.string())],
        )
        index = pl.from_arrow(landed.drop_columns([c for c in ("extra",) if c in landed.column_names]))
        if quality_column in index.columns:
            index = index.rename({quality_column: "quality"}) if quality_column != "quality" else index
        else:
            index = index.drop("quality", strict=False)
        utterances.append(conform(index.with_columns(pl.lit(shard_id).alias("shard_id")), UTTERANCE_COLUMNS))
        extracted = pl.from_arrow(data_root.read_parquet(layout.asr_flac_index(shard_id)))
        flac.append(conform(extracted.with_columns(pl.lit(shard_id).alias("shard_id")), FLAC_COLUMNS))
    if not shard_ids:
        return pl.DataFrame(schema=UTTERANCE_COLUMNS), pl.DataFrame(schema=FLAC_COLUMNS)
    return pl.concat(utterances), pl.concat(flac)


def read_language_corrections(data_root: DataRoot, location: str | None) -> pl.DataFrame | None:
    """The corrections table at ``location`` (relative to the data root, or a URL; ``.parquet`` or
    ``.csv``). ``None`` reads the default path if it exists."""
    if location is None:
        if not data_root.exists(layout.asr_language_corrections()):
            return None
        location = layout.asr_language_corrections()
    if "://" in location or posixpath.isabs(location):
        fs, path = filesystem_for(location)
    else:
        fs, path = data_root.fs, data_root.path(location)
    if path.endswith(".csv"):
        with fs.open(path, "rb") as handle:
            return pl.from_arrow(pacsv.read_csv(handle))
    return pl.from_arrow(read_parquet(fs, path))


MANIFEST_TO_ROOT = "../.."
"""``audio_filepath`` is relative to the manifest's own directory (``asr/manifests/``): NeMo resolves
a relative path against the manifest's directory (``get_full_path``), and so does
:class:`speechdata.asr.dataset.AsrManifestDataset`; the data root can then be copied or moved."""


def build_and_write_asr_manifests(
    data_root: DataRoot,
    config: AsrManifestConfig = AsrManifestConfig(),
    *,
    quality_column: str = "tx_quality_score",
    corrections_location: str | None = None,
) -> AsrManifestSummary:
    started = time.perf_counter()
    shard_ids = shards_with_asr_flac(data_root)
    utterances, flac = read_asr_inputs(data_root, shard_ids, quality_column)
    build = build_asr_manifest(
        utterances,
        flac,
        audio_root=MANIFEST_TO_ROOT,
        config=config,
        corrections=read_language_corrections(data_root, corrections_location),
    )
    outputs = {}
    for split, frame in zip(SPLITS, (build.train, build.validation, build.eval), strict=True):
        data_root.write_parquet(layout.asr_manifest(split), frame.to_arrow())
        fault_point("asr-manifest-parquet")
        data_root.write_bytes(layout.asr_manifest(split, "jsonl"), nemo_jsonl_bytes(frame))
        fault_point("asr-manifest-jsonl")
        outputs[f"{split}_parquet"] = data_root.uri(layout.asr_manifest(split))
        outputs[f"{split}_jsonl"] = data_root.uri(layout.asr_manifest(split, "jsonl"))
    data_root.write_parquet(layout.asr_manifest_removed(), build.removed.to_arrow())
    outputs["removed"] = data_root.uri(layout.asr_manifest_removed())
    fault_point("asr-manifest-removed")
    # Only now does no published manifest name the FLACs the previous build used.
    flacs_removed = remove_unreferenced_flacs(data_root)
    return AsrManifestSummary(
        build=build,
        shards=len(shard_ids),
        input_rows=utterances.height,
        compute_seconds=time.perf_counter() - started,
        outputs=outputs,
        flacs_removed=flacs_removed,
    )
