"""Landed and imported files are read only when they are regular files: anything else is refused unread.

Opening a named pipe (FIFO) for reading blocks until a writer opens its other end: a FIFO planted
as ``landing/<s>/_SUCCESS`` would hang the landing sensor's tick, ``speechdata land`` or an
importer for good. A character device may never end (``/dev/zero``), a socket cannot be opened.
Every read of a landed file, and of an importer's source, opens it here: the local filesystem of every
data root and source (:func:`speechdata.io.storage.filesystem_for`) is :class:`RegularFilesOnly`,
whose every open for reading (``fs.open``, ``cat_file``...) goes through :func:`open_regular_fd`,
and a reader that opens files by name itself (libsndfile, Arrow) is handed a descriptor from it or
checks with :func:`require_regular` first. On a local filesystem the
path is statted first (nothing but a regular file is ever opened), then opened with ``O_NONBLOCK``
(opening a FIFO that replaced it meanwhile returns at once) and checked again on the open descriptor
(``fstat``: the file checked is the file read, whatever is renamed over its path). Object stores
hold nothing but regular objects, so their files open as they always did.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from typing import IO

import fsspec
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

_KINDS = (
    (stat.S_ISFIFO, "named pipe (FIFO)"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISDIR, "directory"),
)


class NotARegularFile(ValueError):
    """A path to read is a FIFO, a device, a socket or a folder: refused before any byte is read."""

    def __init__(self, path: str, kind: str):
        self.path, self.kind = path, kind
        super().__init__(f"{path}: is a {kind}, not a regular file; refused unread (reading it could block forever)")


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "special file")


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def open_regular_fd(path: str) -> int:
    """A read-only descriptor on the local regular file ``path``; :class:`NotARegularFile` otherwise."""
    mode = os.stat(path).st_mode  # FileNotFoundError as before
    if not stat.S_ISREG(mode):
        raise NotARegularFile(path, _kind(mode))
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise NotARegularFile(path, _kind(mode))
        os.set_blocking(descriptor, True)  # a regular file ignores it; a library reading the descriptor must not
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


class _RegularFileOpener(LocalFileOpener):
    """fsspec's local file, opened for reading through :func:`open_regular_fd`."""

    def _open(self) -> None:
        if "r" not in self.mode or (self.f is not None and not self.f.closed):
            super()._open()
            return
        self.f = os.fdopen(open_regular_fd(self.path), self.mode)
        self.size = self.f.seek(0, 2)
        self.f.seek(0)
        self.f.size = self.size


class RegularFilesOnly(LocalFileSystem):
    """The local filesystem, but a file opened for reading must be a regular file (see the module docstring)."""

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        if "r" in mode and "+" not in mode:
            return _RegularFileOpener(self._strip_protocol(path), mode, fs=self, **kwargs)
        return super()._open(path, mode, block_size, **kwargs)


def require_regular(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Refuse ``path`` unless it is a regular file, for a reader that opens it by name itself."""
    if _is_local(fs):
        os.close(open_regular_fd(fs._strip_protocol(path)))


def open_regular(fs: fsspec.AbstractFileSystem, path: str) -> IO[bytes]:
    """``path`` opened for binary reading, only if it is a regular file (see the module docstring)."""
    if _is_local(fs):
        return os.fdopen(open_regular_fd(fs._strip_protocol(path)), "rb")
    return fs.open(path, "rb")


def read_regular(fs: fsspec.AbstractFileSystem, path: str) -> bytes:
    """The whole of ``path``, only if it is a regular file."""
    with open_regular(fs, path) as handle:
        return handle.read()


@contextlib.contextmanager
def regular_fd(path: str) -> Iterator[int]:
    """:func:`open_regular_fd` for a block: the descriptor is closed after it."""
    descriptor = open_regular_fd(path)
    try:
        yield descriptor
    finally:
        os.close(descriptor)
