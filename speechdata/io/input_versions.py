"""Which version of each input file a stage read: so inputs read ahead of a shard's turn can be trusted.

A GPU worker reads the next shard's inputs while the current shard is on the device; by the time
the shard's turn comes an input may have been replaced (a re-landing, a re-run upstream). The
fingerprint taken before the read tells the worker to read them again.
"""

from __future__ import annotations

from speechdata.io.storage import DataRoot

InputFingerprint = tuple[tuple[str, object, object], ...]
"""``(relative path, size, modification time or ETag)`` of every input file."""


def input_fingerprint(data_root: DataRoot, relatives: list[str]) -> InputFingerprint:
    """What identifies the current version of each input file (size and mtime, or the object's ETag).

    Taken before the files are read, so a file replaced during the read shows as changed."""
    fingerprint = []
    for relative in relatives:
        info = data_root.fs.info(data_root.path(relative))
        version = info.get("ETag") or info.get("mtime") or info.get("LastModified") or info.get("created")
        fingerprint.append((relative, info.get("size"), str(version)))
    return tuple(fingerprint)


def fingerprint_is_current(data_root: DataRoot, fingerprint: InputFingerprint) -> bool:
    """Whether every file of ``fingerprint`` is still the version it names (a removed file is not)."""
    try:
        return input_fingerprint(data_root, [relative for relative, _, _ in fingerprint]) == fingerprint
    except FileNotFoundError:
        return False
