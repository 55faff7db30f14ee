"""The one guard for paths built from user data: partition keys, utt ids, audio paths, tar members,
importer sources. Every such path is resolved (symlinks included, on a local disk) and refused with
a reason when it leaves the root it was meant for.
"""

from __future__ import annotations

import os
import posixpath
import re

from speechdata.io.layout import SHARD_ID_PATTERN

_DRIVE = re.compile(r"^[A-Za-z]:")


class ConfinementError(ValueError):
    """A path built from user data would leave its root. The message names the path, root and rule."""

    def __init__(self, what: str, value: str, root: str, rule: str):
        self.what, self.value, self.root, self.rule = what, value, root, rule
        super().__init__(f"refusing {what} {value!r}: {rule} (root {root!r})")


def validate_partition_key(shard_id: str) -> str:
    """A shard id (a Dagster partition key) that is safe as a folder and file name, or ConfinementError."""
    if not isinstance(shard_id, str) or not SHARD_ID_PATTERN.match(shard_id):
        raise ConfinementError(
            "shard id", str(shard_id), "shards/", f"a shard id must match {SHARD_ID_PATTERN.pattern}"
        )
    return shard_id


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
