"""Which landings changed: a content fingerprint per landed shard, cached by the files' identities.

A shard's fingerprint is a hash of ``_SUCCESS`` and ``metadata.parquet`` (their bytes), the names
and sizes of every other file in its folder, and the names and sizes of ``audio.tar``'s members.
Times play no part, so a copy that preserves mtimes (``cp -p``, ``rsync -a``) is seen by its
content, a restored backup with new inodes is not a change, and a clock in the future on one
shard cannot hide another.

Hashing a shard reads its metadata and lists its files; a tick cannot afford that for every shard.
So each shard's fingerprint is stored with a *stat key*: size, mtime_ns, ctime_ns and inode of
``_SUCCESS`` and ``metadata.parquet``. ctime cannot be set from user space, so any rewrite of those
files (a landing writes ``_SUCCESS`` last, always) changes the key, and only then is the shard
hashed again.
"""

from __future__ import annotations

import hashlib
import io
import os
import posixpath
import tarfile
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

import pyarrow as pa

from speechdata.io import layout
from speechdata.io.confinement import LandedShardOutsideRoot, confined_landed_shard
from speechdata.io.regular_files import NotARegularFile, open_regular
from speechdata.io.storage import DataRoot

FINGERPRINT_STATE = "_state/landing_fingerprints.parquet"
"""Per landed shard: its stat key and the content fingerprint last requested (or first seen)."""

STATE_SCHEMA = pa.schema(
    [
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("stat_key", pa.string(), nullable=False),
        pa.field("fingerprint", pa.string(), nullable=False),
    ]
)

HASHED_BYTES = frozenset({layout.METADATA_FILE, layout.SUCCESS_MARKER, "vad_segments.parquet"})
"""Files whose bytes enter the fingerprint; every other file enters by its relative name and size."""

_STAT_KEY_PARTS = (layout.SUCCESS_MARKER, layout.METADATA_FILE)
_CHUNK_BYTES = 1 << 20

DEFAULT_MAX_HASH_SECONDS = 2.0
"""Hashing time per tick, at most: a tick stays well inside the sensor timeout however many shards
changed at once (a restored volume, a first tick after an upgrade); the rest wait for later ticks."""


def shard_stat_key(data_root: DataRoot, shard_id: str) -> str | None:
    """The identities of ``_SUCCESS`` and ``metadata.parquet``, or None while the shard has no
    ``_SUCCESS`` (still landing, or being landed again).

    Two stats per shard per tick. The audio container is not statted: a landing rewrites
    ``_SUCCESS`` last (the contract), which changes its ctime, so audio changes are hashed then.
    """
    folder = f"{data_root.root}/{layout.LANDING}/{shard_id}"
    if data_root.is_local:
        try:
            marker = os.stat(f"{folder}/{layout.SUCCESS_MARKER}")
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            metadata = os.stat(f"{folder}/{layout.METADATA_FILE}")
        except (FileNotFoundError, NotADirectoryError):
            return f"{marker.st_size}:{marker.st_mtime_ns}:{marker.st_ctime_ns}:{marker.st_ino}|-"
        return (
            f"{marker.st_size}:{marker.st_mtime_ns}:{marker.st_ctime_ns}:{marker.st_ino}|"
            f"{metadata.st_size}:{metadata.st_mtime_ns}:{metadata.st_ctime_ns}:{metadata.st_ino}"
        )
    parts = []
    for name in _STAT_KEY_PARTS:
        try:
            info = data_root.fs.info(f"{folder}/{name}")
        except FileNotFoundError:
            if name == layout.SUCCESS_MARKER:
                return None
            parts.append("-")
            continue
        identity = [info.get(k) for k in ("size", "mtime", "LastModified", "ETag", "etag", "generation")]
        parts.append(":".join(str(v) for v in identity if v is not None))
    return "|".join(parts)


def shard_content_fingerprint(data_root: DataRoot, shard_id: str) -> str:
    """A 16-hex-digit hash of what the shard holds (see the module docstring).

    A shard that leaves the data root (:func:`confined_landed_shard`) is not read: its fingerprint
    is derived from the refusal, so it still differs from any readable landing and the re-run that
    follows fails by name.
    """
    digest = hashlib.sha256()
    try:
        confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)
    except LandedShardOutsideRoot as exc:
        digest.update(f"outside_root\0{exc.value}\0{exc.rule}".encode())
        return "outside-root-" + digest.hexdigest()[:16]
    folder = data_root.path(layout.landing_dir(shard_id))
    for relative, size in sorted(_files_with_sizes(data_root, folder)):
        digest.update(f"{relative}\0{size}\0".encode())
        path = f"{folder}/{relative}"
        try:
            if relative in HASHED_BYTES:
                _hash_bytes(data_root, path, digest)
            elif relative == layout.AUDIO_TAR:
                _hash_tar_listing(data_root, path, digest)
        except NotARegularFile as exc:
            # A FIFO would block the sensor's tick for good: the shard is told apart by the refusal,
            # and its run fails it by name.
            digest.update(f"not a regular file\0{exc.kind}\0".encode())
    return digest.hexdigest()[:16]


