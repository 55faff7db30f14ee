"""The near-duplicate index's entries files: one row per indexed utterance (its signals and representative)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import posixpath
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speechdata.io import layout
from speechdata.io.parquet_integrity import WRITE_OPTIONS, UnreadableIntermediate
from speechdata.io.storage import DataRoot
from speechdata.quality.fingerprint_audio import AudioFingerprint
from speechdata.quality.fingerprint_envelope import SHAPE_SEGMENTS, ShiftSignature
from speechdata.quality.near_dup_index_order import (
    IndexDamaged,
    IndexedShard,
)
from speechdata.quality.near_dup_matching import Decision, IndexEntry, UtteranceSignals

ENTRIES_ROW_GROUP = 64
"""Entries rows per row group: fetching a candidate reads its group, not its shard."""
ENTRIES_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("exact_hash", pa.string()),
        pa.field("sub_fingerprints", pa.binary(), nullable=False),
        pa.field("active_frames", pa.binary(), nullable=False),
        pa.field("transcript_signature", pa.binary()),
        pa.field("transcript_words", pa.int32(), nullable=False),
        pa.field("representative_shard", pa.string(), nullable=False),
        pa.field("representative_utt", pa.string(), nullable=False),
        pa.field("speaker_embedding", pa.binary()),
        pa.field("envelope", pa.binary()),
        pa.field("spectral_shape", pa.binary()),
        pa.field("speech_span_s", pa.float64()),
    ]
)
"""``sub_fingerprints``: little-endian uint32 per frame; ``active_frames``: one bit per frame
(numpy ``packbits``); ``transcript_signature``: little-endian uint64 MinHash values, null for an
empty transcript; ``speaker_embedding``: 256 little-endian float16 (512 bytes; half precision moves
a cosine by less than 0.001), null when the utterance has none. ``envelope``: 64 little-endian float16 (the
loudness envelope, :mod:`.fingerprint_envelope`), null when flat or short, with ``spectral_shape``
(12 x 52 int8) and the speech span in seconds.
Entries files written before these columns existed read as null: their utterances count as the
same speaker and have no envelope."""


def entries_table(signals: Sequence[UtteranceSignals], decisions: Sequence[Decision]) -> pa.Table:
    rows = []
    for utterance, decision in zip(signals, decisions, strict=True):
        sub_fingerprints, active = utterance.fingerprint.to_bytes()
        signature = utterance.transcript_signature
        rows.append(
            {
                "utt_id": utterance.utt_id,
                "exact_hash": utterance.exact_hash,
                "sub_fingerprints": sub_fingerprints,
                "active_frames": active,
                "transcript_signature": None if signature is None else signature.astype("<u8").tobytes(),
                "transcript_words": utterance.transcript_words,
                "representative_shard": decision.representative_shard,
                "representative_utt": decision.representative_utt,
                "speaker_embedding": None
                if utterance.speaker_embedding is None
                else np.asarray(utterance.speaker_embedding, "<f2").tobytes(),
                **_shift_columns(utterance.shift),
            }
        )
    return pa.Table.from_pylist(rows, schema=ENTRIES_SCHEMA)


def _shift_columns(shift: ShiftSignature | None) -> dict:
    if shift is None:
        return {"envelope": None, "spectral_shape": None, "speech_span_s": None}
    return {
        "envelope": np.asarray(shift.envelope, "<f2").tobytes(),
        "spectral_shape": np.asarray(shift.spectral_shape, np.int8).tobytes(),
        "speech_span_s": shift.span_s,
    }


ENTRIES_VERSION_CHARS = 16


def _entries_bytes(entries: pa.Table) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    pq.write_table(entries, buffer, compression="zstd", row_group_size=ENTRIES_ROW_GROUP, **WRITE_OPTIONS)
    content = buffer.getvalue()
    return content, hashlib.sha256(content).hexdigest()[:ENTRIES_VERSION_CHARS]


def note_entries_written(data_root: DataRoot, shard_id: str, *versions: str) -> None:
    """Name ``versions`` in the shard's list of entries files written since its last commit, before
    writing them (or, for the committed version a commit replaces, before the commit): every entries
    file of the shard that its commit does not name is then in the list, and
    :func:`remove_written_entries` removes them without listing the entries folder."""
    relative = layout.near_duplicates_index_entries_written(shard_id)
    noted = _noted_versions(data_root, relative)
    if not set(versions) <= noted:
        data_root.write_bytes(relative, (json.dumps(sorted(noted | set(versions))) + "\n").encode())


def remove_written_entries(data_root: DataRoot, shard_id: str, current_version: str) -> int:
    """After ``shard_id`` committed ``current_version``: delete the other entries files its list
    names (replaced ones, or one a killed run wrote before committing), then the list; return how
    many files were there. A run killed meanwhile leaves the list, and the next commit finishes."""
    relative = layout.near_duplicates_index_entries_written(shard_id)
    removed = 0
    for version in sorted(_noted_versions(data_root, relative) - {current_version}):
        with contextlib.suppress(FileNotFoundError):
            data_root.fs.rm_file(data_root.path(layout.near_duplicates_index_entries(shard_id, version)))
            removed += 1
    with contextlib.suppress(FileNotFoundError):
        data_root.fs.rm_file(data_root.path(relative))
    return removed


def _noted_versions(data_root: DataRoot, relative: str) -> set[str]:
    """The versions a list names (none when absent; a damaged list names none: its files are left,
    never a committed one removed)."""
    try:
        versions = json.loads(data_root.fs.cat_file(data_root.path(relative)))
    except FileNotFoundError:
        return set()
    except ValueError:
        return set()
    if not isinstance(versions, list):
        return set()
    return {v for v in versions if isinstance(v, str) and len(v) == ENTRIES_VERSION_CHARS and v.isalnum()}


def remove_unlisted_entries(data_root: DataRoot, shard_id: str, current_version: str) -> int:
    """Delete ``shard_id``'s entries files other than ``current_version`` (replaced ones, or one a
    killed run wrote before committing the order); return how many. Lists the whole entries folder:
    a whole-corpus write's (:func:`.near_dup_index_merge.write_index`); a shard's commit removes
    only what it noted (:func:`remove_written_entries`)."""
    folder = data_root.path(layout.near_duplicates_index_entries_dir())
    if not data_root.fs.exists(folder):
        return 0
    keep = posixpath.basename(layout.near_duplicates_index_entries(shard_id, current_version))
    removed = 0
    for path in data_root.fs.ls(folder, detail=False):
        name = posixpath.basename(path)
        stem = name.removesuffix(".parquet")
        owner, _, version = stem.rpartition("-")
        if owner == shard_id and len(version) == ENTRIES_VERSION_CHARS and name != keep:
            with contextlib.suppress(FileNotFoundError):
                data_root.fs.rm(path)
                removed += 1
    return removed


def _parse_entry(shard_id: str, row: dict) -> IndexEntry:
    signature, speaker, envelope = row["transcript_signature"], row.get("speaker_embedding"), row.get("envelope")
    signals = UtteranceSignals(
        shard_id=shard_id,
        utt_id=row["utt_id"],
        exact_hash=row["exact_hash"],
        fingerprint=AudioFingerprint.from_bytes(row["sub_fingerprints"], row["active_frames"]),
        transcript_signature=None if signature is None else np.frombuffer(signature, "<u8").astype(np.uint64),
        transcript_words=row["transcript_words"],
        speaker_embedding=None if speaker is None else np.frombuffer(speaker, "<f2").astype(np.float32),
        shift=None
        if envelope is None
        else ShiftSignature(
            np.frombuffer(envelope, "<f2").astype(np.float32),
            np.frombuffer(row["spectral_shape"], np.int8).reshape(SHAPE_SEGMENTS, -1),
            row["speech_span_s"],
        ),
    )
    return signals, (row["representative_shard"], row["representative_utt"])


def read_shard_entries(data_root: DataRoot, shard: IndexedShard) -> list[IndexEntry]:
    """Every utterance of one committed shard, in rank order."""
    relative = layout.near_duplicates_index_entries(shard.shard_id, shard.entries_version)
    return [_parse_entry(shard.shard_id, row) for row in data_root.read_parquet(relative).to_pylist()]


def read_entry_rows(data_root: DataRoot, shard_id: str, version: str, ranks: np.ndarray) -> tuple[list[dict], int]:
    """The entries rows of a shard's utterances ``ranks`` (as Python dicts, in that order) and the rows
    read for them: only the row groups that hold them. :class:`IndexDamaged` where the file cannot be
    read or holds fewer rows than indexed."""
    relative = layout.near_duplicates_index_entries(shard_id, version)
    try:
        with data_root.open_parquet(relative) as parquet:
            # Row groups as the file has them (64 rows; one for files written before that).
            metadata = parquet.metadata
            starts = np.cumsum([0] + [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
            of_rank = np.searchsorted(starts, ranks, side="right") - 1
            groups = sorted(set(of_rank.tolist()))
            table = parquet.read_row_groups(groups)
    except (UnreadableIntermediate, FileNotFoundError) as exc:
        raise IndexDamaged(f"entries of {shard_id} ({relative}) unreadable: {exc}", shard_id) from exc
    if int(ranks.max()) >= int(starts[-1]):
        raise IndexDamaged(f"entries of {shard_id} ({relative}) hold fewer rows than indexed", shard_id)
    first_row = {group: int(sum(starts[g + 1] - starts[g] for g in groups[:i])) for i, group in enumerate(groups)}
    at = [
        first_row[group] + rank - int(starts[group])
        for rank, group in zip(ranks.tolist(), of_rank.tolist(), strict=True)
    ]
    # Only the wanted rows become Python objects: a row group holds 64 utterances, most of them not
    # candidates, and turning a row into objects is most of its cost.
    return table.take(at).to_pylist(), table.num_rows
