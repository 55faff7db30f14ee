"""Open the audio a landed shard's metadata names, from ``audio/`` or from ``audio.tar``.

A shard's audio is either a directory of files or one tar whose members carry the same relative
names. The tar is indexed once (headers only) and members are read in place, never extracted.
"""

from __future__ import annotations

import contextlib
import os
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import soundfile as sf

from speechdata.io import layout
from speechdata.io.confinement import ConfinementError, confined_landed_shard, confined_path
from speechdata.io.regular_files import NotARegularFile, open_regular, open_regular_fd
from speechdata.io.safe_tar import UnsafeMember, audit_tar
from speechdata.io.storage import DataRoot, _is_local


class AudioNotFound(FileNotFoundError):
    pass


class UnsafeAudio(ValueError):
    """The audio a row names must not be read: it leaves the shard (a symlink out, ``..``) or is an
    unsafe or ambiguous tar member. ``reason`` is the reject code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def open_landed_tar(handle, tar_path: str) -> tarfile.TarFile:
    """``tarfile`` on a landed ``audio.tar``, or one ContractError naming the file and the rule.

    A tar cut short keeps its intact members (``tarfile`` stops at the first truncated header past the
    start; a member whose data is cut fails alone when read, a per-utterance reject)."""
    from speechdata.landing.contract import ContractError

    magic = handle.read(2)
    handle.seek(0)
    if magic == b"\x1f\x8b":
        raise ContractError(tar_path, None, "audio.tar is gzip-compressed: land an uncompressed tar")
    try:
        return tarfile.open(fileobj=handle, mode="r:")
    except tarfile.TarError as exc:
        raise ContractError(tar_path, None, f"audio.tar is not a readable uncompressed tar ({exc})") from exc


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


class LandedAudio:
    """Read access to one landed shard's audio files by their ``audio_path``.

    Use as a context manager so the tar handle (if any) is closed.
    """

    def __init__(self, data_root: DataRoot, shard_id: str):
        fs = self.fs = data_root.fs
        self.audio_dir = data_root.path(layout.landing_audio_dir(shard_id))
        self.tar_path = data_root.path(layout.landing_audio_tar(shard_id))
        # Messages that end up in stored rejects name files relative to the data root, so a
        # re-run under another root (or a moved root) writes the same rejects.
        self.audio_dir_name = layout.landing_audio_dir(shard_id)
        self.tar_name = layout.landing_audio_tar(shard_id)
        self._tar_handle: IO | None = None
        self._tar: tarfile.TarFile | None = None
        self._members: dict[str, tarfile.TarInfo] = {}
        self._unsafe: dict[str, UnsafeMember] = {}
        self._local = _is_local(fs)
        self._real_audio_dir: str | None = None
        # Before any byte is read: a shard folder, audio/ or audio.tar linked out of the root fails whole.
        confined_landed_shard(data_root.root, shard_id, local=self._local)
        if fs.exists(self.tar_path):
            try:
                self._tar_handle = open_regular(fs, self.tar_path)
            except NotARegularFile as exc:
                from speechdata.landing.contract import ContractError

                raise ContractError(self.tar_path, None, f"audio.tar must be a regular file, not a {exc.kind}") from exc
            try:
                self._tar = open_landed_tar(self._tar_handle, self.tar_path)
                # Only regular, uniquely named files are audio; links and devices are never followed.
                audit = audit_tar(self._tar)
            except BaseException:
                self._tar_handle.close()
                raise
            self._members, self._unsafe = audit.files, audit.unsafe

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
            member = self._member(audio_path)
            handle = self._tar.extractfile(member)
            try:
                yield handle
            finally:
                handle.close()
            return
        path = self._confined(audio_path)
        try:
            handle = open_regular(self.fs, path)
        except FileNotFoundError as exc:
            raise AudioNotFound(f"{self.audio_dir_name}/{audio_path} does not exist") from exc
        except NotARegularFile as exc:
            raise self._not_regular(audio_path, exc) from exc
        with handle:
            yield handle

    @contextlib.contextmanager
    def sound_file(self, audio_path: str) -> Iterator[sf.SoundFile]:
        """An open ``soundfile.SoundFile`` on the file: by OS path when the shard is a local folder
        (libsndfile's own I/O seeks in microseconds), else through a Python file handle."""
        if self._tar is None and self._local:
            with self._local_descriptor(audio_path) as descriptor, sf.SoundFile(descriptor, closefd=False) as sound:
                yield sound
            return
        with self.open(audio_path) as handle, sf.SoundFile(handle) as sound:
            yield sound

    @contextlib.contextmanager
    def _local_descriptor(self, audio_path: str) -> Iterator[int]:
        """A descriptor on a file of a local ``audio/`` folder, for libsndfile's own I/O: only a regular
        file is opened (a FIFO would block the read for good)."""
        path = self._confined(audio_path)
        try:
            descriptor = open_regular_fd(path)
        except FileNotFoundError as exc:
            raise AudioNotFound(f"{self.audio_dir_name}/{audio_path} does not exist") from exc
        except NotARegularFile as exc:
            raise self._not_regular(audio_path, exc) from exc
        try:
            yield descriptor
        finally:
            os.close(descriptor)

    def _not_regular(self, audio_path: str, exc: NotARegularFile) -> UnsafeAudio:
        return UnsafeAudio(
            "audio_not_a_regular_file",
            f"{self.audio_dir_name}/{audio_path} is a {exc.kind}, not a regular file; refused unread",
        )

    def size_bytes(self, audio_path: str) -> int:
        """The file's size as landed (the tar member's size inside a tar)."""
        if self._tar is not None:
            return int(self._member(audio_path).size)
        try:
            return int(self.fs.size(self._confined(audio_path)))
        except FileNotFoundError as exc:
            raise AudioNotFound(f"{self.audio_dir_name}/{audio_path} does not exist") from exc

    def _member(self, audio_path: str) -> tarfile.TarInfo:
        if audio_path in self._unsafe:
            problem = self._unsafe[audio_path]
            raise UnsafeAudio(problem.reason, f"{self.tar_name}: {problem.detail}")
        member = self._members.get(audio_path)
        if member is None:
            raise AudioNotFound(f"{self.tar_name} has no member {audio_path!r}")
        return member

    def _confined(self, audio_path: str) -> str:
        """The file's path, resolved through the one storage guard (a symlink out of the shard is refused)."""
        if self._local and self._real_audio_dir is None:
            self._real_audio_dir = os.path.realpath(self.audio_dir)
        try:
            return confined_path(
                self.audio_dir, audio_path, what="audio_path", local=self._local, real_root=self._real_audio_dir
            )
        except ConfinementError as exc:
            named = ConfinementError(exc.what, exc.value, self.audio_dir_name, exc.rule)
            raise UnsafeAudio("audio_path_escapes_shard", str(named)) from exc

    def header(self, audio_path: str) -> AudioHeader:
        """The file's header. From a local folder it is read by OS path: libsndfile's own I/O takes
        half the CPU of reading through Python callbacks, and ingest probes every landed file."""
        if self._tar is None and self._local:
            with self._local_descriptor(audio_path) as descriptor:
                try:
                    with sf.SoundFile(descriptor, closefd=False) as sound:
                        return _header_of(sound)
                except Exception:  # re-probed below, so a reject's reason and detail stay what they were
                    pass
        with self.open(audio_path) as handle, sf.SoundFile(handle) as sound:
            return _header_of(sound)


def _header_of(sound: sf.SoundFile) -> AudioHeader:
    return AudioHeader(int(sound.samplerate), int(sound.channels), int(sound.frames), str(sound.format))
