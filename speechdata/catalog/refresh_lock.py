"""The files around a catalog refresh: the lock that makes refreshes of one catalog wait for each
other (readers never take it), the temps of refreshes that were killed, and the folder's fsync."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator

from speechdata.catalog.database_checks import check_catalog_file
from speechdata.catalog.refresh_memory import is_orphaned_spill
from speechdata.io.storage import TEMP_PREFIX


@contextlib.contextmanager
def refresh_lock(database_path: str) -> Iterator[None]:
    """Refreshes of one catalog one at a time; readers never take this lock."""
    lock_path = os.path.join(os.path.dirname(database_path), f".{os.path.basename(database_path)}.refresh-lock")
    check_catalog_file(lock_path)
    # O_NOFOLLOW: a link planted between the check and the open is refused, never followed.
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        check_catalog_file(lock_path)
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(descriptor, fcntl.LOCK_UN)
    finally:
        os.close(descriptor)


def remove_orphaned_builds(database_path: str) -> None:
    """Temps and spill folders of refreshes that were killed (safe: this runs under the refresh lock)."""
    folder, name = os.path.split(database_path)
    for entry in os.listdir(folder):
        if is_orphaned_spill(entry, name):
            # Not followed if a link: only the link goes.
            path = os.path.join(folder, entry)
            if os.path.islink(path) or not os.path.isdir(path):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
            else:
                shutil.rmtree(path, ignore_errors=True)
            continue
        if entry.startswith(TEMP_PREFIX) and (entry.endswith("-" + name) or entry.endswith("-" + name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(folder, entry))


def fsync_folder(folder: str) -> None:
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
