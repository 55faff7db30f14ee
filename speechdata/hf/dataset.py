"""Build one country's Hugging Face dataset in the Hub's parquet layout, with bounded memory.

Layout under ``hf/<dataset>/`` (what the Hub stores after ``push_to_hub``)::

    README.md                                       card; its ``configs`` YAML lists every country's splits
    <country>/test-00000-of-00001.parquet
    <country>/validation-00000-of-00001.parquet
    <country>/train_1-00000-of-00003.parquet ...    one split per train subset, each within the size budget

Rows follow the published dataset's features (:func:`hf_features`) plus ``shard_id``: a row is ``(shard_id, key)``,
since shards name their utterances independently. Audio is cut from the landed long recording,
downmixed to mono and stored as 16-bit FLAC at the country's sample rate: the configured one, or
else the rate that carries most of the country's usable audio (fixed at the first build and kept in
the state, so every file of a country agrees; recordings at other rates are resampled with soxr).

Segments are streamed one recording at a time into parquet writers, so memory holds one
recording's encoded segments, whatever the size of the country. ``test`` and ``validation`` are
rebuilt when their set of segments changes. Train subsets are sealed: once written, a subset is
never rebuilt; new train recordings form new subsets (``train_<n+1>``...), and new segments of a
recording already published are recorded as filtered (``recording_already_published``). The one
rewrite of a sealed subset drops what a re-landing withdrew (state status ``withdrawn``) or what
was found a near duplicate after it was written (``filtered`` still naming its file): same subset,
fewer rows, new content-named files.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pyarrow as pa

from speechdata.hf.files import PARQUET_RESERVE, SplitFiles
from speechdata.hf.filters import SegmentLimits
from speechdata.hf.part_commit import commit_part
from speechdata.hf.segment_writer import SegmentWriter
from speechdata.hf.segment_writer import hf_features as hf_features  # where callers have always found it
from speechdata.hf.segments import SEGMENT_SCHEMA, shard_country_segments
from speechdata.hf.splits import TEST, TRAIN, VALIDATION, train_subset_name
from speechdata.hf.state import execute_many, get_setting, rows_as_dicts, set_setting, state_connection
from speechdata.hf.stats import write_country_stats
from speechdata.io import layout
from speechdata.io.storage import DataRoot

DEFAULT_DATASET = "speech-segments"


@dataclass(frozen=True)
class DatasetOptions:
    dataset: str = DEFAULT_DATASET
    limits: SegmentLimits = SegmentLimits()
    sample_rate: int | None = None
    """None: the rate that carries most of the country's usable audio."""
    max_split_size_gb: float = 10.0
    """Budget of one train subset (its parquet files together)."""
    max_file_mb: float = 500.0
    """Parquet files roll over at this size (the Hub's default shard size)."""


@dataclass
class BuildSummary:
    country: str
    sample_rate: int | None = None
    written: list[SplitFiles] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)
    """``(shard_id, key)`` -> why its audio could not be cut."""
    rewritten_for_withdrawal: list[str] = field(default_factory=list)
    """Splits written again because a re-landing withdrew some of their segments (sealed subsets included)."""
    already_published: int = 0
    max_recording_buffer_bytes: int = 0
    audio_seconds: float = 0.0


