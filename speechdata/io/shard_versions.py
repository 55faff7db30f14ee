"""What version of a shard's inputs a corpus-wide stage last built from, read from listings alone.

A corpus-wide stage (the ASR manifests, a language's shard index) keeps, per shard, the version of
the files it built that shard's part from; on its next run only the shards whose version differs are
read, gated and rebuilt. A version is taken from one listing per kind of file (``shards/*/x.parquet``
listed once, with details), never from reading a file: the cost of finding what changed grows with
the number of shards, in metadata only, and never with the rows or audio files they hold.

Every file the stage's output and its ledger gate depend on is in the version, through the files
that change with them: the product's output, the utterance index (``raw_shards`` writes it with its
rejects) and the landed metadata (:data:`LEDGER_INPUTS`); a stage's rejects are written by the run
that writes its output. A re-landed shard whose product is not rebuilt yet changes version, so its
ledger is checked again (and fails, as it would on a full rebuild).

On a local root the listing is one ``scandir`` of ``shards/`` (or ``landing/``) and one ``stat``
per shard and file, never a walk of a shard's folder (which holds its audio and per-stage files);
on an object store, one prefix listing per kind of file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from speechdata.io import layout
from speechdata.io.listing import modified_s
from speechdata.io.storage import DataRoot

ABSENT = "-"


def file_version(info: dict) -> str:
    """One listing entry as a token that changes whenever the file is replaced: size, modification
    time and, where the filesystem gives one, its inode (local; an atomic write is a rename, so a new
    inode) or ETag (object stores)."""
    identity = info.get("ino") or info.get("ETag") or info.get("etag") or info.get("md5Hash") or ""
    return f"{info.get('size')}:{modified_s(info):.6f}:{str(identity).strip(chr(34))}"


LEDGER_INPUTS: tuple[Callable[[str], str], ...] = (layout.utterance_index, layout.landing_metadata)


def _local_versions(data_root: DataRoot, shard_file: Callable[[str], str]) -> dict[str, str]:
    pattern = shard_file("*")
    parent = data_root.path(pattern.split("*", 1)[0].rstrip("/"))
    versions = {}
    try:
        entries = list(os.scandir(parent))
    except FileNotFoundError:
        return {}
    for entry in entries:
        if not layout.is_valid_shard_id(entry.name):
            continue
        try:
            stat = os.stat(data_root.path(shard_file(entry.name)))
        except (FileNotFoundError, NotADirectoryError):
            continue
        versions[entry.name] = f"{stat.st_size}:{stat.st_mtime_ns / 1e9:.6f}:{stat.st_ino}"
    return versions


def listed_versions(data_root: DataRoot, shard_file: Callable[[str], str]) -> dict[str, str]:
    """``shard id -> file version`` of every shard that has ``shard_file(shard_id)``."""
    if data_root.is_local:
        return _local_versions(data_root, shard_file)
    pattern = shard_file("*")
    position = pattern.split("/").index("*")
    prefix = data_root.path("").rstrip("/") + "/"
    versions = {}
    for path, info in data_root.fs.glob(f"{prefix}{pattern}", detail=True).items():
        relative = path[len(prefix) :] if path.startswith(prefix) else path.rsplit(data_root.root.rstrip("/"), 1)[-1]
        shard_id = relative.lstrip("/").split("/")[position]
        if layout.is_valid_shard_id(shard_id):
            versions[shard_id] = file_version(info)
    return versions


def shard_input_versions(
    data_root: DataRoot, primary: Callable[[str], str], others: Sequence[Callable[[str], str]] = ()
) -> dict[str, str]:
    """``shard id -> version`` of every shard that has its ``primary`` file: the versions of the
    primary and each of ``others`` (``-`` where a shard lacks one), joined in that order."""
    primary_versions = listed_versions(data_root, primary)
    other_versions = [listed_versions(data_root, shard_file) for shard_file in others]
    return {
        shard_id: "|".join([version, *(listed.get(shard_id, ABSENT) for listed in other_versions)])
        for shard_id, version in sorted(primary_versions.items())
    }
