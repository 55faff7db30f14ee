"""The ASR manifests built shard by shard: a new shard costs that shard (and the few shards it
shares a duplicate with), not the corpus.

The result is the one :func:`speechdata.asr.manifest.build_asr_manifest` gives on every shard at once
(the tests hold them equal); only where the work happens changes:

* **Per shard, once per input version** (:func:`prepare_shard`): language corrections, the cheap
  filters, cleaning and the ``<|lang|>`` tag, and the keys of the later steps: the audio key (the
  MD5 of the PCM's SHA-1, 64 bits), the text key (a stable MD5 of recording, cleaned text and
  duration step), the recording's split bucket and the utterance's eval hash. Written to
  :func:`~speechdata.io.layout.asr_manifest_prepared`; the shard's inputs are not read again while
  their version (:mod:`speechdata.io.shard_versions`: listings only) is unchanged, and the ledger gate
  runs only for shards whose version changed.
* **Across shards, through an index** (a SQLite file, :func:`~speechdata.io.layout.asr_manifest_state`):
  every candidate row's audio and text key, so deduplication ("the first by ``(shard_id, utt_id)``
  is kept") is a lookup of the changed shard's keys, not a pass over the corpus. A changed shard
  marks for rewriting the shards that hold one of its keys (the first of a group may have moved)
  and those holding a text key of a row whose audio group it joined or left (two hops: text
  duplicates are counted among rows that are not audio duplicates). Kept recordings and their
  buckets decide the split; the recording forced into validation when none falls under the share
  (:mod:`speechdata.asr.split`) is recomputed from them, and a change marks the shards holding the
  old and the new one. Each shard's eval candidates (its ``eval_per_language`` smallest per
  language) are kept, so the eval subset is a small query.
* **Published per shard**: ``asr/manifests/parts/{train,validation}/<shard>.{parquet,jsonl}`` and
  ``parts/removed/<shard>.parquet``, rewritten only for the shards marked. ``eval`` is written whole
  (``eval_per_language`` rows per language). The corpus-wide files ``train``/``validation``
  ``.parquet``/``.jsonl`` and ``removed.parquet`` are a streamed concatenation of the parts in shard
  order (one part in memory at a time), skipped when nothing changed, or not written at all
  (``combined=False``: NeMo then reads the parts, e.g. as a comma-separated ``manifest_filepath``).

Crash safety: the prepared part is written before the index learns the shard's new version; the
index update and the marks it causes are one transaction; a marked shard's parts are written
before its mark is cleared; the combined files are flagged stale before any part changes and
rewritten (then the flag cleared) at the end. A run killed anywhere leaves marks and flags that make
the next run finish the same work, to the same bytes.

Anything that changes every shard's rows (the config, the corrections table, the audio root)
changes the build's fingerprint: the index is then emptied and every shard rebuilt, shard by shard
(memory stays one shard's).

The per-shard rows are :mod:`speechdata.asr.manifest_rows`, the index
:mod:`speechdata.asr.manifest_state`; this module decides a shard's rows against the index and
writes its parts.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict

import polars as pl
import pyarrow as pa

from speechdata.asr.manifest import AsrManifestConfig, conform, nemo_jsonl_bytes
from speechdata.asr.manifest_rows import MANIFEST_SCHEMA, REMOVED_SCHEMA, ShardOutputs
from speechdata.asr.manifest_state import duplicate_decisions
from speechdata.asr.split import HASH_BUCKETS
from speechdata.io import layout
from speechdata.io.faults import fault_point
from speechdata.io.storage import DataRoot

STATE_FORMAT = "asr-manifest-state-v1"


def shard_outputs(
    connection: sqlite3.Connection, shard_id: str, rows: pl.DataFrame, *, validation_share: float, forced: str | None
) -> ShardOutputs:
    duplicates = duplicate_decisions(connection, shard_id, rows)
    decided = rows.join(duplicates, on="_row", how="left", suffix="_dup").with_columns(
        pl.coalesce("reason", "reason_dup").alias("reason"), pl.coalesce("detail", "detail_dup").alias("detail")
    )
    removed = (
        decided.filter(pl.col("reason").is_not_null())
        .select("shard_id", "utt_id", "reason", pl.col("detail").fill_null(""))
        .pipe(conform, REMOVED_SCHEMA)
    )
    threshold = int(validation_share * HASH_BUCKETS)
    held_out = (pl.col("bucket") < threshold) | (pl.col("recording_key") == pl.lit(forced, pl.String)).fill_null(False)
    kept = decided.filter(pl.col("reason").is_null()).with_columns(held_out.alias("held_out"))
    return ShardOutputs(
        train=conform(kept.filter(~pl.col("held_out")), MANIFEST_SCHEMA),
        validation=conform(kept.filter(pl.col("held_out")), MANIFEST_SCHEMA),
        removed=removed,
        kept=kept,
    )


def fingerprint(config: AsrManifestConfig, quality_column: str, audio_root: str, corrections_version: str) -> str:
    return json.dumps(
        {
            "format": STATE_FORMAT,
            "config": asdict(config),
            "quality_column": quality_column,
            "audio_root": audio_root,
            "corrections": corrections_version,
        },
        sort_keys=True,
    )


PART_TO_ROOT = "../../../.."
"""A part's ``audio_filepath`` is relative to its own directory (``asr/manifests/parts/<split>/``),
as NeMo and :class:`speechdata.asr.dataset.AsrManifestDataset` resolve it: a part (or a list of
parts) is a manifest by itself."""


def with_audio_root(frame: pl.DataFrame, audio_root: str) -> pl.DataFrame:
    """``frame`` with ``audio_filepath`` made from ``flac_path`` under ``audio_root``."""
    return frame.with_columns((pl.lit(audio_root.rstrip("/") + "/") + pl.col("flac_path")).alias("audio_filepath"))


def write_shard_parts(data_root: DataRoot, shard_id: str, outputs: ShardOutputs) -> None:
    for kind, frame in (("train", outputs.train), ("validation", outputs.validation)):
        frame = with_audio_root(frame, PART_TO_ROOT)
        data_root.write_parquet(layout.asr_manifest_part(kind, shard_id), frame.to_arrow())
        data_root.write_bytes(layout.asr_manifest_part(kind, shard_id, "jsonl"), nemo_jsonl_bytes(frame))
    data_root.write_parquet(layout.asr_manifest_part("removed", shard_id), outputs.removed.to_arrow())
    fault_point("asr-manifest-shard-parts")


def remove_shard_parts(data_root: DataRoot, shard_id: str) -> None:
    paths = [layout.asr_manifest_part(kind, shard_id) for kind in layout.ASR_MANIFEST_PART_KINDS]
    paths += [layout.asr_manifest_part(kind, shard_id, "jsonl") for kind in ("train", "validation")]
    paths.append(layout.asr_manifest_prepared(shard_id))
    for path in paths:
        if data_root.exists(path):
            data_root.fs.rm(data_root.path(path))


def arrow_schema(schema: dict) -> pa.Schema:
    return pl.DataFrame(schema=schema).to_arrow().schema
