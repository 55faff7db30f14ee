"""What version of a shard's inputs a corpus-wide stage last built from, read from listings alone.

A corpus-wide stage (the ASR manifests, a language's shard index) keeps, per shard, the version of
the files it built that shard's part from; on its next run only the shards whose version differs are
read, gated and rebuilt. A version is taken from one listing per kind of file (``shards/*/x.parquet``
listed once, with details), never from reading a file: the cost of finding what changed grows with
the number of shards, in metadata only, and never with the rows or audio files they hold.

Every file the stage's output depends on is in the version, the ledger's inputs included (the landed
metadata and the product's rejects): a re-landed shard whose product is not rebuilt yet changes
version, so its ledger is checked again (and fails, as it would on a full rebuild).
"""

from __future__ import annotations

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


def listed_versions(data_root: DataRoot, shard_file: Callable[[str], str]) -> dict[str, str]:
    """``shard id -> file version`` of every shard that has ``shard_file(shard_id)``, from one glob."""
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
