"""Write a deterministic tar member by member, hashing it on the way, at the speed of moving its bytes.

The bytes are exactly those of ``tarfile`` in GNU format with
:func:`speechdata.io.audio_tars.deterministic_tar_info` headers (tests/unit/test_tar_stream.py
compares them), but ``tarfile`` spends about 70 µs of Python per member on a header (copying the
``TarInfo``, formatting every field) and wants each payload as one file object. Here a header is a
fixed template with the name, the size and the checksum spliced in, and a member's payload is any
sequence of buffers (a ``.npy`` header plus a view of the Arrow batch the array came from), so no
payload is copied before the write. SHA-256 and the file writes run in background threads of
their own (both release the GIL on large buffers) while the caller reads and assembles the next
samples. The writes' trip to disk is paced as they go (:mod:`speechdata.io.write_back`), and
``close`` returns once the tar is on disk.
"""

from __future__ import annotations

import hashlib
import tarfile
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO

from speechdata.io.audio_tars import deterministic_tar_info
from speechdata.io.write_back import StreamingWriteBack

BLOCK_BYTES = tarfile.BLOCKSIZE
RECORD_BYTES = tarfile.RECORDSIZE
NAME_BYTES = 100
MAX_OCTAL_SIZE = 8**11  # tarfile switches the size field to base-256 from here on
WRITES_AHEAD = 8
"""Pending writes before the caller waits: enough to keep the writer busy, few enough that the
buffers they hold (a few samples' worth) stay small."""

_TEMPLATE = deterministic_tar_info("x", 0).tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
_NAME, _SIZE, _CHECKSUM = slice(0, 100), slice(124, 136), slice(148, 156)
# The checksum counts its own field as eight spaces; everything else but the name and size is fixed.
_FIXED_SUM = sum(_TEMPLATE[100:124]) + sum(_TEMPLATE[136:148]) + 8 * ord(" ") + sum(_TEMPLATE[156:])
_ZEROS = bytes(RECORD_BYTES)


def member_header(name: str, size: int) -> bytes:
    """The header ``tarfile`` writes for ``deterministic_tar_info(name, size)`` in GNU format."""
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) >= NAME_BYTES or size >= MAX_OCTAL_SIZE or not encoded:
        # GNU long-name records and base-256 sizes: rare, so tarfile's own code writes them.
        return deterministic_tar_info(name, size).tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    name_field = encoded + bytes(NAME_BYTES - len(encoded))
    size_field = b"%011o\0" % size
    checksum = _FIXED_SUM + sum(encoded) + sum(size_field)
    header = bytearray(_TEMPLATE)
    header[_NAME] = name_field
    header[_SIZE] = size_field
    header[_CHECKSUM] = b"%06o\0 " % checksum
    return bytes(header)


def byte_view(buffer) -> memoryview:
    """A flat byte view of any C-contiguous buffer (bytes, an array, a view of an Arrow buffer)."""
    view = memoryview(buffer)
    if view.nbytes == 0:
        return memoryview(b"")  # memoryview cannot cast a view with a zero in its shape
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def padding(size: int) -> bytes:
    """The NUL bytes that complete a member of ``size`` bytes to a whole block."""
    return _ZEROS[: -size % BLOCK_BYTES]


class TarStream:
    """Members appended to an open binary handle; ``close`` writes the end-of-archive blocks.

    ``offset`` is the position the next member's header will start at, as ``TarFile.offset``.
    ``write_back_window_bytes``: see :class:`~speechdata.io.write_back.StreamingWriteBack` (None: its default).
    """

    def __init__(self, handle: IO[bytes], write_back_window_bytes: int | None = None):
        self.handle = handle
        self.write_back = StreamingWriteBack(handle, write_back_window_bytes)
        self.sha256 = hashlib.sha256()
        self.offset = 0
        # Hashing and writing each get a thread: the two passes over the bytes run side by side.
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="tar-hasher")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="tar-writer")
        self._pending: deque[Future] = deque()

    def add_sample(self, members: Sequence[tuple[str, Sequence]]) -> None:
        """Append the members (name, payload buffers) of one sample, in the given order."""
        pieces: list = []
        for name, payload in members:
            parts = [byte_view(part) for part in payload]
            size = sum(part.nbytes for part in parts)
            header = member_header(name, size)
            pieces.append(header)
            pieces.extend(parts)
            pieces.append(padding(size))
            self.offset += len(header) + size + len(pieces[-1])
        self._submit(pieces)

    def close(self) -> None:
        """The two zero blocks and the padding to a whole record that ``TarFile.close`` writes; returns
        once they and everything before are on disk (a file's handle; other handles are flushed)."""
        end = self.offset + 2 * BLOCK_BYTES
        self._submit([_ZEROS[: 2 * BLOCK_BYTES], _ZEROS[: -end % RECORD_BYTES]])
        self.offset = end + (-end % RECORD_BYTES)
        self._drain()
        self._hasher.shutdown()
        self._writer.shutdown()
        self.write_back.finish()

    def abort(self) -> None:
        """Stop the writer without raising what it failed on (the caller is raising already)."""
        for future in self._pending:
            future.cancel()
        self._hasher.shutdown(wait=True)
        self._writer.shutdown(wait=True)

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()

    def _submit(self, pieces: list) -> None:
        self._pending.append(self._hasher.submit(self._hash, pieces))
        self._pending.append(self._writer.submit(self._write, pieces))
        while len(self._pending) > 2 * WRITES_AHEAD:
            self._pending.popleft().result()

    def _drain(self) -> None:
        while self._pending:
            self._pending.popleft().result()

    def _hash(self, pieces: list) -> None:
        for piece in pieces:
            self.sha256.update(piece)

    def _write(self, pieces: list) -> None:
        written = 0
        for piece in pieces:
            if len(piece):
                self.handle.write(piece)
                written += len(piece)
        self.write_back.wrote(written)
