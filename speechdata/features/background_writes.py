"""Stored matrices are written on a thread, so the next forward pass starts while a batch is written.

The queue holds at most ``max_pending`` batches: a slow data root slows the forwards down (bounded
memory) instead of buffering a whole shard. A write error is raised in the caller at its next
``submit`` or at ``close``, never lost.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

import numpy as np

from speechdata.features.array_store import ArrayStoreWriter

_DONE = object()


class BackgroundArrayWrites:
    """``submit`` batches of ``(utt_id, matrix)`` for ``store``; ``close`` waits for them and flushes."""

    def __init__(self, store: ArrayStoreWriter, max_pending: int = 2):
        self._store = store
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._write_all, name="array-store-writes", daemon=True)
        self._thread.start()

    def _write_all(self) -> None:
        while (batch := self._queue.get()) is not _DONE:
            if self._error is not None:
                continue  # keep draining so a blocked submit returns and sees the error
            try:
                for utt_id, matrix in batch:
                    self._store.add(utt_id, matrix)
            except BaseException as exc:  # re-raised in the caller's thread
                self._error = exc

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, batch: Sequence[tuple[str, np.ndarray]]) -> None:
        self._raise_if_failed()
        self._queue.put(list(batch))

    def close(self) -> None:
        """Wait for every submitted batch, flush the store's last row group, raise a write error."""
        self._queue.put(_DONE)
        self._thread.join()
        self._raise_if_failed()
        self._store.flush()

    def abandon(self) -> None:
        """Stop the thread after a failure elsewhere; what is pending is dropped with the temp file."""
        self._error = self._error or RuntimeError("abandoned")
        self._queue.put(_DONE)
        self._thread.join()

    def __enter__(self) -> BackgroundArrayWrites:
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.abandon()
