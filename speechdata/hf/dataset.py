"""Build one country's Hugging Face dataset in the Hub's parquet layout, with bounded memory.

Layout under ``hf/<dataset>/`` (what the Hub stores after ``push_to_hub``)::

    README.md                                       card; its ``configs`` YAML lists every country's splits
    <country>/test-00000-of-00001.parquet
    <country>/validation-00000-of-00001.parquet
    <country>/train_1-00000-of-00003.parquet ...    one split per train subset, each within the size budget

Rows follow seed 004's features (:func:`hf_features`). Audio is cut from the landed long recording,
downmixed to mono and stored as 16-bit FLAC at the country's sample rate: the configured one, or
else the rate that carries most of the country's usable audio (fixed at the first build and kept in
the state, so every file of a country agrees; recordings at other rates are resampled with soxr).

Segments are streamed one recording at a time into parquet writers, so memory holds one
recording's encoded segments, whatever the size of the country. ``test`` and ``validation`` are
rebuilt when their set of segments changes. Train subsets are sealed: once written, a subset is
never rebuilt; new train recordings form new subsets (``train_<n+1>``...), and new segments of a
recording already published are recorded as filtered (``recording_already_published``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import soundfile as sf

from speechdata.audio.codec import downmix_to_mono, encode_flac, read_segment_from, resample
from speechdata.hf.files import PARQUET_RESERVE, SplitFiles, SplitSink
from speechdata.hf.segments import SegmentLimits, country_segments, word_error_rate
from speechdata.hf.splits import TEST, TRAIN, VALIDATION, train_subset_name
from speechdata.hf.state import execute_many, get_setting, registered_rows, rows_as_dicts, set_setting, state_connection
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.landed_audio import AudioNotFound, LandedAudio

if TYPE_CHECKING:
    import datasets

DEFAULT_DATASET = "speech-segments"


def hf_features(sample_rate: int) -> datasets.Features:
    """Seed 004's target schema, with the sampling rate found in the data."""
    # Imported here: `datasets` costs ~3 s, and every Dagster step process imports this module.
    import datasets

    v = datasets.Value
    return datasets.Features(
        {
            "audio": datasets.Audio(sampling_rate=sample_rate),
            "key": v("string"),
            "shard_id": v("string"),
            "country": v("string"),
            "language": v("string"),
            "video_id": v("string"),
            "transcript_id": v("string"),
            "start_seconds": v("float32"),
            "end_seconds": v("float32"),
            "duration_seconds": v("float32"),
            "asr_transcript": v("string"),
            "human_transcript": v("string"),
            "cer": v("float32"),
            "wer": v("float32"),
            "original_transcript_start_idx": v("int32"),
            "original_transcript_end_idx": v("int32"),
        }
    )


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
    """Write the splits of ``country`` whose content changed; record files and segment statuses in the state."""
    summary = BuildSummary(country)
    state_path = layout.hf_state_database(options.dataset, country)
    segments = country_segments(data_root, country)
    position = {
        identity: i for i, identity in enumerate(zip(segments["shard_id"].to_pylist(), segments["key"].to_pylist()))
    }
    with state_connection(data_root, state_path) as db:
        recordings = {r["recording_id"]: r for r in rows_as_dicts(db, "SELECT * FROM recordings")}
        states = rows_as_dicts(db, "SELECT shard_id, key, recording_id, split, subset_id, file, status FROM segments")
        for s in states:
            s["id"] = (s["shard_id"], s["key"])
        sample_rate = _country_sample_rate(db, options, segments, states)
        withdrawn_from = {
            split
            for (split,) in db.execute(
                "SELECT DISTINCT f.split FROM segments s JOIN files f ON f.path_in_repo = s.file "
                "WHERE s.status = 'withdrawn'"
            ).fetchall()
        }
        late = [
            s["id"]
            for s in states
            if s["split"] == TRAIN
            and s["file"] is None
            and s["status"] == "pending"
            and recordings[s["recording_id"]]["subset_id"] is not None
        ]
        with registered_rows(db, "late", _identity_columns(late)):
            db.execute(
                "UPDATE segments SET status = 'filtered', reason = 'recording_already_published', "
                "updated_at = current_timestamp FROM late WHERE segments.shard_id = late.shard_id AND segments.key = late.key"
            )
    summary.sample_rate, summary.already_published = sample_rate, len(late)
    late_keys = set(late)
    # Earlier cutting errors are retried whenever their split is written again.
    usable = [
        s
        for s in states
        if s["status"] in ("pending", "uploaded", "error") and s["id"] in position and s["id"] not in late_keys
    ]
    writer = _Writer(data_root, options, country, sample_rate, segments, position, summary)
    for split in (TEST, VALIDATION):
        keys = [s for s in usable if s["split"] == split]
        unwritten = [s for s in keys if s["file"] is None and s["status"] != "error"]
        current_files = _split_files(data_root, state_path, split)
        if (
            keys
            and not unwritten
            and split not in withdrawn_from
            and _files_present(data_root, options.dataset, current_files)
        ):
            summary.unchanged.append(split)
            continue
        if not keys and not current_files:
            continue
        if split in withdrawn_from:
            summary.rewritten_for_withdrawal.append(split)
        _commit_split(data_root, state_path, writer.write(split, writer.by_recording(keys, recordings)), keys, summary)
    # A sealed subset is rewritten only to drop what a re-landing withdrew: same subset, same
    # recordings, fewer rows, new content-named files (so the Hub copy is replaced too).
    for split in sorted(withdrawn_from - {TEST, VALIDATION}):
        subset_id = int(split.removeprefix(f"{TRAIN}_"))
        keys = [s for s in usable if s["split"] == TRAIN and s["subset_id"] == subset_id and s["file"] is not None]
        summary.rewritten_for_withdrawal.append(split)
        _commit_split(
            data_root,
            state_path,
            writer.write(split, writer.by_recording(keys, recordings)),
            keys,
            summary,
            subset_id=subset_id,
        )
    pending_train = [
        s
        for s in usable
        if s["split"] == TRAIN and s["file"] is None and recordings[s["recording_id"]]["subset_id"] is None
    ]
    with state_connection(data_root, state_path) as db:
        next_subset = (db.execute("SELECT max(subset_id) FROM recordings").fetchall()[0][0] or 0) + 1
    budget = int(options.max_split_size_gb * 1e9 * (1 - PARQUET_RESERVE))
    for subset_id, recording_ids, files in writer.write_train_subsets(
        writer.by_recording(pending_train, recordings), next_subset, budget
    ):
        subset_keys = [s for s in pending_train if s["recording_id"] in recording_ids]
        _commit_split(
            data_root, state_path, files, subset_keys, summary, subset_id=subset_id, recording_ids=recording_ids
        )
    return summary


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
        ):
            if (shard_id, key) in usable and rate_value:
                seconds_by_rate[rate_value] = seconds_by_rate.get(rate_value, 0.0) + duration
        if not seconds_by_rate:
            return None
        rate = max(seconds_by_rate, key=lambda r: (seconds_by_rate[r], r))
    set_setting(db, "sample_rate", str(rate))
    return rate


