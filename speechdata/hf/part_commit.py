"""Record a written part of a split in the country's state: its files, where each segment went, failed cuts.

A *part* is a split's files holding one shard's segments (:mod:`speechdata.hf.dataset`). Committing
it replaces the part's old files in the ``files`` table (an uploaded file no longer written is
marked ``deleted`` for the next upload), points its segments at their new files, records the
segments that could not be cut as ``error``, and clears the part's ``part_writes`` intent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from speechdata.hf.files import SplitFiles
from speechdata.hf.state import execute_many, registered_rows, state_connection
from speechdata.io.storage import DataRoot

if TYPE_CHECKING:
    from speechdata.hf.dataset import BuildSummary


def _identity_columns(identities: list[tuple[str, str]]) -> dict[str, pa.Array]:
    return {
        "shard_id": pa.array([shard for shard, _ in identities], pa.string()),
        "key": pa.array([key for _, key in identities], pa.string()),
    }


def commit_part(
    data_root: DataRoot,
    state_path: str,
    split_files: SplitFiles,
    shard_id: str,
    states: list[dict],
    summary: BuildSummary,
    subset_id: int | None = None,
    recording_ids: set[str] | None = None,
) -> None:
    """Record a written part: its files (pending upload), where each segment went, and failed cuts."""
    summary.written.append(split_files)
    file_of = {identity: f["path_in_repo"] for f in split_files.files for identity in f.pop("keys")}
    split = split_files.split
    with state_connection(data_root, state_path) as db:
        old = dict(
            db.execute(
                "SELECT path_in_repo, status FROM files WHERE split = ? AND shard_id = ?", [split, shard_id]
            ).fetchall()
        )
        in_split = "file IN (SELECT path_in_repo FROM files WHERE split = ?)"
        # The part's files no longer hold its withdrawn segments: nothing is left to account for them.
        db.execute(
            f"DELETE FROM segments WHERE status = 'withdrawn' AND shard_id = ? AND {in_split}", [shard_id, split]
        )
        db.execute(
            f"UPDATE segments SET file = NULL, subset_id = NULL WHERE status = 'filtered' AND shard_id = ? AND {in_split}",
            [shard_id, split],
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
                "INSERT OR REPLACE INTO files (path_in_repo, split, rows, pseudo_labels, bytes, sha256, status, "
                "error_message, commit_oid, shard_id) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?)",
                [
                    f["path_in_repo"],
                    split,
                    f["rows"],
                    f["pseudo_labels"],
                    f["bytes"],
                    f["sha256"],
                    "uploaded" if old.get(f["path_in_repo"]) == "uploaded" and _same_sha(db, f) else "pending",
                    shard_id,
                ],
            )
        written = [s["id"] for s in states if s["id"] in file_of]
        placed = {**_identity_columns(written), "file": pa.array([file_of[i] for i in written], pa.string())}
        with registered_rows(db, "placed", placed):
            db.execute(
                "UPDATE segments SET file = placed.file, subset_id = ?, "
                "status = CASE WHEN segments.file = placed.file AND segments.status = 'uploaded' THEN 'uploaded' ELSE 'pending' END, "
                "error_message = NULL, updated_at = current_timestamp FROM placed "
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
        db.execute("DELETE FROM part_writes WHERE split = ? AND shard_id = ?", [split, shard_id])
        db.execute("UPDATE shards SET needs_index = true WHERE shard_id = ?", [shard_id])


def _same_sha(db, f: dict) -> bool:
    rows = db.execute("SELECT sha256 FROM files WHERE path_in_repo = ?", [f["path_in_repo"]]).fetchall()
    return bool(rows) and rows[0][0] == f["sha256"]