def build_country_dataset(
    data_root: DataRoot, country: str, options: DatasetOptions = DatasetOptions()
) -> BuildSummary:
    """Write the parts of ``country``'s splits whose content changed; record files and segment statuses in the state.

    A *part* is a split's files holding one shard's segments. Only these are written: the parts of
    the shards with new segments (a new shard's ``test``, ``validation`` and train parts), parts
    holding a segment withdrawn or found a near duplicate after it was written, and parts a killed
    build left unrecorded. Only those shards' utterance indexes are read; every other file stays
    as it is, bytes and time."""
    summary = BuildSummary(country)
    state_path = layout.hf_state_database(options.dataset, country)
    with state_connection(data_root, state_path) as db:
        # New segments of a train recording already in a subset are not added to it.
        late = db.execute(
            "UPDATE segments SET status = 'filtered', reason = 'recording_already_published', "
            "updated_at = current_timestamp FROM recordings r WHERE segments.recording_id = r.recording_id "
            "AND segments.split = 'train' AND segments.file IS NULL AND segments.status = 'pending' "
            "AND r.subset_id IS NOT NULL RETURNING segments.shard_id"
        ).fetchall()
        if late:
            execute_many(
                db, "UPDATE shards SET needs_index = true WHERE shard_id = ?", [[s] for s in {s for (s,) in late}]
            )
        parts, rewritten, new_train_shards = _dirty_parts(db)
    summary.already_published = len(late)
    shards = sorted({shard for _, shard in parts} | new_train_shards)
    segments = pa.concat_tables(
        [SEGMENT_SCHEMA.empty_table(), *(shard_country_segments(data_root, shard, country) for shard in shards)]
    )
    position = {identity: i for i, identity in enumerate(_segment_identities(segments))}
    with state_connection(data_root, state_path) as db:
        states = _part_states(db, shards)
        recordings = {
            r["recording_id"]: r
            for r in rows_as_dicts(
                db,
                "SELECT recording_id, split, subset_id FROM recordings WHERE recording_id IN "
                "(SELECT DISTINCT recording_id FROM segments WHERE shard_id IN (SELECT unnest(?::VARCHAR[])))",
                [shards],
            )
        }
        sample_rate = _country_sample_rate(db, options, segments, states)
        if get_setting(db, "language") is None and segments.num_rows:
            languages = [v for v in segments["language"].to_pylist() if v]
            if languages:
                set_setting(db, "language", languages[0])
    summary.sample_rate = sample_rate
    usable = [s for s in states if s["id"] in position]
    writer = SegmentWriter(data_root, options, country, sample_rate, segments, position, summary)
    by_part = _by_part(usable, recordings)
    for split, shard_id in sorted(parts, key=lambda part: (_split_order(part[0]), part[1])):
        if split in rewritten and split not in summary.rewritten_for_withdrawal:
            summary.rewritten_for_withdrawal.append(split)
        subset_id = int(split.removeprefix(f"{TRAIN}_")) if split.startswith(f"{TRAIN}_") else None
        keys = by_part.get((split, shard_id), [])
        _record_intent(data_root, state_path, split, shard_id)
        files = writer.write(split, shard_id, writer.by_recording(keys, recordings))
        commit_part(data_root, state_path, files, shard_id, keys, summary, subset_id=subset_id)
    _pack_new_train(data_root, state_path, writer, options, usable, recordings, summary, by_part)
    _retire_legacy_files(data_root, state_path, options.dataset)
    with state_connection(data_root, state_path) as db:
        written = {f.split for f in summary.written}
        summary.unchanged = [
            split
            for split in sorted(
                {
                    s
                    for (s,) in db.execute(
                        "SELECT DISTINCT split FROM files WHERE split IS NOT NULL AND status <> 'deleted'"
                    ).fetchall()
                },
                key=_split_order,
            )
            if split not in written
        ]
    write_country_stats(data_root, options.dataset, country)
    return summary


def _split_order(split: str) -> tuple[int, int, str]:
    if split in (TEST, VALIDATION):
        return (0 if split == TEST else 1, 0, split)
    number = split.rsplit("_", 1)[-1]
    return (2, int(number) if number.isdigit() else 0, split)


def _by_part(usable: list[dict], recordings: dict[str, dict]) -> dict[tuple[str, str], list[dict]]:
    """The segments each part ``(split, shard_id)`` holds: a train segment is in its recording's subset."""
    grouped: dict[tuple[str, str], list[dict]] = {}
    for s in usable:
        if s["split"] == TRAIN:
            subset_id = recordings[s["recording_id"]]["subset_id"]
            if subset_id is None:
                continue  # not packed yet
            split = train_subset_name(subset_id)
        else:
            split = s["split"]
        grouped.setdefault((split, s["shard_id"]), []).append(s)
    return grouped


def _segment_identities(segments: pa.Table) -> list[tuple[str, str]]:
    return list(zip(segments["shard_id"].to_pylist(), segments["key"].to_pylist(), strict=True))