def _files_with_sizes(data_root: DataRoot, folder: str) -> Iterable[tuple[str, int]]:
    if data_root.is_local:
        for parent, folders, names in os.walk(folder):
            folders.sort()
            for name in names:
                path = os.path.join(parent, name)
                try:
                    size = os.stat(path).st_size
                except OSError:
                    size = -1  # a dangling link: present by name, read by no one
                yield os.path.relpath(path, folder).replace(os.sep, "/"), size
        return
    for path, info in data_root.fs.find(folder, detail=True).items():
        yield posixpath.relpath(path, folder), int(info.get("size") or 0)


def _hash_bytes(data_root: DataRoot, path: str, digest) -> None:
    with open_regular(data_root.fs, path) as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)


def _hash_tar_listing(data_root: DataRoot, path: str, digest) -> None:
    """Member names and sizes, from the headers only (the audio bytes are not read)."""
    with open_regular(data_root.fs, path) as handle:
        try:
            with tarfile.open(fileobj=handle, mode="r:") as tar:
                for member in tar:
                    digest.update(f"{member.name}\0{member.size}\0{member.type!r}\0".encode())
        except (tarfile.TarError, OSError, io.UnsupportedOperation) as exc:
            # Unreadable tars still differ by their bytes' size (already hashed) and this mark.
            digest.update(f"unreadable tar: {type(exc).__name__}".encode())


@dataclass(frozen=True)
class ShardFingerprint:
    stat_key: str
    fingerprint: str


_loaded_state: dict[str, tuple[tuple, dict[str, ShardFingerprint]]] = {}
"""The last state read or written per state file, with the file's identity when it was: a sensor
process re-reads the file only when something else changed it."""


def _file_identity(data_root: DataRoot, path: str) -> tuple | None:
    if not data_root.is_local:
        return None  # an object store's listing costs as much as the read: always read
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino)


def load_fingerprint_state(data_root: DataRoot) -> dict[str, ShardFingerprint]:
    path = data_root.path(FINGERPRINT_STATE)
    identity = _file_identity(data_root, path)
    cached = _loaded_state.get(path)
    if identity is not None and cached is not None and cached[0] == identity:
        return dict(cached[1])
    if not data_root.exists(FINGERPRINT_STATE):
        return {}
    table = data_root.read_parquet(FINGERPRINT_STATE)
    state = {
        shard: ShardFingerprint(key, fingerprint)
        for shard, key, fingerprint in zip(
            table["shard_id"].to_pylist(), table["stat_key"].to_pylist(), table["fingerprint"].to_pylist(), strict=True
        )
    }
    if identity is not None:
        _loaded_state[path] = (identity, state)
    return dict(state)


def save_fingerprint_state(data_root: DataRoot, state: dict[str, ShardFingerprint]) -> None:
    shards = sorted(state)
    table = pa.table(
        {
            "shard_id": shards,
            "stat_key": [state[s].stat_key for s in shards],
            "fingerprint": [state[s].fingerprint for s in shards],
        },
        schema=STATE_SCHEMA,
    )
    data_root.write_parquet(FINGERPRINT_STATE, table)
    path = data_root.path(FINGERPRINT_STATE)
    identity = _file_identity(data_root, path)
    if identity is not None:
        _loaded_state[path] = (identity, dict(state))


@dataclass
class RelandingScan:
    relanded: list[tuple[str, str]] = field(default_factory=list)
    """(shard, new fingerprint) of registered shards whose content changed since last requested."""
    baselined: list[str] = field(default_factory=list)
    """Shards fingerprinted for the first time (newly registered, or registered before fingerprints)."""
    hashed: int = 0
    """Shards whose stat key changed and that were hashed this scan."""
    more_waiting: bool = False
    """True when a limit stopped the scan: the rest are looked at by the next one."""


def scan_relandings(
    data_root: DataRoot,
    landed: Iterable[str],
    registered: Collection[str],
    *,
    max_relanded: int,
    max_hashed: int,
    max_hash_seconds: float = DEFAULT_MAX_HASH_SECONDS,
) -> RelandingScan:
    """Compare every registered, landed shard's content with its stored fingerprint.

    ``landed``: the shard folders under ``landing/``. A shard is hashed only when its stat key
    changed; at most ``max_hashed`` are hashed (and hashing stops once it took ``max_hash_seconds``)
    and ``max_relanded`` reported per call, and a shard
    left over keeps its old state, so the next call sees it again. The state is saved before
    returning, so the caller must request a run for every shard in ``relanded``.
    """
    state = load_fingerprint_state(data_root)
    result = RelandingScan()
    changed = False
    hashing_s = 0.0
    for shard_id in landed:
        if shard_id not in registered:
            continue
        key = shard_stat_key(data_root, shard_id)
        if key is None:
            continue  # no _SUCCESS: landing again right now, looked at once it is marked
        known = state.get(shard_id)
        if known is not None and known.stat_key == key:
            continue
        if result.hashed >= max_hashed or hashing_s >= max_hash_seconds:
            result.more_waiting = True
            continue
        started = time.perf_counter()
        fingerprint = shard_content_fingerprint(data_root, shard_id)
        hashing_s += time.perf_counter() - started
        result.hashed += 1
        if known is None:
            result.baselined.append(shard_id)
        elif known.fingerprint != fingerprint:
            if len(result.relanded) >= max_relanded:
                result.more_waiting = True
                continue
            result.relanded.append((shard_id, fingerprint))
        state[shard_id] = ShardFingerprint(key, fingerprint)
        changed = True
    if changed:
        save_fingerprint_state(data_root, state)
    return result
