"""Tars of audio files that WebDataset streams: deterministic writing and WebDataset's key rule.

The VAD-chunked loader (:mod:`speechdata.vad.loader`) streams one tar per shard: the landed
``landing/<shard>/audio.tar`` as it is, or, for a shard that landed an ``audio/`` directory, the
same files packed (bytes untouched) into ``shards/<shard>/audio-<sha16>.tar`` by ``vad_segments``.
"""

from __future__ import annotations

import contextlib
import io
import re
import tarfile
from collections.abc import Callable, Iterable, Iterator
from typing import IO

from speechdata.io.storage import DataRoot, atomic_open, remove_orphaned_temps_of

AUDIO_EXTENSIONS = ("mp3", "flac", "wav", "ogg", "opus")
"""Members the loader decodes (libsndfile reads all of them; MP3 since libsndfile 1.1)."""

# webdataset.tariterators.base_plus_ext: the key is everything before the first dot of the file name.
_KEY_AND_EXTENSION = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")


def webdataset_key(member_name: str) -> tuple[str, str] | tuple[None, None]:
    """``(key, extension)`` exactly as ``webdataset`` groups tar members into samples."""
    match = _KEY_AND_EXTENSION.match(member_name)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def audio_extension(extension: str) -> str | None:
    """The audio format of a WebDataset extension (``x.mp3`` -> ``mp3``), or None if not audio."""
    last = extension.rsplit(".", 1)[-1].lower()
    return last if last in AUDIO_EXTENSIONS else None


@contextlib.contextmanager
def deterministic_tar_writer(data_root: DataRoot, relative: str) -> Iterator[Callable[..., None]]:
    """Yield ``add(name, data)``; members go straight to disk and the tar appears when the block ends.

    ``data`` is the member's bytes, or a binary stream copied in blocks with ``add(name, stream,
    size)`` (a large member is never held in memory). The temps a killed writer of the same tar left
    beside it are removed first."""
    remove_orphaned_temps_of(data_root.fs, data_root.path(relative))
    with (
        atomic_open(data_root.fs, data_root.path(relative)) as handle,
        tarfile.open(fileobj=handle, mode="w", format=tarfile.GNU_FORMAT) as tar,
    ):

        def add(name: str, data: bytes | IO[bytes], size: int | None = None) -> None:
            if isinstance(data, bytes | bytearray | memoryview):
                tar.addfile(deterministic_tar_info(name, len(data)), io.BytesIO(data))
            else:
                tar.addfile(deterministic_tar_info(name, int(size)), data)

        yield add


def write_deterministic_tar(data_root: DataRoot, relative: str, members: Iterable[tuple[str, bytes]]) -> None:
    """Write ``(name, bytes)`` members, in the order given, atomically."""
    with deterministic_tar_writer(data_root, relative) as add:
        for name, data in members:
            add(name, data)


def deterministic_tar_info(name: str, size: int) -> tarfile.TarInfo:
    """A member header with mtime 0, root owner, no owner names, mode 0644: same bytes in, same tar out."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
