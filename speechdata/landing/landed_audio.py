"""Open the audio a landed shard's metadata names, from ``audio/`` or from ``audio.tar``.

A shard's audio is either a directory of files or one tar whose members carry the same relative
names. The tar is indexed once (headers only) and members are read in place, never extracted.
"""

from __future__ import annotations

import contextlib
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import soundfile as sf

from speechdata.io import layout
from speechdata.io.storage import DataRoot, _is_local


class AudioNotFound(FileNotFoundError):
    pass


@dataclass(frozen=True)
class AudioHeader:
    """What the file's header says, before any sample is decoded."""

    sample_rate: int
    channels: int
    frames: int
    format: str

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate


def _member_key(name: str) -> str:
    return name[2:] if name.startswith("./") else name


class LandedAudio:
    """Read access to one landed shard's audio files by their ``audio_path``.

    Use as a context manager so the tar handle (if any) is closed.
    """

    def __init__(self, data_root: DataRoot, shard_id: str):
        fs = self.fs = data_root.fs
        self.audio_dir = data_root.path(layout.landing_audio_dir(shard_id))
        self.tar_path = data_root.path(layout.landing_audio_tar(shard_id))
        self._tar_handle: IO | None = None
        self._tar: tarfile.TarFile | None = None
        self._members: dict[str, tarfile.TarInfo] = {}
        if fs.exists(self.tar_path):
            self._tar_handle = fs.open(self.tar_path, "rb")
            self._tar = tarfile.open(fileobj=self._tar_handle, mode="r:")
            # Only regular files are audio; links and devices are never followed.
            self._members = {_member_key(m.name): m for m in self._tar.getmembers() if m.isreg()}

    @property
    def container(self) -> str:
        return self.tar_path if self._tar is not None else self.audio_dir

    def __enter__(self) -> LandedAudio:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._tar is not None:
            self._tar.close()
        if self._tar_handle is not None:
            self._tar_handle.close()

    @contextlib.contextmanager
    def open(self, audio_path: str) -> Iterator[IO]:
        """A seekable binary handle on the file ``audio_path`` names; AudioNotFound if there is none."""
        if self._tar is not None:
            member = self._members.get(audio_path)
            if member is None:
                raise AudioNotFound(f"{self.tar_path} has no member {audio_path!r}")
            handle = self._tar.extractfile(member)
            try:
                yield handle
            finally:
                handle.close()
            return
        path = f"{self.audio_dir}/{audio_path}"
        try:
            handle = self.fs.open(path, "rb")
        except FileNotFoundError as exc:
            raise AudioNotFound(f"{path} does not exist") from exc
        with handle:
            yield handle

    @contextlib.contextmanager
    def sound_file(self, audio_path: str) -> Iterator[sf.SoundFile]:
        """An open ``soundfile.SoundFile`` on the file: by OS path when the shard is a local folder
        (libsndfile's own I/O seeks in microseconds), else through a Python file handle."""
        if self._tar is None and _is_local(self.fs):
            path = f"{self.audio_dir}/{audio_path}"
            if not self.fs.exists(path):
                raise AudioNotFound(f"{path} does not exist")
            with sf.SoundFile(path) as sound:
                yield sound
            return
        with self.open(audio_path) as handle, sf.SoundFile(handle) as sound:
            yield sound

    def size_bytes(self, audio_path: str) -> int:
        """The file's size as landed (the tar member's size inside a tar)."""
        if self._tar is not None:
            member = self._members.get(audio_path)
            if member is None:
                raise AudioNotFound(f"{self.tar_path} has no member {audio_path!r}")
            return int(member.size)
        try:
            return int(self.fs.size(f"{self.audio_dir}/{audio_path}"))
        except FileNotFoundError as exc:
            raise AudioNotFound(f"{self.audio_dir}/{audio_path} does not exist") from exc

    def header(self, audio_path: str) -> AudioHeader:
        with self.open(audio_path) as handle:
            info = sf.info(handle)
        return AudioHeader(int(info.samplerate), int(info.channels), int(info.frames), str(info.format))