def _identity_columns(identities: list[tuple[str, str]]) -> dict[str, pa.Array]:
    return {
        "shard_id": pa.array([shard for shard, _ in identities], pa.string()),
        "key": pa.array([key for _, key in identities], pa.string()),
    }


def _split_files(data_root: DataRoot, state_path: str, split: str) -> list[str]:
    with state_connection(data_root, state_path) as db:
        return [
            p
            for (p,) in db.execute(
                "SELECT path_in_repo FROM files WHERE split = ? AND status <> 'deleted'", [split]
            ).fetchall()
        ]


def _files_present(data_root: DataRoot, dataset: str, db_files: list[str]) -> bool:
    return bool(db_files) and all(data_root.exists(layout.hf_dataset_file(dataset, p)) for p in db_files)


def _commit_split(
    data_root: DataRoot,
    state_path: str,
    split_files: SplitFiles,
    states: list[dict],
    summary: BuildSummary,
    subset_id: int | None = None,
    recording_ids: set[str] | None = None,
) -> None:
    """Record a written split: its files (pending upload), where each segment went, and failed cuts."""
    summary.written.append(split_files)
    file_of = {identity: f["path_in_repo"] for f in split_files.files for identity in f.pop("keys")}
    with state_connection(data_root, state_path) as db:
        old = dict(db.execute("SELECT path_in_repo, status FROM files WHERE split = ?", [split_files.split]).fetchall())
        # The split's files no longer hold its withdrawn segments: nothing is left to account for them.
        execute_many(db, "DELETE FROM segments WHERE status = 'withdrawn' AND file = ?", [[p] for p in old])
        new_paths = {f["path_in_repo"] for f in split_files.files}
        for path, status in old.items():
            if path not in new_paths:
                if status == "uploaded":
                    db.execute(
                        "UPDATE files SET status = 'deleted', updated_at = current_timestamp WHERE path_in_repo = ?",
                        [path],
                    )
                elif status != "deleted":  # a file still to delete on the Hub stays so, however often rewritten
                    db.execute("DELETE FROM files WHERE path_in_repo = ?", [path])
        for f in split_files.files:
            db.execute(
                "INSERT OR REPLACE INTO files (path_in_repo, split, rows, bytes, sha256, status, error_message, commit_oid) "
                "VALUES (?, ?, ?, ?, ?, ?, NULL, NULL)",
                [
                    f["path_in_repo"],
                    split_files.split,
                    f["rows"],
                    f["bytes"],
                    f["sha256"],
                    "uploaded" if old.get(f["path_in_repo"]) == "uploaded" and _same_sha(db, f) else "pending",
                ],
            )
        written = [s["id"] for s in states if s["id"] in file_of]
        placed = {**_identity_columns(written), "file": pa.array([file_of[i] for i in written], pa.string())}
        with registered_rows(db, "placed", placed):
            db.execute(
                "UPDATE segments SET file = placed.file, subset_id = ?, status = 'pending', error_message = NULL, "
                "updated_at = current_timestamp FROM placed "
                "WHERE segments.shard_id = placed.shard_id AND segments.key = placed.key",
                [subset_id],
            )
        failed = [s["id"] for s in states if s["id"] in summary.errors]
        errors = {
            **_identity_columns(failed),
            "message": pa.array([summary.errors[i] for i in failed], pa.string()),
        }
        with registered_rows(db, "failed", errors):
            db.execute(
                "UPDATE segments SET file = NULL, status = 'error', error_message = failed.message, "
                "updated_at = current_timestamp FROM failed "
                "WHERE segments.shard_id = failed.shard_id AND segments.key = failed.key"
            )
        if recording_ids:
            execute_many(
                db,
                "UPDATE recordings SET subset_id = ? WHERE recording_id = ?",
                [[subset_id, r] for r in sorted(recording_ids)],
            )


