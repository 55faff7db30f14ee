"""A country's segments, and the stamps and fingerprints that say when they changed (the filters that
decide which are published are :mod:`speechdata.hf.filters`; the split assignment step that records
them is :mod:`speechdata.hf.assignment`).

Segments come from the utterance index (``raw_shards``) of every shard meant for the dataset: rows
of that country that met the landing contract. A shard is meant for the dataset when its landed
metadata carries ASR transcripts (:data:`PUBLISHED_SHARD_MARKER`, filled in at least one row), as
every shard landed from aligned JSON does (with ``video_id``, ``transcript_id``, ``human_text``,
``cer`` and the transcript indices). Any other shard (a bridge-tuple shard, a Granary drop: text and
audio only) never feeds it, whatever its country. A row of a published shard that lacks one of the
dataset's fields (:data:`~speechdata.hf.filters.REQUIRED_FIELDS`) is filtered with the reason ``missing_<field>``: no
published column is ever all null. A segment whose utterance the near-duplicate stage rejected
(``shards/<shard>/near_duplicates.parquet``; a segment's ``key`` is its shard's ``utt_id``) is
filtered as ``near_duplicate``: the dataset publishes only the copy indexed first.

A long recording (one landed row longer than one training sample) that the ``alignments`` stage cut
into ``segment`` rows is one segment per aligned segment here, keyed ``<utt_id>+<index>`` as the
bridge keys them (:func:`with_recording_segments`): its audio span, its words as the text, the
recording's identity (so all its segments go to the recording's split).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterable, Iterator
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from speechdata.alignment.segmentation import MAX_SEGMENT_MS
from speechdata.bridge.segments import segment_key, segment_spans

# Where callers have always found them; they live with the filters.
from speechdata.hf.filters import RECORDING_ONLY_FIELDS, SegmentId, recording_id, segment_ids
from speechdata.hf.filters import REQUIRED_FIELDS as REQUIRED_FIELDS
from speechdata.hf.filters import SegmentLimits as SegmentLimits
from speechdata.hf.filters import filter_reasons as filter_reasons
from speechdata.hf.filters import word_error_rate as word_error_rate
from speechdata.hf.text_sources import is_blank, text_columns, with_pseudo_labels
from speechdata.io import layout
from speechdata.io.storage import DataRoot, escape_glob, read_parquet_handle
from speechdata.landing.extras import EXTRA_COLUMN, unpack_extras
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
        pa.field("text", pa.string()),
        pa.field("text_source", pa.string()),
        pa.field("asr_confidence", pa.float32()),
    ]
)


PUBLISHED_SHARD_MARKER = "asr_text"
"""The landed column that says a shard is meant for the HF dataset (filled in at least one row)."""


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
    # Unpacked, the JSON is read no more; kept, it would be copied into every segment row of a long
    # recording (whose JSON holds its whole transcript twice: 2 hours, 401 segments, ~80 MB).
    table = table.drop_columns([c for c in (EXTRA_COLUMN,) if c in table.column_names])
    marker = table[PUBLISHED_SHARD_MARKER] if PUBLISHED_SHARD_MARKER in table.column_names else None
    if marker is None or marker.null_count == table.num_rows:
        return None
    return with_recording_segments(data_root, shard_id, with_pseudo_labels(data_root, shard_id, table))


def with_recording_segments(data_root: DataRoot, shard_id: str, index: pa.Table) -> pa.Table:
    """The unpacked index with each long recording the aligner cut into segments replaced by one row per
    segment (docs/hf-splits.md, "Long recordings"): ``utt_id`` ``<utt_id>+<index>``, the span moved to
    the segment's (``segment_start_s``/``segment_end_s``, ``duration_s``), ``text`` (and ``human_text``
    where the recording's is landed) the segment's words, :data:`~speechdata.hf.filters.RECORDING_ONLY_FIELDS` null; every
    other column the recording's. A recording without segment rows stays one row."""
    durations = _column(index, "duration_s", pa.float64()).to_pylist()
    longer = [
        row for row, duration in enumerate(durations) if duration is not None and duration * 1000 > MAX_SEGMENT_MS
    ]
    # The alignments (every word of the shard) are read only for a shard that holds a long recording.
    if not longer or not data_root.exists(layout.alignments(shard_id)):
        return index
    spans = segment_spans(data_root, shard_id)
    utt_ids = index["utt_id"].to_pylist()
    long_rows = [row for row in longer if utt_ids[row] in spans]
    if not long_rows:
        return index
    pieces, expanded = [], []
    for row in long_rows:
        recording = index.slice(row, 1).to_pylist()[0]
        start_s = recording.get("segment_start_s") or 0.0
        end_s = recording.get("segment_end_s")
        end_s = start_s + recording["duration_s"] if end_s is None else end_s
        for position, text, start_ms, end_ms in spans[recording["utt_id"]]:
            first, last = start_s + start_ms / 1000, min(start_s + end_ms / 1000, end_s)
            if last <= first:
                continue
            segment = dict(recording)
            segment.update(
                utt_id=segment_key(recording["utt_id"], position),
                segment_start_s=first,
                segment_end_s=last,
                duration_s=last - first,
                text=text,
                **{name: None for name in RECORDING_ONLY_FIELDS if name in recording},
            )
            if "human_text" in segment and not is_blank(recording.get("human_text")):
                segment["human_text"] = text
            expanded.append(segment)
    keep = pc.invert(pc.is_in(index["utt_id"], pa.array([utt_ids[r] for r in long_rows], pa.string())))
    pieces.append(index.filter(keep))
    if expanded:
        pieces.append(pa.Table.from_pylist(expanded, schema=index.schema))
    return pa.concat_tables(pieces)


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
    """Per indexed shard: a stamp of its utterance index, near-duplicate list and alignment scores
    (whose pseudo-labels give text to rows landed without it) (size, time, inode or ETag), from three
    listings (on a local disk one directory listing and three ``stat`` calls a shard). A stamp that differs from the one recorded when the shard was read
    means it may have changed (a rewrite with the same rows reads it again and finds nothing new);
    an equal one means it did not, so a refresh reads only new and re-indexed shards."""
    names = (
        "utterances.parquet",
        PurePosixPath(near_duplicates("x")).name,
        PurePosixPath(layout.alignment_scores("x")).name,
    )
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
    """:func:`shard_stamps` on a local disk: one directory listing and a ``stat`` call per file a shard (a
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


def segments_fingerprint(segments: pa.Table, near_duplicate_ids: Collection[SegmentId] = frozenset()) -> str:
    """A content hash of a country's segments and which of them are near duplicates: what its build
    reads from the shards.

    Equal fingerprints mean the build would read the same rows and filter the same copies, so the
    country need not be rebuilt. With no near duplicate among the segments the hash is the rows' alone."""
    # A segment of a long recording is a copy when its recording is.
    copies = sorted({recording_id(segment_id) for segment_id in segment_ids(segments)} & set(near_duplicate_ids))
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
    texts = text_columns(
        table, pc.coalesce(_column(table, "human_text", pa.string()), _column(table, "text", pa.string()))
    )
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
            "human_text": texts["human_text"],
            "asr_text": _column(table, "asr_text", pa.string()),
            "cer": _column(table, "cer", pa.float64()),
            "transcript_start_idx": _column(table, "transcript_start_idx", pa.int32()),
            "transcript_end_idx": _column(table, "transcript_end_idx", pa.int32()),
            "text": texts["text"],
            "text_source": texts["text_source"],
            "asr_confidence": texts["asr_confidence"],
        },
        schema=SEGMENT_SCHEMA,
    )