def _dirty_parts(db) -> tuple[set[tuple[str, str]], set[str], set[str]]:
    """``(parts to write, splits among them rewritten to take segments out, shards with new train segments)``.

    A part is ``(split, shard_id)``. Written: a shard's new ``test``/``validation`` segments' part, a
    part holding a withdrawn segment or a near duplicate found after it was written, and a part a
    killed build started (``part_writes``). A part that takes in segments of a file written before
    parts (``files.shard_id`` NULL) takes in that whole split: all its shards' parts are written and
    the old files retired, so no row is ever in two files."""
    parts = {
        (split, shard)
        for split, shard in db.execute(
            "SELECT DISTINCT split, shard_id FROM segments WHERE file IS NULL AND status = 'pending' "
            "AND split IN ('test', 'validation')"
        ).fetchall()
    }
    rewrites = db.execute(
        "SELECT DISTINCT f.split, s.shard_id FROM segments s JOIN files f ON f.path_in_repo = s.file "
        "WHERE s.status = 'withdrawn' OR (s.status = 'filtered' AND s.file IS NOT NULL)"
    ).fetchall()
    rewritten = {split for split, _ in rewrites}
    parts |= set(rewrites)
    parts |= set(db.execute("SELECT split, shard_id FROM part_writes").fetchall())
    touched_splits = sorted({split for split, _ in parts})
    legacy = db.execute(
        "SELECT DISTINCT f.split, s.shard_id FROM files f JOIN segments s ON s.file = f.path_in_repo "
        "WHERE f.shard_id IS NULL AND f.split IN (SELECT unnest(?::VARCHAR[])) AND f.status <> 'deleted'",
        [touched_splits],
    ).fetchall()
    parts |= set(legacy)
    new_train = {
        shard
        for (shard,) in db.execute(
            "SELECT DISTINCT s.shard_id FROM segments s JOIN recordings r USING (recording_id) "
            "WHERE s.split = 'train' AND s.file IS NULL AND s.status = 'pending' AND r.subset_id IS NULL"
        ).fetchall()
    }
    return parts, rewritten, new_train


def _part_states(db, shards: list[str]) -> list[dict]:
    """The segments of ``shards`` a part may hold: written, pending or failed (earlier cutting errors
    are retried whenever their part is written again)."""
    states = rows_as_dicts(
        db,
        "SELECT shard_id, key, recording_id, split, subset_id, file, status FROM segments "
        "WHERE shard_id IN (SELECT unnest(?::VARCHAR[])) AND status IN ('pending', 'uploaded', 'error') "
        "ORDER BY shard_id, key",
        [shards],
    )
    for s in states:
        s["id"] = (s["shard_id"], s["key"])
    return states


def _record_intent(data_root: DataRoot, state_path: str, split: str, shard_id: str) -> None:
    with state_connection(data_root, state_path) as db:
        db.execute("INSERT OR IGNORE INTO part_writes VALUES (?, ?)", [split, shard_id])


def _pack_new_train(
    data_root, state_path, writer: SegmentWriter, options, usable, recordings, summary, by_part
) -> None:
    """Pack the train recordings not in a subset yet into subsets of at most ``max_split_size_gb``.

    The last subset is filled first: a new shard adds a part to it (never rewriting another shard's
    part) until it is full, then a new subset starts, so the number of train splits grows with the
    country's size, not with the number of builds."""
    pending = [
        s
        for s in usable
        if s["split"] == TRAIN and s["file"] is None and recordings[s["recording_id"]]["subset_id"] is None
    ]
    if not pending:
        return
    with state_connection(data_root, state_path) as db:
        last = db.execute("SELECT max(subset_id) FROM recordings").fetchall()[0][0]
        filled = db.execute(
            "SELECT coalesce(sum(bytes), 0) FROM files WHERE split = ? AND status <> 'deleted'",
            [train_subset_name(last or 1)],
        ).fetchall()[0][0]
    packer = _SubsetPacker(last or 1, int(filled), int(options.max_split_size_gb * 1e9 * (1 - PARQUET_RESERVE)))
    state_of = {s["id"]: s for s in pending}
    by_shard: dict[str, list] = {}
    for recording, keys in writer.by_recording(pending, recordings):
        by_shard.setdefault(recording["shard_id"], []).append((recording, keys))
    for shard_id, sources in sorted(by_shard.items()):
        parts: dict[int, _TrainPart] = {}
        with contextlib.ExitStack() as stack:
            for recording, keys in sources:
                table, payload = writer.cut(recording, keys)
                target = packer.place(recording["recording_id"], payload)
                if target not in parts:
                    _record_intent(data_root, state_path, train_subset_name(target), shard_id)
                    parts[target] = _TrainPart(stack.enter_context(writer.sink(train_subset_name(target), shard_id)))
                    # The shard's part of the open subset, if it has one, is written whole again with the new rows.
                    kept = by_part.get((train_subset_name(target), shard_id), [])
                    for kept_recording, kept_keys in writer.by_recording(kept, recordings):
                        parts[target].add(*writer.cut(kept_recording, kept_keys), kept, None)
                parts[target].add(table, payload, [state_of[k] for k in keys], recording["recording_id"])
        for target, part in sorted(parts.items()):
            commit_part(
                data_root,
                state_path,
                part.sink.result,
                shard_id,
                part.states,
                summary,
                subset_id=target,
                recording_ids=part.recordings,
            )


