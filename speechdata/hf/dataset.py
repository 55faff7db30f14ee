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

from dataclasses import dataclass, field

import pyarrow as pa

from speechdata.hf.files import PARQUET_RESERVE, SplitFiles
from speechdata.hf.segment_writer import SegmentWriter
from speechdata.hf.segment_writer import hf_features as hf_features  # where callers have always found it
from speechdata.hf.segments import SegmentLimits, country_segments
from speechdata.hf.splits import TEST, TRAIN, VALIDATION
from speechdata.hf.state import execute_many, get_setting, registered_rows, rows_as_dicts, set_setting, state_connection
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
    """Write the splits of ``country`` whose content changed; record files and segment statuses in the state."""
    summary = BuildSummary(country)
    state_path = layout.hf_state_database(options.dataset, country)
    segments = country_segments(data_root, country)
    position = {
        identity: i
        for i, identity in enumerate(zip(segments["shard_id"].to_pylist(), segments["key"].to_pylist(), strict=True))
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
                # A filtered segment still naming a file is a near duplicate found after it was written.
                "WHERE s.status = 'withdrawn' OR (s.status = 'filtered' AND s.file IS NOT NULL)"
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
    writer = SegmentWriter(data_root, options, country, sample_rate, segments, position, summary)
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
            strict=True,
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
        execute_many(
            db,
            "UPDATE segments SET file = NULL, subset_id = NULL WHERE status = 'filtered' AND file = ?",
            [[p] for p in old],
        )
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
