"""Local artifacts (tiny models, tokenizers) built once per cache directory, safely under concurrency."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(path: str | os.PathLike, build: Callable[[Path], None]) -> Path:
    """Return ``path``, first calling ``build(temp_path)`` and renaming the result into place if absent.

    The artifact (a file or a folder) is built under a temporary name beside ``path`` and renamed,
    so concurrent builders (pytest workers, run workers) never see half of one; when two race, the
    first rename wins and the other copy is dropped.
    """
    path = Path(path)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as work:
        temp = Path(work) / path.name
        build(temp)
        try:
            os.replace(temp, path)
        except OSError:  # a folder another process renamed into place first
            if not path.exists():
                raise
    return path