@dataclass
class _SubsetPacker:
    """Which train subset each new recording joins: the open one until its payload would pass the budget."""

    subset_id: int
    filled: int
    budget: int
    placed: dict[str, int] = field(default_factory=dict)

    def place(self, recording_id: str, payload: int) -> int:
        if recording_id not in self.placed:  # a recording split over shards stays in one subset
            if self.filled and self.filled + payload > self.budget:
                self.subset_id, self.filled = self.subset_id + 1, 0
            self.placed[recording_id] = self.subset_id
            self.filled += payload
        return self.placed[recording_id]


@dataclass
class _TrainPart:
    sink: object
    states: list = field(default_factory=list)
    recordings: set = field(default_factory=set)

    def add(self, table, payload: int, states: list, recording_id: str | None) -> None:
        self.states.extend(states)
        if recording_id is not None:
            self.recordings.add(recording_id)
        if table is not None:
            self.sink.append(table, payload)


def _retire_legacy_files(data_root: DataRoot, state_path: str, dataset: str) -> None:
    """Files written before parts whose rows all moved into parts are removed (and deleted on the Hub)."""
    with state_connection(data_root, state_path) as db:
        retired = db.execute(
            "SELECT path_in_repo, status FROM files f WHERE f.shard_id IS NULL AND f.split IS NOT NULL "
            "AND f.status <> 'deleted' AND NOT EXISTS (SELECT 1 FROM segments s WHERE s.file = f.path_in_repo) "
            "ORDER BY path_in_repo"
        ).fetchall()
    if not retired:
        return
    for path, _ in retired:
        local = data_root.path(layout.hf_dataset_file(dataset, path))
        if data_root.fs.exists(local):
            data_root.fs.rm(local)
    with state_connection(data_root, state_path) as db:
        for path, status in retired:
            if status == "uploaded":
                db.execute(
                    "UPDATE files SET status = 'deleted', updated_at = current_timestamp WHERE path_in_repo = ?", [path]
                )
            else:
                db.execute("DELETE FROM files WHERE path_in_repo = ?", [path])


def _country_sample_rate(db, options: DatasetOptions, segments: pa.Table, states: list[dict]) -> int | None:
    stored = get_setting(db, "sample_rate")
    if stored is not None:
        return int(stored)
    if options.sample_rate is not None:
        rate = options.sample_rate
    else:
        usable = {s["id"] for s in states if s["status"] in ("pending", "uploaded")}
        seconds_by_rate: dict[int, float] = {}
        for shard_id, key, rate_value, duration in zip(
            segments["shard_id"].to_pylist(),
            segments["key"].to_pylist(),
            segments["source_sample_rate"].to_pylist(),
            segments["duration_s"].to_pylist(),
            strict=True,
        ):
            if (shard_id, key) in usable and rate_value:
                seconds_by_rate[rate_value] = seconds_by_rate.get(rate_value, 0.0) + duration
        if not seconds_by_rate:
            return None
        rate = max(seconds_by_rate, key=lambda r: (seconds_by_rate[r], r))
    set_setting(db, "sample_rate", str(rate))
    return rate
