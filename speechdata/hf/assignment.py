"""The split assignment step of a country: record its segments, assign new recordings to splits.

:func:`refresh_split_assignments` reads the segments (:mod:`speechdata.hf.segments`) of every shard
whose stamp changed since the country's state (:mod:`speechdata.hf.state`) last recorded it, filters
them, assigns each new recording to a split (:mod:`speechdata.hf.splits`) and withdraws segments a
shard no longer holds.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from speechdata.hf.filters import SegmentId, SegmentLimits, filter_reasons, segment_ids
from speechdata.hf.segments import (
    EMPTY_INPUT_FINGERPRINT,
    SEGMENT_SCHEMA,
    country_fingerprint,
    near_duplicate_segments,
    segments_fingerprint,
    shard_country_segments,
    shard_stamps,
)
from speechdata.hf.splits import SplitTargets, assign_new_splits
from speechdata.hf.state import execute_many, registered_rows, rows_as_dicts, state_connection
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.landed_audio import AudioNotFound, LandedAudio
from speechdata.quality.decisions import NEAR_DUPLICATE


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
    limits: SegmentLimits = SegmentLimits(),  # noqa: B008 - a frozen dataclass, never mutated
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
            for segment_id, reason in zip(segment_ids(segments), reasons, strict=True)
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