def _same_sha(db, f: dict) -> bool:
    rows = db.execute("SELECT sha256 FROM files WHERE path_in_repo = ?", [f["path_in_repo"]]).fetchall()
    return bool(rows) and rows[0][0] == f["sha256"]


class _Writer:
    """Cuts segments out of landed recordings and streams them into a split's parquet files."""

    def __init__(self, data_root, options, country, sample_rate, segments, position, summary):
        self.data_root, self.options, self.country = data_root, options, country
        self.sample_rate, self.segments, self.position, self.summary = sample_rate, segments, position, summary
        self.schema = hf_features(sample_rate or 16_000).arrow_schema
        self.max_file_bytes = int(options.max_file_mb * 1e6)
        self._audio: LandedAudio | None = None

    def by_recording(self, states: list[dict], recordings: dict[str, dict]) -> list[tuple[dict, list]]:
        """The landed files to cut (with their segments' identities), in storage order: by shard, then file.

        The file is each segment's own (its shard's audio): a recording id (a ``video_id``) may
        have segments in several shards, and each is cut from the shard that landed it.
        """
        ids_by_source: dict[tuple[str, str, str], list[tuple[str, str]]] = {}
        for s in states:
            row = self.position[s["id"]]
            source = (s["shard_id"], self.segments["audio_path"][row].as_py(), s["recording_id"])
            ids_by_source.setdefault(source, []).append(s["id"])
        return [
            ({"shard_id": shard, "audio_path": audio_path, "recording_id": recording_id}, ids)
            for (shard, audio_path, recording_id), ids in sorted(ids_by_source.items())
            if recording_id in recordings
        ]

    def write(self, split: str, recordings: list[tuple[dict, list]]) -> SplitFiles:
        with self._split_sink(split) as sink:
            for recording, keys in recordings:
                table, payload = self._recording_rows(recording, keys)
                if table is not None:
                    sink.append(table, payload)
        return sink.result

    def write_train_subsets(
        self, recordings: list[tuple[dict, list]], first_subset: int, budget_bytes: int
    ) -> Iterator[tuple[int, set[str], SplitFiles]]:
        """Yield ``(subset_id, recording ids, files)`` per sealed subset, packing recordings in order."""
        subset_id, index = first_subset, 0
        while index < len(recordings):
            members: set[str] = set()
            with self._split_sink(train_subset_name(subset_id)) as sink:
                while index < len(recordings):
                    recording, keys = recordings[index]
                    table, payload = self._recording_rows(recording, keys)
                    if members and sink.payload_bytes + payload > budget_bytes:
                        self._pending = (table, payload)
                        break
                    index += 1
                    members.add(recording["recording_id"])
                    if table is not None:
                        sink.append(table, payload)
            yield subset_id, members, sink.result
            subset_id += 1

    _pending: tuple[pa.Table | None, int] | None = None

    def _recording_rows(self, recording: dict, keys: list[tuple[str, str]]) -> tuple[pa.Table | None, int]:
        if self._pending is not None:
            # The recording that did not fit the last subset was already cut: reuse it.
            pending, self._pending = self._pending, None
            return pending
        rows, payload = [], 0
        try:
            with self._landed(recording["shard_id"]).sound_file(recording["audio_path"]) as sound:
                for key in sorted(keys, key=lambda k: self.segments["start_s"][self.position[k]].as_py() or 0.0):
                    try:
                        row = self._row(sound, key)
                    except (RuntimeError, ValueError, sf.LibsndfileError) as exc:
                        self.summary.errors[key] = f"cutting {recording['audio_path']} failed: {exc}"
                        continue
                    payload += len(row["audio"]["bytes"]) + sum(len(str(v)) for k, v in row.items() if k != "audio")
                    rows.append(row)
        except (AudioNotFound, sf.LibsndfileError, RuntimeError) as exc:
            for key in keys:
                self.summary.errors.setdefault(
                    key, f"recording {recording['audio_path']} in shard {recording['shard_id']}: {exc}"
                )
        self.summary.max_recording_buffer_bytes = max(self.summary.max_recording_buffer_bytes, payload)
        if not rows:
            return None, 0
        return pa.Table.from_pylist(rows, schema=self.schema), payload

    def _row(self, sound: sf.SoundFile, identity: tuple[str, str]) -> dict:
        i = self.position[identity]
        shard_id, key = identity
        value = {name: self.segments[name][i].as_py() for name in self.segments.column_names}
        samples = downmix_to_mono(read_segment_from(sound, value["start_s"], value["end_s"]))
        if samples.size == 0:
            raise ValueError(f"segment {key} [{value['start_s']}, {value['end_s']}) s holds no samples")
        samples = resample(samples, sound.samplerate, self.sample_rate) if self.sample_rate else samples
        rate = self.sample_rate or sound.samplerate
        self.summary.audio_seconds += samples.shape[0] / rate
        start = float(value["start_s"] or 0.0)
        end = float(value["end_s"]) if value["end_s"] is not None else start + samples.shape[0] / rate
        return {
            "audio": {
                "bytes": encode_flac(np.asarray(samples, dtype=np.float32), rate),
                "path": f"{shard_id}/{key}.flac",
            },
            "key": key,
            "shard_id": shard_id,
            "country": self.country,
            "language": value["language"],
            "video_id": value["video_id"],
            "transcript_id": value["transcript_id"],
            "start_seconds": start,
            "end_seconds": end,
            "duration_seconds": end - start,
            "asr_transcript": value["asr_text"],
            "human_transcript": value["human_text"],
            "cer": value["cer"],
            "wer": word_error_rate(value["human_text"], value["asr_text"]),
            "original_transcript_start_idx": value["transcript_start_idx"],
            "original_transcript_end_idx": value["transcript_end_idx"],
        }

    def _landed(self, shard_id: str) -> LandedAudio:
        if self._audio is None or self._audio_shard != shard_id:
            if self._audio is not None:
                self._audio.close()
            self._audio, self._audio_shard = LandedAudio(self.data_root, shard_id), shard_id
        return self._audio

    @contextlib.contextmanager
    def _split_sink(self, split: str) -> Iterator[SplitSink]:
        sink = SplitSink(self.data_root, self.options.dataset, self.country, split, self.schema, self.max_file_bytes)
        try:
            yield sink
        except BaseException:
            sink.abort()
            raise
        sink.finish()
