"""Read every shard's ASR inputs, build the manifests (:mod:`speechdata.asr.manifest`), write them.

Outputs (atomic, replaced as a whole on a re-run), under ``asr/manifests/``: ``train``,
``validation`` and ``eval`` as ``.parquet`` (every column) and ``.jsonl`` (NeMo), and
``removed.parquet`` (every utterance left out, with the filter). Per-shard reading is a handful of
columnar reads per shard; all row work happens in polars.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv

from speechdata.alignment.pseudo_labels import with_text_sources
from speechdata.asr.flac_retention import remove_unreferenced_flacs
from speechdata.asr.incremental import (
    fingerprint,
    remove_shard_parts,
    shard_outputs,
    write_shard_parts,
)
from speechdata.asr.manifest import (
    FLAC_COLUMNS,
    UTTERANCE_COLUMNS,
    AsrManifestBuild,
    AsrManifestConfig,
    _refuse_ids_in_several_shards,
    conform,
    nemo_jsonl_bytes,
)
from speechdata.asr.manifest_rows import (
    MANIFEST_SCHEMA,
    REMOVED_SCHEMA,
    PreparedShard,
    prepare_shard,
    prepared_info,
    shard_stats,
)
from speechdata.asr.manifest_state import (
    AsrManifestTotals,
    eval_subset,
    forced_validation,
    open_state,
    replace_candidates,
    replace_eval_candidates,
    replace_kept_recordings,
    reset_for_fingerprint,
    set_state_value,
    state_value,
    totals,
    transaction,
)
from speechdata.asr.published_manifests import (
    MANIFEST_TO_ROOT,
    concatenate_jsonl,
    concatenate_parquet,
    read_published_build,
)
from speechdata.asr.split import SaltedMd5
from speechdata.bridge.segments import SEGMENT_KEY_SEPARATOR
from speechdata.io import layout
from speechdata.io.faults import fault_point
from speechdata.io.shard_versions import LEDGER_INPUTS, shard_input_versions
from speechdata.io.storage import DataRoot, filesystem_for, read_parquet
from speechdata.landing.extras import unpack_extras

SPLITS = ("train", "validation", "eval")


@dataclass(frozen=True)
class AsrManifestSummary:
    totals: AsrManifestTotals
    shards: int
    input_rows: int
    compute_seconds: float
    outputs: dict[str, str] = field(default_factory=dict)
    flacs_removed: int = 0
    """FLACs no index or manifest named any more, removed after the manifests were written."""
    shards_changed: list[str] = field(default_factory=list)
    """Shards whose inputs changed since the last build: the only ones read, gated and prepared."""
    shards_rewritten: list[str] = field(default_factory=list)
    """Shards whose published parts were written (the changed ones and those sharing a duplicate group)."""
    data_root: DataRoot | None = None

    @property
    def build(self) -> AsrManifestBuild:
        """Every manifest read back whole (train, validation, eval, removed): for tests and small
        corpora; training reads the files."""
        assert self.data_root is not None
        return read_published_build(self.data_root, self.totals)


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
        # An utterance landed without text carries the aligner's pseudo-label (text_source "asr").
        landed = unpack_extras(
            with_text_sources(data_root, shard_id, data_root.read_parquet(layout.utterance_index(shard_id))),
            [pa.field(quality_column, pa.float64()), pa.field("recording_id", pa.string())],
        )
        index = pl.from_arrow(landed.drop_columns([c for c in ("extra",) if c in landed.column_names]))
        if quality_column in index.columns:
            index = index.rename({quality_column: "quality"}) if quality_column != "quality" else index
        else:
            index = index.drop("quality", strict=False)
        extracted = pl.from_arrow(data_root.read_parquet(layout.asr_flac_index(shard_id)))
        index = with_recording_segments(index, extracted)
        utterances.append(conform(index.with_columns(pl.lit(shard_id).alias("shard_id")), UTTERANCE_COLUMNS))
        flac.append(conform(extracted.with_columns(pl.lit(shard_id).alias("shard_id")), FLAC_COLUMNS))
    if not shard_ids:
        return pl.DataFrame(schema=UTTERANCE_COLUMNS), pl.DataFrame(schema=FLAC_COLUMNS)
    return pl.concat(utterances), pl.concat(flac)


def with_recording_segments(index: pl.DataFrame, extracted: pl.DataFrame) -> pl.DataFrame:
    """The utterance index with each long recording that ``asr_flac`` published as segments replaced by
    one row per segment: keyed ``<utt_id>+<index>`` as its FLAC, its text the segment's words, every
    other column (language, recording, quality, text source) the recording's. Every later step (the
    filters, deduplication, the split by recording, the sampler) sees the segments as utterances."""
    if "text" not in extracted.columns:  # an index written before long recordings were segmented
        return index
    segments = extracted.filter(pl.col("utt_id").str.contains(SEGMENT_KEY_SEPARATOR, literal=True)).select(
        pl.col("utt_id").alias("segment_key"),
        pl.col("utt_id").str.split(SEGMENT_KEY_SEPARATOR).list.first().alias("utt_id"),
        pl.col("text").alias("segment_text"),
    )
    if segments.is_empty():
        return index
    expanded = (
        index.join(segments, on="utt_id", how="inner")
        .with_columns(pl.col("segment_key").alias("utt_id"), pl.col("segment_text").alias("text"))
        .drop("segment_key", "segment_text")
    )
    recordings = segments["utt_id"].unique().implode()
    return pl.concat([index.filter(~pl.col("utt_id").is_in(recordings)), expanded], how="vertical")


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


ShardGate = Callable[[str], object]
"""Called with each changed shard's id before anything is written; raises to stop the build."""


