"""A country's segments, the filters that decide which are published, and the split assignment step.

Segments come from the utterance index (``raw_shards``) of every shard meant for the dataset: rows
of that country that met the landing contract. A shard is meant for the dataset when its landed
metadata carries ASR transcripts (:data:`PUBLISHED_SHARD_MARKER`, filled in at least one row), as
every shard landed from aligned JSON does (with ``video_id``, ``transcript_id``, ``human_text``,
``cer`` and the transcript indices). Any other shard (a bridge-tuple shard, a Granary drop: text and
audio only) never feeds it, whatever its country. A row of a published shard that lacks one of the
dataset's fields (:data:`REQUIRED_FIELDS`) is filtered with the reason ``missing_<field>``: no
published column is ever all null. A segment whose utterance the near-duplicate stage rejected
(``shards/<shard>/near_duplicates.parquet``; a segment's ``key`` is its shard's ``utt_id``) is
filtered as ``near_duplicate``: the dataset publishes only the copy indexed first.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from speechdata.alignment.formats import aligned_segment_range_problem
from speechdata.hf.splits import SplitTargets, assign_new_splits
from speechdata.hf.state import execute_many, registered_rows, rows_as_dicts, state_connection
from speechdata.io import layout
from speechdata.io.storage import DataRoot, escape_glob, read_parquet_handle
from speechdata.landing.extras import unpack_extras
from speechdata.landing.landed_audio import AudioNotFound, LandedAudio
from speechdata.quality.decisions import NEAR_DUPLICATE
from speechdata.quality.paths import near_duplicates

SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string()),
        pa.field("shard_id", pa.string()),
        pa.field("recording_id", pa.string()),
        pa.field("audio_path", pa.string()),
        pa.field("video_id", pa.string()),
        pa.field("transcript_id", pa.string()),
        pa.field("language", pa.string()),
        pa.field("start_s", pa.float64()),
        pa.field("end_s", pa.float64()),
        pa.field("duration_s", pa.float64()),
        pa.field("source_sample_rate", pa.int32()),
        pa.field("human_text", pa.string()),
        pa.field("asr_text", pa.string()),
        pa.field("cer", pa.float64()),
        pa.field("transcript_start_idx", pa.int32()),
        pa.field("transcript_end_idx", pa.int32()),
    ]
)


PUBLISHED_SHARD_MARKER = "asr_text"
"""The landed column that says a shard is meant for the HF dataset (filled in at least one row)."""

REQUIRED_FIELDS = (
    "language",
    "human_text",
    "asr_text",
    "cer",
    "transcript_id",
    "transcript_start_idx",
    "transcript_end_idx",
)
"""Segment fields every published row fills (``video_id`` falls back to the audio file's name)."""


@dataclass(frozen=True)
class SegmentLimits:
    """Which segments a dataset keeps: ``[min_duration_s, max_duration_s]`` and ``cer <= max_cer``."""

    min_duration_s: float = 3.0
    max_duration_s: float = 20.0
    max_cer: float | None = None
    """None keeps every CER (segments without one always pass)."""

    def __post_init__(self) -> None:
        # A NaN limit compares false with every value: it would keep every segment, silently.
        for name in ("min_duration_s", "max_duration_s", "max_cer"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"segment limit {name}={value!r} must be a finite number >= 0")


def published_shard_indexes(data_root: DataRoot) -> Iterator[tuple[str, pa.Table]]:
    """``(shard_id, utterance index)`` of every indexed shard meant for the HF dataset, in shard order.

    The index has the aligned JSON's fields unpacked from ``extra``; a shard whose index has no
    ``country`` column or no ASR transcript (:data:`PUBLISHED_SHARD_MARKER`) is left out."""
    for path in sorted(data_root.glob(f"{layout.SHARDS}/*/utterances.parquet")):
        shard_id = PurePosixPath(path).parent.name
        table = published_shard_index(data_root, shard_id)
        if table is not None:
            yield shard_id, table


def published_shard_index(data_root: DataRoot, shard_id: str) -> pa.Table | None:
    """The shard's utterance index with the aligned JSON's fields unpacked, or None when the shard
    is not meant for the HF dataset (no ``country`` column, no ASR transcript) or has no index."""
    path = data_root.path(layout.utterance_index(shard_id))
    try:
        handle = data_root.fs.open(path, "rb")
    except FileNotFoundError:
        return None
    with handle:
        names = set(pq.ParquetFile(handle).schema_arrow.names)
        handle.seek(0)
        table = read_parquet_handle(handle, [c for c in [*_INDEX_COLUMNS, "extra"] if c in names])
    if "country" not in names:
        return None
    # The aligned JSON's own fields ride in the landed metadata's ``extra`` namespace.
    table = unpack_extras(table, [f for f in SEGMENT_SCHEMA if f.name in _ALIGNED_JSON_FIELDS])
    marker = table[PUBLISHED_SHARD_MARKER] if PUBLISHED_SHARD_MARKER in table.column_names else None
    if marker is None or marker.null_count == table.num_rows:
        return None
    return table


def shard_country_segments(data_root: DataRoot, shard_id: str, country: str) -> pa.Table:
    """The shard's segments of ``country`` in :data:`SEGMENT_SCHEMA`, sorted by key (empty when the
    shard is not meant for the dataset or holds none)."""
    table = published_shard_index(data_root, shard_id)
    if table is None:
        return SEGMENT_SCHEMA.empty_table()
    rows = table.filter(pc.equal(table["country"], country))
    if not rows.num_rows:
        return SEGMENT_SCHEMA.empty_table()
    return _as_segments(rows, shard_id).sort_by([("key", "ascending")])


def shard_stamps(data_root: DataRoot) -> dict[str, str]:
    """Per indexed shard: a stamp of its utterance index and near-duplicate list (size, time, inode
    or ETag), from two listings. A stamp that differs from the one recorded when the shard was read
    means it may have changed (a rewrite with the same rows reads it again and finds nothing new);
    an equal one means it did not, so a refresh reads only new and re-indexed shards."""
    names = ("utterances.parquet", PurePosixPath(near_duplicates("x")).name)
    if data_root.is_local:
        return _local_shard_stamps(data_root.path(layout.SHARDS), names)
    root = escape_glob(data_root.root)
    found: dict[str, list[str]] = {}
    for name in names:
        listed = data_root.fs.glob(f"{root}/{layout.SHARDS}/*/{name}", detail=True)
        for path, info in sorted(listed.items()):
            found.setdefault(PurePosixPath(path).parent.name, []).append(f"{name}={_file_stamp(info)}")
    return {shard_id: "|".join(parts) for shard_id, parts in sorted(found.items()) if parts[0].startswith("utter")}


def _local_shard_stamps(shards_dir: str, names: tuple[str, ...]) -> dict[str, str]:
    """:func:`shard_stamps` on a local disk: one directory listing and two ``stat`` calls a shard (a
    glob lists every shard folder whole), the same stamps as fsspec's ``size:mtime:ino``."""
    try:
        entries = sorted(entry.name for entry in os.scandir(shards_dir) if entry.is_dir())
    except FileNotFoundError:
        return {}
    stamps = {}
    for shard_id in entries:
        parts = []
        for name in names:
            try:
                st = os.stat(f"{shards_dir}/{shard_id}/{name}")
            except FileNotFoundError:
                continue
            parts.append(f"{name}={st.st_size}:{st.st_mtime}:{st.st_ino}")
        if parts and parts[0].startswith(f"{names[0]}="):
            stamps[shard_id] = "|".join(parts)
    return stamps


def _file_stamp(info: dict) -> str:
    return ":".join(str(info[k]) for k in ("size", "mtime", "ino", "LastModified", "ETag", "etag") if k in info)


def country_segments(data_root: DataRoot, country: str) -> pa.Table:
    """Every indexed segment of ``country`` over the shards meant for the dataset, in
    :data:`SEGMENT_SCHEMA`, sorted by shard and key.

    A segment is identified by ``(shard_id, key)``: shards name their utterances independently
    (every Granary shard starts at ``utt_000000``)."""
    pieces = []
    for shard_id, table in published_shard_indexes(data_root):
        rows = table.filter(pc.equal(table["country"], country))
        if rows.num_rows:
            pieces.append(_as_segments(rows, shard_id))
    if not pieces:
        return SEGMENT_SCHEMA.empty_table()
    return pa.concat_tables(pieces).sort_by([("shard_id", "ascending"), ("key", "ascending")])


SegmentId = tuple[str, str]
"""``(shard_id, key)``: a segment's identity; ``key`` is the utterance's ``utt_id`` in its shard."""


def near_duplicate_segments(data_root: DataRoot, shard_ids: Iterable[str]) -> frozenset[SegmentId]:
    """``(shard_id, utt_id)`` of every utterance of ``shard_ids`` that the near-duplicate stage rejected.

    A shard whose ``near_duplicates.parquet`` is not written yet rejects nothing; one without a
    ``utt_id`` column fails naming the file."""
    found: set[SegmentId] = set()
    for shard_id in sorted(set(shard_ids)):
        relative = near_duplicates(shard_id)
        if not data_root.exists(relative):
            continue
        table = data_root.read_parquet(relative)
        if "utt_id" not in table.column_names:
            raise ValueError(f"{data_root.uri(relative)}: missing column 'utt_id'")
        found.update((shard_id, utt_id) for utt_id in table["utt_id"].to_pylist())
    return frozenset(found)


def _segment_ids(segments: pa.Table) -> list[SegmentId]:
    return list(zip(segments["shard_id"].to_pylist(), segments["key"].to_pylist(), strict=True))


def segments_fingerprint(segments: pa.Table, near_duplicate_ids: Collection[SegmentId] = frozenset()) -> str:
    """A content hash of a country's segments and which of them are near duplicates: what its build
    reads from the shards.

    Equal fingerprints mean the build would read the same rows and filter the same copies, so the
    country need not be rebuilt. With no near duplicate among the segments the hash is the rows' alone."""
    copies = sorted(set(_segment_ids(segments)) & set(near_duplicate_ids))
    return _columns_fingerprint(((name, segments[name].to_pylist()) for name in segments.column_names), copies)


def _columns_fingerprint(columns: Iterable[tuple[str, list]], copies: list[SegmentId]) -> str:
    digest = hashlib.sha256()
    for name, values in columns:
        digest.update(json.dumps([name, values], default=str).encode())
    if copies:
        digest.update(json.dumps([NEAR_DUPLICATE, copies]).encode())
    return digest.hexdigest()


def country_input_fingerprints(data_root: DataRoot) -> dict[str, str]:
    """:func:`country_fingerprint` of every country some published shard holds, near duplicates included.

    Each shard's per-country fingerprints are kept (in this process) with the shard's stamp
    (:func:`shard_stamps`): a call reads only the shards indexed, re-indexed or given near-duplicate
    decisions since the last, so the sensor's cost per new shard does not grow with the corpus."""
    stamps = shard_stamps(data_root)
    cache = _SHARD_FINGERPRINTS.setdefault(data_root.url, {})
    for shard_id in set(cache) - set(stamps):
        del cache[shard_id]
    by_country: dict[str, dict[str, str]] = {}
    for shard_id, stamp in stamps.items():
        cached = cache.get(shard_id)
        if cached is None or cached[0] != stamp:
            cached = cache[shard_id] = (stamp, shard_fingerprints(data_root, shard_id))
        for country, fingerprint in cached[1].items():
            by_country.setdefault(country, {})[shard_id] = fingerprint
    return {country: country_fingerprint(fingerprints) for country, fingerprints in sorted(by_country.items())}


_SHARD_FINGERPRINTS: dict[str, dict[str, tuple[str, dict[str, str]]]] = {}
"""``{data root url: {shard_id: (stamp, {country: fingerprint})}}``: one small entry per shard."""


def shard_fingerprints(data_root: DataRoot, shard_id: str) -> dict[str, str]:
    """``{country: segments_fingerprint}`` of the shard's rows of each country (none when the shard
    is not meant for the dataset)."""
    table = published_shard_index(data_root, shard_id)
    if table is None:
        return {}
    countries = sorted(c for c in pc.unique(table["country"]).to_pylist() if c is not None)
    copies = near_duplicate_segments(data_root, [shard_id]) if countries else frozenset()
    return {
        country: segments_fingerprint(
            _as_segments(table.filter(pc.equal(table["country"], country)), shard_id).sort_by([("key", "ascending")]),
            copies,
        )
        for country in countries
    }


def country_fingerprint(shard_fingerprints: dict[str, str]) -> str:
    """A country's input fingerprint from its shards' (``{shard_id: segments_fingerprint of the shard's
    rows of the country}``, shards holding none left out): equal exactly when every shard's rows and
    near-duplicate decisions are; :data:`EMPTY_INPUT_FINGERPRINT` when no shard holds the country."""
    if not shard_fingerprints:
        return EMPTY_INPUT_FINGERPRINT
    return hashlib.sha256(json.dumps(sorted(shard_fingerprints.items())).encode()).hexdigest()


EMPTY_INPUT_FINGERPRINT = _columns_fingerprint(((name, []) for name in SEGMENT_SCHEMA.names), [])
"""The fingerprint of a country no published shard holds any more (all its rows withdrawn): that of
``SEGMENT_SCHEMA.empty_table()``, computed without building a table, which would load pandas at import."""


_ALIGNED_JSON_FIELDS = (
    "video_id",
    "transcript_id",
    "human_text",
    "asr_text",
    "cer",
    "transcript_start_idx",
    "transcript_end_idx",
)

_INDEX_COLUMNS = [
    "utt_id",
    "audio_path",
    "text",
    "language",
    "country",
    "video_id",
    "transcript_id",
    "human_text",
    "asr_text",
    "cer",
    "transcript_start_idx",
    "transcript_end_idx",
    "segment_start_s",
    "segment_end_s",
    "duration_s",
    "source_sample_rate",
]


def _column(table: pa.Table, name: str, kind: pa.DataType) -> pa.Array:
    if name not in table.column_names:
        return pa.nulls(table.num_rows, kind)
    return table[name].combine_chunks().cast(kind)


def _as_segments(table: pa.Table, shard_id: str) -> pa.Table:
    n = table.num_rows
    audio_path = _column(table, "audio_path", pa.string())
    video_id = _column(table, "video_id", pa.string())
    fallback_recording = pc.binary_join_element_wise(pa.array([shard_id] * n, pa.string()), audio_path, "/")
    human = _column(table, "human_text", pa.string())
    return pa.table(
        {
            "key": _column(table, "utt_id", pa.string()),
            "shard_id": pa.array([shard_id] * n, pa.string()),
            "recording_id": pc.coalesce(video_id, fallback_recording),
            "audio_path": audio_path,
            "video_id": pc.coalesce(video_id, pa.array([PurePosixPath(p).stem for p in audio_path.to_pylist()])),
            "transcript_id": _column(table, "transcript_id", pa.string()),
            "language": _column(table, "language", pa.string()),
            "start_s": _column(table, "segment_start_s", pa.float64()),
            "end_s": _column(table, "segment_end_s", pa.float64()),
            "duration_s": _column(table, "duration_s", pa.float64()),
            "source_sample_rate": _column(table, "source_sample_rate", pa.int32()),
            "human_text": pc.coalesce(human, _column(table, "text", pa.string())),
            "asr_text": _column(table, "asr_text", pa.string()),
            "cer": _column(table, "cer", pa.float64()),
            "transcript_start_idx": _column(table, "transcript_start_idx", pa.int32()),
            "transcript_end_idx": _column(table, "transcript_end_idx", pa.int32()),
        },
        schema=SEGMENT_SCHEMA,
    )


def filter_reasons(
    segments: pa.Table, limits: SegmentLimits, near_duplicate_ids: Collection[SegmentId] = frozenset()
) -> list[str | None]:
    """Per segment: None when it is kept, else ``missing_<field>`` (a :data:`REQUIRED_FIELDS` is
    null), ``duration_out_of_range`` (not a finite length >= 0), ``cer_out_of_range`` (not a finite
    rate >= 0), ``transcript_indexes_out_of_range`` (not ``0 <= start <= end``), ``too_short``, ``too_long``, ``cer_above_max`` or ``near_duplicate`` (its ``(shard_id,
    key)`` is in ``near_duplicate_ids``), the first that applies: a copy that fails on its own is
    counted under its own reason, as the quality filter does."""
    reasons: list[str | None] = []
    required = {name: segments[name].to_pylist() for name in REQUIRED_FIELDS}
    starts, ends = segments["transcript_start_idx"].to_pylist(), segments["transcript_end_idx"].to_pylist()
    copies = set(near_duplicate_ids)
    for row, (duration, cer, segment_id) in enumerate(
        zip(segments["duration_s"].to_pylist(), segments["cer"].to_pylist(), _segment_ids(segments), strict=True)
    ):
        missing = next((name for name, values in required.items() if values[row] is None), None)
        if missing is not None:
            reasons.append(f"missing_{missing}")
        elif duration is None or not math.isfinite(duration) or duration < 0:
            reasons.append("duration_out_of_range")  # NaN compares false with every limit: never kept
        elif cer is not None and aligned_segment_range_problem(cer, None, None) is not None:
            reasons.append("cer_out_of_range")
        elif aligned_segment_range_problem(None, starts[row], ends[row]) is not None:
            reasons.append("transcript_indexes_out_of_range")
        elif duration < limits.min_duration_s:
            reasons.append("too_short")
        elif duration > limits.max_duration_s:
            reasons.append("too_long")
        elif limits.max_cer is not None and cer is not None and cer > limits.max_cer:
            reasons.append("cer_above_max")
        elif segment_id in copies:
            reasons.append(NEAR_DUPLICATE)
        else:
            reasons.append(None)
    return reasons


def word_error_rate(reference: str | None, hypothesis: str | None) -> float | None:
    """WER of the ASR transcript against the human one (jiwer, words split on whitespace).

    Both empty: 0.0. An empty reference with a non-empty hypothesis: 1.0 (every word inserted; WER
    is undefined there and 1.0 is the cap a reader expects). No ASR transcript at all: None.
    """
    if hypothesis is None:
        return None
    reference, hypothesis = (reference or "").strip(), hypothesis.strip()
    if not reference:
        return 0.0 if not hypothesis else 1.0
    if not hypothesis:
        return 1.0
    import jiwer  # loaded by the dataset build that scores transcripts, not by the code location

    return float(jiwer.wer(reference, hypothesis))


@dataclass
class AssignmentSummary:
    """What one split-assignment refresh found and did."""

    country: str
    segments: int = 0
    new_segments: int = 0
    new_recordings: dict[str, int] = field(default_factory=dict)
    recordings_by_split: dict[str, int] = field(default_factory=dict)
    hours_by_split: dict[str, float] = field(default_factory=dict)
    filtered_by_reason: dict[str, int] = field(default_factory=dict)
    missing_recordings: list[str] = field(default_factory=list)
    withdrawn: int = 0
    """Segments recorded earlier whose shard no longer holds them (re-landed without them, or elsewhere)."""
    input_fingerprint: str = EMPTY_INPUT_FINGERPRINT
    """:func:`country_fingerprint` of the country's segments after this refresh: what it is built from."""
    shards_read: int = 0
    """Shards whose stamp changed since the last refresh: the only ones read."""

    @property
    def shares(self) -> dict[str, float]:
        total = sum(self.hours_by_split.values()) or 1.0
        return {split: hours / total for split, hours in self.hours_by_split.items()}


def refresh_split_assignments(
    data_root: DataRoot,
    dataset: str,
    country: str,
    limits: SegmentLimits = SegmentLimits(),
    targets: SplitTargets = SplitTargets(),
    seed: int = 0,
) -> AssignmentSummary:
    """Record the segments of ``country`` in the shards that changed and assign their new recordings to splits.

    Only the shards whose stamp (:func:`shard_stamps`) differs from the one the state recorded are
    read (every shard, the first time a state is refreshed): a new shard costs what it holds, not
    what the country holds. Existing recordings keep their split; the usable duration of those the
    changed shards touch is brought up to date. Segments of a changed shard not yet written to a
    dataset file get their filter status recomputed with ``limits`` and the shard's near-duplicate
    list; a near duplicate already written to a file is ``filtered`` too, keeping its file until the
    build rewrites that file's part without it. Segments of a shard that is gone, or that a changed
    shard no longer holds, are withdrawn.
    """
    state_path = layout.hf_state_database(dataset, country)
    stamps = shard_stamps(data_root)
    with state_connection(data_root, state_path) as db:
        recorded = dict(db.execute("SELECT shard_id, stamp FROM shards").fetchall())
        if not recorded:  # a state refreshed before shards were tracked: its shards are read once
            recorded = {shard: None for (shard,) in db.execute("SELECT DISTINCT shard_id FROM segments").fetchall()}
    changed = sorted(shard for shard, stamp in stamps.items() if recorded.get(shard, "") != stamp)
    gone = sorted(set(recorded) - set(stamps))
    pieces, copies, shard_fingerprint = [], set(), {}
    for shard_id in changed:
        rows = shard_country_segments(data_root, shard_id, country)
        shard_copies = near_duplicate_segments(data_root, [shard_id]) if rows.num_rows else frozenset()
        shard_fingerprint[shard_id] = segments_fingerprint(rows, shard_copies)
        copies |= shard_copies
        pieces.append(rows)
    segments = pa.concat_tables([SEGMENT_SCHEMA.empty_table(), *pieces])
    reasons = filter_reasons(segments, limits, copies)
    durations = segments["duration_s"].to_pylist()
    usable = [d if r is None else 0.0 for d, r in zip(durations, reasons, strict=True)]
    summary = AssignmentSummary(country)
    usable_s: dict[str, float] = {}
    first_row: dict[str, int] = {}
    recording_ids = segments["recording_id"].to_pylist()
    for i, (recording_id, seconds) in enumerate(zip(recording_ids, usable, strict=True)):
        first_row.setdefault(recording_id, i)
        usable_s[recording_id] = usable_s.get(recording_id, 0.0) + seconds
    scope = {"shard_id": pa.array([*changed, *gone], pa.string())}
    with state_connection(data_root, state_path) as db, registered_rows(db, "scope", scope):
        touched = {"recording_id": pa.array(sorted(usable_s), pa.string())}
        with registered_rows(db, "touched", touched):
            existing = dict(
                db.execute(
                    "SELECT recording_id, split FROM recordings WHERE recording_id IN (SELECT recording_id FROM touched)"
                ).fetchall()
            )
        totals = {
            split: (int(n), float(hours) * 3600.0)
            for split, n, hours in db.execute(
                "SELECT split, count(*), coalesce(sum(duration_hours), 0) FROM recordings GROUP BY split"
            ).fetchall()
        }
        new = assign_new_splits({r: s for r, s in usable_s.items() if r not in existing}, totals, targets, seed)
        sizes = _recording_sizes(data_root, segments, {r: first_row[r] for r in new}, summary)
        fresh_recordings = sorted(new)
        columns = {
            "recording_id": pa.array(fresh_recordings, pa.string()),
            "video_id": pa.array([segments["video_id"][first_row[r]].as_py() for r in fresh_recordings], pa.string()),
            "shard_id": pa.array([segments["shard_id"][first_row[r]].as_py() for r in fresh_recordings], pa.string()),
            "audio_path": pa.array(
                [segments["audio_path"][first_row[r]].as_py() for r in fresh_recordings], pa.string()
            ),
            "source_sample_rate": pa.array(
                [segments["source_sample_rate"][first_row[r]].as_py() for r in fresh_recordings], pa.int32()
            ),
            "duration_hours": pa.array([usable_s[r] / 3600.0 for r in fresh_recordings], pa.float64()),
            "size_mb": pa.array([sizes.get(r) for r in fresh_recordings], pa.float64()),
            "split": pa.array([new[r] for r in fresh_recordings], pa.string()),
        }
        with registered_rows(db, "new_recordings", columns):
            db.execute(
                "INSERT INTO recordings (recording_id, video_id, shard_id, audio_path, source_sample_rate, "
                "duration_hours, size_mb, split) SELECT recording_id, video_id, shard_id, audio_path, "
                "source_sample_rate, duration_hours, size_mb, split FROM new_recordings"
            )
        splits = {**existing, **new}
        shard_ids, keys = segments["shard_id"].to_pylist(), segments["key"].to_pylist()
        summary.withdrawn = _withdraw_missing(db, shard_ids, keys)
        known = set(
            db.execute("SELECT shard_id, key FROM segments WHERE shard_id IN (SELECT shard_id FROM scope)").fetchall()
        )
        is_new = [(shard, key) not in known for shard, key in zip(shard_ids, keys, strict=True)]

        def where(flag: bool, values: list) -> list:
            return [v for v, n in zip(values, is_new, strict=True) if n == flag]

        fresh = {
            "shard_id": pa.array(where(True, shard_ids), pa.string()),
            "key": pa.array(where(True, keys), pa.string()),
            "recording_id": pa.array(where(True, recording_ids), pa.string()),
            "split": pa.array([splits[r] for r in where(True, recording_ids)], pa.string()),
            "status": pa.array(["filtered" if r else "pending" for r in where(True, reasons)], pa.string()),
            "reason": pa.array(where(True, reasons), pa.string()),
            "usable_s": pa.array(where(True, usable), pa.float64()),
        }
        with registered_rows(db, "fresh", fresh):
            db.execute(
                "INSERT INTO segments (shard_id, key, recording_id, split, status, reason, usable_s) "
                "SELECT shard_id, key, recording_id, split, status, reason, usable_s FROM fresh"
            )
        again = {
            "shard_id": pa.array(where(False, shard_ids), pa.string()),
            "key": pa.array(where(False, keys), pa.string()),
            "reason": pa.array(where(False, reasons), pa.string()),
            "usable_s": pa.array(where(False, usable), pa.float64()),
        }
        with registered_rows(db, "again", again):
            db.execute(
                "UPDATE segments SET usable_s = again.usable_s FROM again "
                "WHERE segments.shard_id = again.shard_id AND segments.key = again.key"
            )
            db.execute(
                "UPDATE segments SET status = CASE WHEN again.reason IS NULL THEN 'pending' ELSE 'filtered' END, "
                "reason = again.reason, updated_at = current_timestamp FROM again "
                "WHERE segments.shard_id = again.shard_id AND segments.key = again.key "
                "AND segments.file IS NULL AND segments.status IN ('pending', 'filtered') "
                "AND coalesce(segments.reason, '') <> 'recording_already_published'"
            )
        # A copy published before its shard's near duplicates were decided leaves the dataset: the
        # build rewrites its part without it (sealed train subsets too), as for a withdrawal.
        published_copies = [
            segment_id
            for segment_id, reason in zip(_segment_ids(segments), reasons, strict=True)
            if reason == NEAR_DUPLICATE
        ]
        with registered_rows(db, "copies_found", _identities(published_copies)):
            db.execute(
                f"UPDATE segments SET status = 'filtered', reason = '{NEAR_DUPLICATE}', updated_at = current_timestamp "
                "FROM copies_found WHERE segments.shard_id = copies_found.shard_id AND segments.key = copies_found.key "
                "AND segments.file IS NOT NULL AND segments.status IN ('pending', 'uploaded')"
            )
        # Usable durations of the recordings the changed shards touched, over all their shards.
        db.execute(
            "UPDATE recordings SET duration_hours = coalesce(t.seconds, 0) / 3600.0 FROM ("
            "  SELECT r.recording_id, sum(s.usable_s) FILTER (WHERE s.status <> 'withdrawn') AS seconds "
            "  FROM recordings r LEFT JOIN segments s USING (recording_id) "
            "  WHERE r.recording_id IN (SELECT recording_id FROM segments WHERE shard_id IN (SELECT shard_id FROM scope)) "
            "  GROUP BY r.recording_id) t WHERE recordings.recording_id = t.recording_id"
        )
        _record_shards(db, changed, gone, stamps, shard_fingerprint, Counter(shard_ids))
        summary.input_fingerprint = country_fingerprint(
            dict(
                db.execute(
                    "SELECT shard_id, fingerprint FROM shards WHERE fingerprint <> ?", [EMPTY_INPUT_FINGERPRINT]
                ).fetchall()
            )
        )
        summary.segments = db.execute("SELECT count(*) FROM segments WHERE status <> 'withdrawn'").fetchall()[0][0]
        summary.new_segments = len(fresh["key"])
        summary.new_recordings = dict(Counter(new.values()))
        for row in rows_as_dicts(
            db, "SELECT split, count(*) AS n, sum(duration_hours) AS hours FROM recordings GROUP BY split"
        ):
            summary.recordings_by_split[row["split"]] = int(row["n"])
            summary.hours_by_split[row["split"]] = float(row["hours"])
        summary.filtered_by_reason = dict(
            db.execute(
                "SELECT reason, count(*) FROM segments WHERE status = 'filtered' GROUP BY reason ORDER BY reason"
            ).fetchall()
        )
        summary.shards_read = len(changed)
    return summary


def _identities(identities: list[SegmentId]) -> dict[str, pa.Array]:
    return {
        "shard_id": pa.array([shard for shard, _ in identities], pa.string()),
        "key": pa.array([key for _, key in identities], pa.string()),
    }


def _record_shards(
    db,
    changed: list[str],
    gone: list[str],
    stamps: dict[str, str],
    fingerprints: dict[str, str],
    counts: dict[str, int],
) -> None:
    """Record each read shard's stamp and fingerprint; a shard whose rows of the country changed (or
    that the state names) gets its published index written and its ledger checked by the next build."""
    previous = dict(db.execute("SELECT shard_id, fingerprint FROM shards").fetchall())
    with registered_rows(db, "read_shards", {"shard_id": pa.array(changed, pa.string())}):
        named = {
            shard
            for (shard,) in db.execute(
                "SELECT DISTINCT shard_id FROM segments WHERE shard_id IN (SELECT shard_id FROM read_shards)"
            ).fetchall()
        }
    rows = []
    for shard_id in changed:
        fingerprint = fingerprints[shard_id]
        feeds = fingerprint != EMPTY_INPUT_FINGERPRINT or shard_id in named
        was = previous.get(shard_id, EMPTY_INPUT_FINGERPRINT) != EMPTY_INPUT_FINGERPRINT
        dirty = feeds or was
        rows.append([shard_id, stamps[shard_id], fingerprint, dirty, dirty, counts.get(shard_id, 0)])
    execute_many(
        db,
        "INSERT INTO shards (shard_id, stamp, fingerprint, needs_index, needs_gate, segments) VALUES (?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (shard_id) DO UPDATE SET stamp = excluded.stamp, fingerprint = excluded.fingerprint, "
        "segments = excluded.segments, "
        "needs_index = shards.needs_index OR excluded.needs_index, needs_gate = shards.needs_gate OR excluded.needs_gate",
        rows,
    )
    execute_many(db, "DELETE FROM shards WHERE shard_id = ?", [[shard_id] for shard_id in gone])


def _withdraw_missing(db, shard_ids: list[str], keys: list[str]) -> int:
    """Mark the recorded segments of the shards in ``scope`` (the changed and gone shards) that those
    shards no longer hold; returns how many.

    One never written to a file is forgotten at once. One in a dataset file becomes ``withdrawn``:
    the build rewrites its part without it (sealed train subsets included) and then forgets it. A
    withdrawn segment landed again before that rewrite is restored (its file still holds it).
    """
    present = {"shard_id": pa.array(shard_ids, pa.string()), "key": pa.array(keys, pa.string())}
    with registered_rows(db, "present", present):
        here = "EXISTS (SELECT 1 FROM present p WHERE p.shard_id = segments.shard_id AND p.key = segments.key)"
        gone = f"segments.shard_id IN (SELECT shard_id FROM scope) AND NOT {here}"
        db.execute(
            "UPDATE segments SET status = CASE WHEN f.status = 'uploaded' THEN 'uploaded' ELSE 'pending' END, "
            f"updated_at = current_timestamp FROM files f WHERE segments.status = 'withdrawn' "
            f"AND f.path_in_repo = segments.file AND {here}"
        )
        count = db.execute(f"SELECT count(*) FROM segments WHERE status <> 'withdrawn' AND {gone}").fetchall()[0][0]
        db.execute(f"DELETE FROM segments WHERE file IS NULL AND {gone}")
        db.execute(
            f"UPDATE segments SET status = 'withdrawn', updated_at = current_timestamp WHERE file IS NOT NULL AND {gone}"
        )
        # The parts holding them are written again without them.
        db.execute(
            "UPDATE shards SET needs_index = true, needs_gate = true WHERE shard_id IN "
            "(SELECT DISTINCT shard_id FROM segments WHERE status = 'withdrawn')"
        )
    return int(count)


def _recording_sizes(
    data_root: DataRoot, segments: pa.Table, rows: dict[str, int], summary: AssignmentSummary
) -> dict[str, float]:
    """Size in MB of each recording's landed file (the original publishing script's ``size_mb``)."""
    sizes: dict[str, float] = {}
    by_shard: dict[str, list[tuple[str, str]]] = {}
    for recording_id, row in rows.items():
        by_shard.setdefault(segments["shard_id"][row].as_py(), []).append(
            (recording_id, segments["audio_path"][row].as_py())
        )
    for shard_id, recordings in sorted(by_shard.items()):
        with LandedAudio(data_root, shard_id) as audio:
            for recording_id, audio_path in recordings:
                try:
                    sizes[recording_id] = audio.size_bytes(audio_path) / 1e6
                except AudioNotFound as exc:
                    summary.missing_recordings.append(str(exc))
    return sizes
