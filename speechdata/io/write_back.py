"""Start a long sequential write's trip to disk as it goes, so its dirty pages stay bounded.

Without it, a tar of 0.7-1 GB ends in the page cache and is written back all at once, by the
``fsync`` that makes it durable (a wait at the end that grows with the tar), or,
past the kernel's dirty limit (20 % of memory), the writer is throttled mid-run to the disk's
speed. Both make the cost per utterance depend on the shard's size. The classic streaming-write
pattern keeps the disk busy all along instead: after every window of ``window_bytes`` written,
``sync_file_range(SYNC_FILE_RANGE_WRITE)`` starts that window's write-back, and the window before
it is waited for (``WAIT_BEFORE | WRITE | WAIT_AFTER``), so at most two windows are dirty or in
flight and the final sync waits for the last one only.

``sync_file_range`` is Linux's; elsewhere (another OS, a handle without a file descriptor such as
an object-store upload or a ``BytesIO``, a pipe, a filesystem that refuses it) the writes are
simply not paced, and :meth:`StreamingWriteBack.finish` still syncs whatever file descriptor there is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import io
import os
import stat
import sys
from collections.abc import Callable
from typing import IO

WRITE_BACK_WINDOW_BYTES = 16 << 20
"""Large enough that each call moves a lot per system call and the disk sees long requests; small
enough that the two windows in flight are a few dozen MB whatever the file's size."""

DROP_WRITTEN = False
"""Whether ranges already on disk are dropped from the page cache (``POSIX_FADV_DONTNEED``). Off:
packing reads its tars back right away to verify them, from the cache when they are still there."""

SYNC_FILE_RANGE_WAIT_BEFORE = 1
SYNC_FILE_RANGE_WRITE = 2
SYNC_FILE_RANGE_WAIT_AFTER = 4
_WAIT_FOR_RANGE = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER
# The filesystem or the file cannot do it (not an error of the data): fall back to plain writes.
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ESPIPE, errno.EOPNOTSUPP, errno.ENOTSUP}

SyncFileRange = Callable[[int, int, int, int], None]
"""``(fd, offset_bytes, length_bytes, flags)``; raises ``OSError`` with the C call's errno."""


def _load_sync_file_range() -> SyncFileRange | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        function = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    # ctypes releases the GIL for the call: the caller's other threads go on while this one waits.
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int

    def sync_file_range(fd: int, offset_bytes: int, length_bytes: int, flags: int) -> None:
        if function(fd, offset_bytes, length_bytes, flags) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"sync_file_range: {os.strerror(code)}")

    return sync_file_range


SYNC_FILE_RANGE: SyncFileRange | None = _load_sync_file_range()
"""None where the C library has no ``sync_file_range`` (not Linux)."""


def file_descriptor(handle: IO[bytes]) -> int | None:
    """The descriptor of a regular file behind ``handle``; None for anything else (in memory, remote, a pipe)."""
    try:
        fd = handle.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None
    if not isinstance(fd, int) or fd < 0:
        return None
    try:
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None


class StreamingWriteBack:
    """Paces the write-back of one file written front to back through ``handle``.

    Call :meth:`wrote` with the size of each write, in order, from the thread that writes, and
    :meth:`finish` once the last write returned: it flushes the handle and returns when every byte
    is on disk. ``window_bytes`` None is :data:`WRITE_BACK_WINDOW_BYTES`; ``sync_file_range`` "libc" is
    :data:`SYNC_FILE_RANGE` (tests pass their own to watch the calls, or None to take it away);
    ``drop_written`` None is :data:`DROP_WRITTEN`.
    """

    def __init__(
        self,
        handle: IO[bytes],
        window_bytes: int | None = None,
        sync_file_range: SyncFileRange | None | str = "libc",
        drop_written: bool | None = None,
    ):
        # Module settings are read per file, so a benchmark can change them for a whole run.
        window_bytes = WRITE_BACK_WINDOW_BYTES if window_bytes is None else window_bytes
        sync_file_range = SYNC_FILE_RANGE if sync_file_range == "libc" else sync_file_range
        self.drop_written = DROP_WRITTEN if drop_written is None else drop_written
        if window_bytes <= 0:
            raise ValueError(f"window_bytes must be positive, got {window_bytes}")
        self.handle = handle
        self.window_bytes = window_bytes
        self.fd = file_descriptor(handle)
        self._sync_file_range = sync_file_range if self.fd is not None else None
        self.written_bytes = 0
        self._started_bytes = 0
        """Bytes ``[0, _started_bytes)`` have had their write-back started."""
        self._waited_bytes = 0
        """Bytes ``[0, _waited_bytes)`` are on disk."""
        self._base_bytes = self._position()
        """Where the first write lands: a handle opened for appending may not start at 0."""

    @property
    def pacing(self) -> bool:
        """Whether writes are being paced (False: plain writes, the fallback)."""
        return self._sync_file_range is not None

    def wrote(self, size_bytes: int) -> None:
        """``size_bytes`` more were written: start each full window's write-back, wait for the one before."""
        self.written_bytes += size_bytes
        while self.pacing and self.written_bytes - self._started_bytes >= self.window_bytes:
            self._sync(self._started_bytes, self.window_bytes, SYNC_FILE_RANGE_WRITE)
            if self._started_bytes > self._waited_bytes:
                self._sync(self._waited_bytes, self._started_bytes - self._waited_bytes, _WAIT_FOR_RANGE)
                if self.drop_written and self.pacing:
                    os.posix_fadvise(
                        self.fd, self._base_bytes + self._waited_bytes, self._started_bytes - self._waited_bytes,
                        os.POSIX_FADV_DONTNEED,
                    )  # fmt: skip
                self._waited_bytes = self._started_bytes
            self._started_bytes += self.window_bytes

    def finish(self) -> None:
        """Flush the handle and return once everything written is on disk (nothing to do without a file)."""
        self.handle.flush()
        if self.fd is None:
            return
        # fdatasync also writes the size; a rename that follows then never shows a short file after a crash.
        (os.fdatasync if hasattr(os, "fdatasync") else os.fsync)(self.fd)

    def _sync(self, offset_bytes: int, length_bytes: int, flags: int) -> None:
        if self._sync_file_range is None:  # refused by an earlier call of this loop
            return
        try:
            self._sync_file_range(self.fd, self._base_bytes + offset_bytes, length_bytes, flags)
        except OSError as error:
            if error.errno not in _UNSUPPORTED:
                raise  # a write-back that failed (EIO, ENOSPC) is the write's failure
            self._sync_file_range = None

    def _position(self) -> int:
        if self.fd is None:
            return 0
        try:
            return self.handle.tell()
        except (OSError, ValueError, io.UnsupportedOperation):
            self._sync_file_range = None  # offsets unknown: do not pace the wrong range
            return 0