def asr_input_versions(data_root: DataRoot) -> dict[str, str]:
    """The version of every extracted shard's manifest inputs and ledger inputs (listings only)."""
    return shard_input_versions(data_root, layout.asr_flac_index, LEDGER_INPUTS)


def _corrections(data_root: DataRoot, location: str | None) -> tuple[pl.DataFrame | None, str]:
    """The corrections table and a version of its content (a change rebuilds every shard)."""
    table = read_language_corrections(data_root, location)
    if table is None:
        return None, "none"
    digest = hashlib.sha256(table.write_ipc(None).getvalue()).hexdigest()
    return table, f"{location}:{digest}"


def _prepare(data_root: DataRoot, shard_id: str, config, quality_column, corrections, salted_md5) -> PreparedShard:
    utterances, flac = read_asr_inputs(data_root, [shard_id], quality_column)
    prepared = prepare_shard(
        utterances, flac, config=config, audio_root=MANIFEST_TO_ROOT, corrections=corrections, salted_md5=salted_md5
    )
    data_root.write_parquet(layout.asr_manifest_prepared(shard_id), prepared.rows.to_arrow())
    return prepared


def _read_prepared(data_root: DataRoot, shard_id: str) -> pl.DataFrame:
    return pl.from_arrow(data_root.read_parquet(layout.asr_manifest_prepared(shard_id)))


def _ids_named_by_corrections(corrections: pl.DataFrame | None, rows: pl.DataFrame) -> list[str]:
    """The shard's utterance ids a corrections table without ``shard_id`` names (to refuse an id held
    by several shards, as the corpus-wide build does)."""
    if corrections is None or "utt_id" not in corrections.columns or "shard_id" in corrections.columns:
        return []
    named = corrections["utt_id"].cast(pl.String).drop_nulls().unique().implode()
    return sorted(rows.filter(pl.col("utt_id").is_in(named))["utt_id"].unique().to_list())


