"""The shard write lock on S3: an object created only if absent, renewed and taken over only if unchanged.

A conditional ``PutObject`` (``If-None-Match: *``) creates it; renewals and takeovers rewrite it only
``If-Match`` its ETag as read, so the guarantees of the local lock file hold without a local folder.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from speechdata.io.lock_holder import (
    LockHolder,
    ShardLocked,
    holder_body,
    is_stale,
    lock_lease_s,
    lock_relative_path,
    new_holder,
    parse_holder,
)
from speechdata.io.storage import DataRoot
from speechdata.io.write_fence import Lease, attempt_path_of, lost_error

EXCLUSIVE_CREATE_PROTOCOLS = ("s3", "s3a")
"""Object stores whose fsspec filesystem creates an object only if absent (s3fs ``mode="create"``)."""


def _read_object_holder(data_root: DataRoot, path: str) -> tuple[LockHolder | None, str | None]:
    """The holder named by the lock object and the object's ETag; (None, None) when there is none."""
    fs = data_root.fs
    try:
        etag = fs.info(path, refresh=True).get("ETag")
        body = fs.cat_file(path)
    except FileNotFoundError:
        return None, None
    return parse_holder(body), etag


class _ObjectLease:
    """The ETag of the holder's lock object: each renewal rewrites it only if it is still that one."""

    def __init__(self, data_root: DataRoot, path: str, me: LockHolder, etag: str | None):
        self.data_root, self.path, self.me, self.etag = data_root, path, me, etag

    def renew(self) -> bool:
        body = holder_body(replace(self.me, renewed_at=time.time()))
        try:
            response = self.data_root.fs.pipe_file(self.path, body, IfMatch=self.etag)
        except OSError:
            holder, etag = _read_object_holder(self.data_root, self.path)
            if holder is None or holder.token != self.me.token:
                return False  # taken over or removed
            self.etag = etag  # still ours (a retried request went through first): renewed next time
            raise
        self.etag = _etag_of(response)
        return True


def _etag_of(put_response) -> str:
    """The ETag a ``PutObject`` answered (s3fs returns the response): the object as this holder wrote it."""
    return put_response["ETag"]


@contextlib.contextmanager
def object_store_lock(
    data_root: DataRoot,
    shard_id: str,
    product: str,
    *,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
    lease_s: float | None = None,
) -> Iterator[LockHolder]:
    """:func:`shard_lock` on an S3 data root: the lock object is created only if absent, renewed
    and taken over only if it is unchanged since read; raises :class:`ShardLocked` like the local lock."""
    relative = lock_relative_path(shard_id, product)
    path, fs = data_root.path(relative), data_root.fs
    me = new_holder(run_id, lock_lease_s() if lease_s is None else lease_s)
    body = holder_body(me)
    etag = None
    for _ in range(3):
        try:
            etag = _etag_of(fs.pipe_file(path, body, mode="create"))
            break
        except OSError:
            pass  # it exists (FileExistsError), or a condition failed: read who holds it
        holder, stale_etag = _read_object_holder(data_root, path)
        if holder is None:
            continue  # released between our create and our read
        if not is_stale(holder, holder_finished):
            raise ShardLocked(shard_id, product, holder, data_root.uri(relative))
        try:
            # Only over the stale holder's object: a renewal since our read changed its ETag.
            response = fs.pipe_file(path, body, IfMatch=stale_etag)
        except OSError:
            continue  # someone else took it over or released it first, or its holder renewed it
        if (_read_object_holder(data_root, path)[0] or holder).token == me.token:
            etag = _etag_of(response)
            _rm_object_if_present(data_root, attempt_path_of(path))  # the stale holder's attempts end here
            break
    else:
        holder = _read_object_holder(data_root, path)[0] or me
        raise ShardLocked(shard_id, product, holder, data_root.uri(relative))
    object_lease = _ObjectLease(data_root, path, me, etag)
    lease = Lease(
        me.lease_s, object_lease.renew, lost_error(data_root, shard_id, product, me.token), f"{shard_id}/{product}"
    )
    try:
        with lease.held():
            yield me
    finally:
        current, _ = _read_object_holder(data_root, path)
        if current is not None and current.token == me.token:
            _rm_object_if_present(data_root, attempt_path_of(path))
            fs.rm_file(path)


def _rm_object_if_present(data_root: DataRoot, path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        data_root.fs.rm_file(path)
