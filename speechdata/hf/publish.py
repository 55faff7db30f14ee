"""Upload a country's dataset files to the Hugging Face Hub, resumably.

The state database says which files are ``pending``, ``uploaded``, in ``error`` or ``deleted``
(replaced locally, still on the Hub). A run commits each split (``test``, ``validation``, each
``train_<n>``) as one commit of its files plus the deletions of its replaced files, and records the
outcome of every commit in its own transaction, so a crash loses at most the commit in flight.

Before uploading, the Hub's tree is read: a file whose content is already there (same LFS sha256,
or same git blob id for small files) is marked ``uploaded`` without a new commit. So a re-run after
a crash between "commit accepted" and "state saved" uploads nothing twice, and paths are fixed, so
a subset is never duplicated.

Transient failures (HTTP 408/429/5xx, connection errors) are retried with exponential backoff;
what still fails marks its files ``error`` with the message, and the other splits go on.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from speechdata.hf.card import CARD_FILE
from speechdata.hf.files import file_sha256
from speechdata.hf.state import execute_many, rows_as_dicts, state_connection
from speechdata.io import layout
from speechdata.io.storage import DataRoot

TRANSIENT_STATUS_CODES = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_delay_s: float = 2.0
    max_delay_s: float = 120.0

    def delay_s(self, attempt: int) -> float:
        return min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: rate limits, server errors, timeouts and dropped connections."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status is not None:
        return status in TRANSIENT_STATUS_CODES
    transport_errors: tuple[type, ...] = (ConnectionError, TimeoutError)
    try:
        import httpx2

        transport_errors += (httpx2.TransportError,)
    except ImportError:  # older huggingface_hub releases use httpx
        import httpx

        transport_errors += (httpx.TransportError,)
    return isinstance(exc, transport_errors)


def with_retries(call: Callable, policy: RetryPolicy, what: str, log: Callable[[str], None], sleep=time.sleep):
    for attempt in range(1, policy.attempts + 1):
        try:
            return call()
        except Exception as exc:
            if attempt == policy.attempts or not is_transient(exc):
                raise
            delay = policy.delay_s(attempt)
            log(
                f"{what}: transient failure ({type(exc).__name__}: {str(exc)[:200]}); retry {attempt}/{policy.attempts - 1} in {delay:.1f} s"
            )
            sleep(delay)
    raise AssertionError("unreachable")


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the Hub, for non-LFS files) gives a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class PublishSummary:
    committed: list[str] = field(default_factory=list)
    already_on_hub: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    commits: int = 0
    bytes_uploaded: int = 0


def register_card(data_root: DataRoot, dataset: str, country: str) -> None:
    """Track the dataset card in the country's state: pending whenever its content changed."""
    path = data_root.path(layout.hf_dataset_file(dataset, CARD_FILE))
    sha = file_sha256(data_root.fs, path)
    with state_connection(data_root, layout.hf_state_database(dataset, country)) as db:
        old = db.execute("SELECT sha256, status FROM files WHERE path_in_repo = ?", [CARD_FILE]).fetchall()
        if old and old[0][0] == sha and old[0][1] == "uploaded":
            return
        db.execute(
            "INSERT OR REPLACE INTO files (path_in_repo, split, rows, bytes, sha256, status) VALUES (?, NULL, 0, ?, ?, 'pending')",
            [CARD_FILE, int(data_root.fs.size(path)), sha],
        )


def publish_country(
    data_root: DataRoot,
    dataset: str,
    country: str,
    api,
    repo_id: str,
    *,
    revision: str = "main",
    private: bool = True,
    policy: RetryPolicy = RetryPolicy(),
    log: Callable[[str], None] = print,
    sleep=time.sleep,
) -> PublishSummary:
    """Upload what the Hub lacks of ``country``'s files. ``api`` is a ``huggingface_hub.HfApi``."""
    summary = PublishSummary()
    state_path = layout.hf_state_database(dataset, country)
    with_retries(
        lambda: api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True),
        policy,
        f"create {repo_id}",
        log,
        sleep,
    )
    remote = {
        entry.path: entry
        for entry in with_retries(
            lambda: list(api.list_repo_tree(repo_id, repo_type="dataset", revision=revision, recursive=True)),
            policy,
            f"list {repo_id}",
            log,
            sleep,
        )
        if hasattr(entry, "blob_id")
    }
    with state_connection(data_root, state_path) as db:
        files = rows_as_dicts(db, "SELECT path_in_repo, split, sha256, status FROM files WHERE status <> 'uploaded'")
    to_upload: dict[str, list[dict]] = {}
    for f in files:
        if f["status"] == "deleted":
            if f["path_in_repo"] in remote:
                to_upload.setdefault(f["split"] or "", []).append(f)
            else:
                _forget(data_root, state_path, [f["path_in_repo"]])
            continue
        local = data_root.path(layout.hf_dataset_file(dataset, f["path_in_repo"]))
        if _already_on_hub(data_root, local, f["sha256"], remote.get(f["path_in_repo"])):
            summary.already_on_hub.append(f["path_in_repo"])
            _mark_uploaded(data_root, state_path, [f["path_in_repo"]], commit_oid=None)
            continue
        to_upload.setdefault(f["split"] or "", []).append(f)
    # The card goes last, so it never lists a split before the split's files are on the Hub.
    for split in sorted(to_upload, key=lambda s: (s == "", s)):
        _commit_group(
            data_root, dataset, country, api, repo_id, revision, split, to_upload[split], policy, log, sleep, summary
        )
    return summary