def build_and_write_asr_manifests(
    data_root: DataRoot,
    config: AsrManifestConfig = AsrManifestConfig(),
    *,
    quality_column: str = "tx_quality_score",
    corrections_location: str | None = None,
    gate: ShardGate | None = None,
    combined: bool = False,
) -> AsrManifestSummary:
    """Bring the manifests up to date, shard by shard (:mod:`speechdata.asr.incremental`).

    Only shards whose inputs changed are read, passed to ``gate`` (all of them, before anything is
    written) and prepared; only the shards whose rows' decisions can have changed get their parts
    rewritten. ``combined``: also write the corpus-wide files (a streamed concatenation of the parts,
    skipped when nothing changed); without it they are removed and the parts are the manifests.
    """
    started = time.perf_counter()
    versions = asr_input_versions(data_root)
    corrections, corrections_version = _corrections(data_root, corrections_location)
    build_fingerprint = fingerprint(config, quality_column, MANIFEST_TO_ROOT, corrections_version)
    with open_state(data_root) as connection, SaltedMd5(config.split_salt) as salted_md5:
        reset_for_fingerprint(connection, build_fingerprint)
        known = dict(connection.execute("SELECT shard_id, inputs_version FROM shards").fetchall())
        changed = [shard_id for shard_id, version in versions.items() if known.get(shard_id) != version]
        gone = sorted(set(known) - set(versions))
        if gate is not None:
            for shard_id in changed:
                gate(shard_id)

        held_ids: dict[str, list[str]] = {}
        infos: dict[str, str] = {}
        for shard_id in changed:
            prepared = _prepare(data_root, shard_id, config, quality_column, corrections, salted_md5)
            held_ids[shard_id] = _ids_named_by_corrections(corrections, prepared.rows)
            infos[shard_id] = prepared_info(prepared)
        _refuse_correction_ids_in_several_shards(connection, held_ids, changed + gone, corrections)

        for shard_id in gone:
            remove_shard_parts(data_root, shard_id)
            replace_candidates(connection, shard_id, "", None)
        for shard_id in changed:
            rows = _read_prepared(data_root, shard_id)
            replace_candidates(connection, shard_id, versions[shard_id], rows, infos[shard_id])
            with transaction(connection):
                connection.execute("DELETE FROM correction_ids WHERE shard_id = ?", [shard_id])
                connection.executemany(
                    "INSERT INTO correction_ids VALUES (?, ?)", [(shard_id, u) for u in held_ids[shard_id]]
                )

        # Kept recordings of every marked shard first: the forced validation recording depends on all.
        marked = [r[0] for r in connection.execute("SELECT shard_id FROM shards WHERE marked = 1 ORDER BY shard_id")]
        for shard_id in marked:
            rows = _read_prepared(data_root, shard_id)
            kept = shard_outputs(connection, shard_id, rows, validation_share=config.validation_share, forced=None).kept
            replace_kept_recordings(connection, shard_id, kept)
        forced, _ = forced_validation(connection, config.validation_share)
        previous = state_value(connection, "forced")
        if forced != previous:
            with transaction(connection):
                connection.execute(
                    "UPDATE shards SET marked = 1 WHERE shard_id IN "
                    "(SELECT shard_id FROM kept_recordings WHERE recording_key IN (?, ?))",
                    [forced, previous],
                )
                set_state_value(connection, "forced", forced)
                set_state_value(connection, "combined_current", "0")

        rewritten = [r[0] for r in connection.execute("SELECT shard_id FROM shards WHERE marked = 1 ORDER BY shard_id")]
        for shard_id in rewritten:
            rows = _read_prepared(data_root, shard_id)
            outputs = shard_outputs(connection, shard_id, rows, validation_share=config.validation_share, forced=forced)
            write_shard_parts(data_root, shard_id, outputs)
            [info] = connection.execute("SELECT prepared_info FROM shards WHERE shard_id = ?", [shard_id]).fetchone()
            with transaction(connection):
                replace_eval_candidates(connection, shard_id, outputs, config.eval_per_language, forced)
                connection.execute(
                    "UPDATE shards SET marked = 0, forced_at_write = ?, stats = ? WHERE shard_id = ?",
                    [forced, json.dumps(shard_stats(outputs, info), sort_keys=True), shard_id],
                )

        eval_frame = eval_subset(connection, config.eval_per_language)
        shard_ids = [r[0] for r in connection.execute("SELECT shard_id FROM shards ORDER BY shard_id")]
        outputs = _write_manifests(data_root, connection, shard_ids, eval_frame, combined)
        pending = [r[0] for r in connection.execute("SELECT shard_id FROM shards WHERE flacs_pending = 1")]
        # Only now does no published manifest name the FLACs the previous build used.
        flacs_removed = remove_unreferenced_flacs(data_root, pending)
        with transaction(connection):
            connection.executemany("UPDATE shards SET flacs_pending = 0 WHERE shard_id = ?", [(s,) for s in pending])
        summary_totals = totals(connection, config, eval_frame.height, forced)
    return AsrManifestSummary(
        totals=summary_totals,
        shards=len(shard_ids),
        input_rows=summary_totals.input_rows,
        compute_seconds=time.perf_counter() - started,
        outputs=outputs,
        flacs_removed=flacs_removed,
        shards_changed=changed,
        shards_rewritten=rewritten,
        data_root=data_root,
    )


