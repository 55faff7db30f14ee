"""An export's output directory: built beside its final name, renamed into place, with a record.

Trainers read local directories, so an export writes to a local ``DIR``. Everything goes into a
temporary sibling first; only a finished export replaces ``DIR`` (the previous export, if any, is
removed after the rename), so a reader never sees half an export and a failed run leaves the last
good one. ``export.json`` in the directory records what was exported from where; a non-empty
``DIR`` without it is not ours and is never replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

RECORD_FILE = "export.json"


class ExportError(Exception):
    """A problem the user can fix (bad output directory, nothing selected...); printed as one line."""


@contextlib.contextmanager
def staged_directory(out_dir: str | os.PathLike) -> Iterator[Path]:
    """A fresh temporary directory that becomes ``out_dir`` when the block ends without error."""
    if "://" in os.fspath(out_dir):
        raise ExportError(f"--out must be a local directory (trainers read local files), got {out_dir}")
    final = Path(out_dir).absolute()
    if final.exists() and (not final.is_dir() or (any(final.iterdir()) and not (final / RECORD_FILE).exists())):
        raise ExportError(f"{final} exists and is not an earlier export (no {RECORD_FILE}): choose another --out")
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    try:
        yield staging
        retired = None
        if final.exists():
            retired = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.replace(final, retired)
        os.replace(staging, final)
        if retired is not None:
            shutil.rmtree(retired, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_record(directory: Path, record: dict) -> None:
    (directory / RECORD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


class Progress:
    """``<export>: n/total samples, h hours`` on stderr, at most about once a second, and at the end."""

    def __init__(self, label: str, total: int, stream=None, interval_s: float = 1.0):
        self.label, self.total, self.stream, self.interval_s = label, total, stream or sys.stderr, interval_s
        self.samples, self.audio_s, self._last = 0, 0.0, 0.0

    def advance(self, duration_s: float) -> None:
        self.samples += 1
        self.audio_s += duration_s
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._print()

    def done(self) -> None:
        self._print()

    def _print(self) -> None:
        print(
            f"{self.label}: {self.samples}/{self.total} samples, {self.audio_s / 3600:.4f} h",
            file=self.stream,
            flush=True,
        )