def _already_on_hub(data_root: DataRoot, local: str, sha256: str, entry) -> bool:
    if entry is None or not data_root.fs.exists(local) or int(entry.size) != int(data_root.fs.size(local)):
        return False
    if entry.lfs is not None:
        lfs_sha = entry.lfs.get("sha256") if isinstance(entry.lfs, dict) else getattr(entry.lfs, "sha256", None)
        return lfs_sha == sha256
    with data_root.fs.open(local, "rb") as handle:
        return git_blob_sha1(handle.read()) == entry.blob_id


def _commit_group(
    data_root, dataset, country, api, repo_id, revision, split, files, policy, log, sleep, summary
) -> None:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    state_path = layout.hf_state_database(dataset, country)
    adds = [f["path_in_repo"] for f in files if f["status"] != "deleted"]
    deletes = [f["path_in_repo"] for f in files if f["status"] == "deleted"]
    operations = [
        CommitOperationAdd(path_in_repo=p, path_or_fileobj=data_root.path(layout.hf_dataset_file(dataset, p)))
        for p in adds
    ] + [CommitOperationDelete(path_in_repo=p) for p in deletes]
    label = split or CARD_FILE
    log(f"{country}: committing {label} to {repo_id} ({len(adds)} files, {len(deletes)} deletions)")
    try:
        info = with_retries(
            lambda: api.create_commit(
                repo_id,
                operations,
                commit_message=f"{country}: {label}",
                repo_type="dataset",
                revision=revision,
            ),
            policy,
            f"commit {country}/{label}",
            log,
            sleep,
        )
    except Exception as exc:
        message = f"{type(exc).__name__}: {str(exc)[:500]}"
        for path in adds + deletes:
            summary.errors[path] = message
        with state_connection(data_root, state_path) as db:
            execute_many(
                db,
                "UPDATE files SET status = CASE WHEN status = 'deleted' THEN 'deleted' ELSE 'error' END, "
                "error_message = ?, updated_at = current_timestamp WHERE path_in_repo = ?",
                [[message, p] for p in adds + deletes],
            )
        log(f"{country}: {label} failed after retries: {message}")
        return
    summary.commits += 1
    summary.committed += adds
    summary.deleted += deletes
    summary.bytes_uploaded += sum(
        int(data_root.fs.size(data_root.path(layout.hf_dataset_file(dataset, p)))) for p in adds
    )
    _mark_uploaded(data_root, state_path, adds, commit_oid=getattr(info, "oid", None))
    _forget(data_root, state_path, deletes)


def _mark_uploaded(data_root: DataRoot, state_path: str, paths: list[str], commit_oid: str | None) -> None:
    with state_connection(data_root, state_path) as db:
        execute_many(
            db,
            "UPDATE files SET status = 'uploaded', error_message = NULL, commit_oid = coalesce(?, commit_oid), "
            "updated_at = current_timestamp WHERE path_in_repo = ?",
            [[commit_oid, p] for p in paths],
        )
        execute_many(
            db,
            "UPDATE segments SET status = 'uploaded', updated_at = current_timestamp WHERE file = ? AND status = 'pending'",
            [[p] for p in paths],
        )
        # Their shards' published indexes say `pending` until the country's next build writes them again.
        execute_many(
            db,
            "UPDATE shards SET needs_index = true WHERE shard_id = (SELECT shard_id FROM files WHERE path_in_repo = ?)",
            [[p] for p in paths],
        )


def _forget(data_root: DataRoot, state_path: str, paths: list[str]) -> None:
    with state_connection(data_root, state_path) as db:
        execute_many(db, "DELETE FROM files WHERE path_in_repo = ? AND status = 'deleted'", [[p] for p in paths])