def _refuse_correction_ids_in_several_shards(
    connection, held_ids: dict[str, list[str]], replaced: list[str], corrections: pl.DataFrame | None
) -> None:
    if corrections is None or not any(held_ids.values()):
        return
    pairs = [(shard_id, utt_id) for shard_id, ids in held_ids.items() for utt_id in ids]
    wanted = sorted({utt_id for _, utt_id in pairs})
    placeholders = ",".join("?" * len(wanted))
    others = connection.execute(
        f"SELECT shard_id, utt_id FROM correction_ids WHERE utt_id IN ({placeholders})",  # noqa: S608
        wanted,
    ).fetchall()
    pairs += [(shard_id, utt_id) for shard_id, utt_id in others if shard_id not in replaced]
    rows = pl.DataFrame(pairs, schema={"shard_id": pl.String, "utt_id": pl.String}, orient="row")
    _refuse_ids_in_several_shards(rows, corrections.select(pl.col("utt_id").cast(pl.String)))


def _combined_files(split: str) -> list[str]:
    return [layout.asr_manifest(split), layout.asr_manifest(split, "jsonl")]


def _write_manifests(
    data_root: DataRoot, connection, shard_ids: list[str], eval_frame: pl.DataFrame, combined: bool
) -> dict[str, str]:
    """The eval files and, with ``combined``, the corpus-wide files concatenated from the parts (in
    the order readers expect them replaced: each split's parquet then its JSONL, then ``removed``)."""
    outputs: dict[str, str] = {}
    names = [*_combined_files("train"), *_combined_files("validation"), *_combined_files("eval")]
    names.append(layout.asr_manifest_removed())
    current = state_value(connection, "combined_current") == "1" and all(data_root.exists(n) for n in names)
    if not combined:
        for name in [*_combined_files("train"), *_combined_files("validation"), layout.asr_manifest_removed()]:
            if data_root.exists(name):
                data_root.fs.rm(data_root.path(name))
        current = state_value(connection, "combined_current") == "1" and all(
            data_root.exists(n) for n in _combined_files("eval")
        )
    for split in SPLITS:
        if combined or split == "eval":
            outputs[f"{split}_parquet"] = data_root.uri(layout.asr_manifest(split))
            outputs[f"{split}_jsonl"] = data_root.uri(layout.asr_manifest(split, "jsonl"))
        else:
            outputs[f"{split}_parts"] = data_root.uri(posixpath.dirname(layout.asr_manifest_part(split, "x")))
    outputs["removed"] = data_root.uri(
        layout.asr_manifest_removed() if combined else posixpath.dirname(layout.asr_manifest_part("removed", "x"))
    )
    if current:
        return outputs
    for split in SPLITS:
        if split == "eval":
            data_root.write_parquet(layout.asr_manifest(split), eval_frame.to_arrow())
            fault_point("asr-manifest-parquet")
            data_root.write_bytes(layout.asr_manifest(split, "jsonl"), nemo_jsonl_bytes(eval_frame))
            fault_point("asr-manifest-jsonl")
        elif combined:
            concatenate_parquet(data_root, layout.asr_manifest(split), split, shard_ids, MANIFEST_SCHEMA)
            fault_point("asr-manifest-parquet")
            concatenate_jsonl(data_root, layout.asr_manifest(split, "jsonl"), split, shard_ids)
            fault_point("asr-manifest-jsonl")
    if combined:
        concatenate_parquet(data_root, layout.asr_manifest_removed(), "removed", shard_ids, REMOVED_SCHEMA)
        fault_point("asr-manifest-removed")
    with transaction(connection):
        set_state_value(connection, "combined_current", "1")
    return outputs
