"""The one guard for paths built from user data: partition keys, utt ids, audio paths, tar members,
importer sources. Every such path is resolved (symlinks included, on a local disk) and refused with
a reason when it leaves the root it was meant for.
"""

from __future__ import annotations

import os
import posixpath
import re

from speechdata.io.layout import ConfinementError, validate_key

_DRIVE = re.compile(r"^[A-Za-z]:")


def validate_partition_key(shard_id: str) -> str:
    """A shard id (a Dagster partition key) that is safe as a folder and file name, or InvalidKey."""
    return validate_key("shard", shard_id)


def relative_path_problem(relative: str) -> str | None:
    """Why ``relative`` is not a plain relative path (absolute, ``..``, NUL, empty part), or None."""
    if not relative or relative.startswith(("/", "\\")) or _DRIVE.match(relative):
        return "an absolute or empty path"
    if "\x00" in relative:
        return "a NUL byte"
    parts = relative.replace("\\", "/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "a '..', '.' or empty path component"
    return None


def confined_path(
    root: str, relative: str, *, what: str = "path", local: bool = True, real_root: str | None = None
) -> str:
    """``root/relative`` if it stays inside ``root`` once resolved; else :class:`ConfinementError`.

    On a local disk both sides go through ``os.path.realpath``, so a symlink (the file itself or any
    folder on the way) that points outside ``root`` is refused; on an object store there are no links
    and the lexical check is the whole check. ``real_root``: ``realpath(root)`` if the caller already
    resolved it (one resolution per shard rather than per file).
    """
    problem = relative_path_problem(relative)
    if problem is not None:
        raise ConfinementError(what, relative, root, f"must be a plain relative path, found {problem}")
    joined = posixpath.join(root, relative)
    if not local:
        return joined
    real_root = real_root or os.path.realpath(root)
    real = os.path.realpath(joined)
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise ConfinementError(what, relative, root, f"resolves to {real!r}, outside its root (a symlink?)")
    return joined


def confined_source(path: str, allowed_root: str, *, what: str = "importer source") -> str:
    """An importer's source file: an absolute or relative path that must resolve inside ``allowed_root``."""
    candidate = path if os.path.isabs(path) else os.path.join(allowed_root, path)
    real_root = os.path.realpath(allowed_root)
    real = os.path.realpath(candidate)
    if not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise ConfinementError(what, path, allowed_root, f"resolves to {real!r}, outside the source folder")
    return real


class DataRootMissing(FileNotFoundError):
    """The data root is not there (an unmounted volume, a typo): reading it would see "nothing landed"."""

    def __init__(self, root: str, what: str):
        self.root = root
        super().__init__(
            f"{what}: data root {root!r} does not exist (an unmounted volume or a wrong DATA_ROOT?); "
            "refusing to treat it as empty"
        )


def require_existing_root(root: str, *, local: bool, what: str) -> str:
    """``root`` if it is an existing folder; else :class:`DataRootMissing` naming it and the caller.

    Only a local root is checked: on an object store an empty prefix and a missing one look the same,
    and a wrong bucket fails on its own at the first listing.
    """
    if local and not os.path.isdir(root):
        raise DataRootMissing(root, what)
    return root


LANDED_SHARD_PARTS = (
    "metadata.parquet",
    "_SUCCESS",
    "audio",
    "audio.tar",
    "alignments",
    "segmentation",
    "vad_segments.parquet",
)
"""What a landed shard folder holds (docs/landing-contract.md); each must resolve inside that folder."""


class LandedShardOutsideRoot(ConfinementError):
    """A landed shard as a whole resolves elsewhere than ``<root>/landing/<shard>``: its folder, a
    folder on the way, or one of its parts is a symlink out. Nothing of the shard is read."""


def confined_landed_shard(root: str, shard_id: str, *, local: bool = True) -> str:
    """``root/landing/<shard_id>`` once every landed part of it resolves inside it; else
    :class:`LandedShardOutsideRoot` naming the part and where it resolves.

    The folder itself must resolve to exactly ``realpath(root)/landing/<shard_id>``: a symlinked
    ``landing/`` or shard folder is refused even when it points inside the root (at another shard, at
    ``shards/``), since a shard is then read under a name that is not its own. ``metadata.parquet``,
    ``_SUCCESS``, ``audio/`` and ``audio.tar`` may be symlinks only within the shard's own folder.
    Files under ``audio/`` are checked one by one when read (:func:`confined_path`).
    """
    validate_partition_key(shard_id)
    relative = f"landing/{shard_id}"
    joined = posixpath.join(root, relative)
    if not local:
        return joined
    real_root = os.path.realpath(root)
    expected = os.path.join(real_root, "landing", shard_id)
    real_shard = os.path.realpath(joined)
    if real_shard != expected:
        raise LandedShardOutsideRoot(
            "landed shard folder",
            relative,
            root,
            f"resolves to {real_shard!r}, not {expected!r} (a symlinked shard or landing folder)",
        )
    for part in LANDED_SHARD_PARTS:
        path = os.path.join(joined, part)
        if not os.path.islink(path):
            continue
        real = os.path.realpath(path)
        if not real.startswith(expected + os.sep):
            raise LandedShardOutsideRoot(
                "landed file", f"{relative}/{part}", root, f"is a symlink to {real!r}, outside its shard folder"
            )
    return joined


def confined_shard_output(root: str, shard_id: str, *, local: bool = True) -> str:
    """``root/shards/<shard_id>`` if it (and ``shards/``) resolves to exactly that folder under the real
    root or does not exist yet; else :class:`ConfinementError`. Outputs are written through this folder,
    so a symlink here would carry every write of the shard out of the root."""
    validate_partition_key(shard_id)
    relative = f"shards/{shard_id}"
    joined = posixpath.join(root, relative)
    if not local:
        return joined
    expected = os.path.join(os.path.realpath(root), "shards", shard_id)
    real = os.path.realpath(joined)
    if real != expected:
        raise ConfinementError(
            "shard output folder", relative, root, f"resolves to {real!r}, not {expected!r} (a symlink?)"
        )
    return joined
