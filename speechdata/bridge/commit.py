"""Stage a shard's bridge tars, then commit tars, index and manifest together once checked.

``bridge_tars`` packs into ``shards/<shard>/bridge_staged/`` and reads the tars back there; only a
set that reads back gets its staged index (the "ready" mark). ``shard_manifest`` builds the manifest
from the staged index, balances the bridge ledger, and only then commits: tars moved into
``bridge/`` under new names, index, manifest (the swap), the old version's tars removed, staging removed last. Until the commit a reader
sees the previous good version whole: tars are named by content, so new ones never overwrite the
tars the published manifest names, and the manifest is replaced only once every new tar is in place.
A commit killed half-way is finished by the next run (the staged index stays until every piece is in
place), so the swap is resumable and idempotent.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from speechdata.bridge.manifest import manifest_path
from speechdata.bridge.reader import verify_bridge_tars
from speechdata.bridge.tars import (
    DEFAULT_MAX_SAMPLES,
    DEFAULT_MAX_TAR_BYTES,
    BridgeSample,
    PackedTar,
    pack_samples,
    remove_stale_tars,
)
from speechdata.io import layout
from speechdata.io.faults import fault_point
from speechdata.io.storage import DataRoot


@dataclass(frozen=True)
class StagedBridge:
    tars: list[PackedTar]
    index: pa.Table
    problems: list[str]
    """Why the staged tars do not read back (empty: staged and ready to commit)."""


def stage_bridge(
    data_root: DataRoot,
    shard_id: str,
    samples: Iterator[BridgeSample],
    *,
    max_tar_bytes: int = DEFAULT_MAX_TAR_BYTES,
    max_samples: int = DEFAULT_MAX_SAMPLES,
) -> StagedBridge:
    """Pack into the staging folder and verify there; mark ready only when every tar reads back."""
    tars, index = pack_samples(data_root, shard_id, samples, max_tar_bytes=max_tar_bytes, max_samples=max_samples)
    staged_urls = [data_root.uri(layout.staged_bridge_tar(shard_id, n)) for n in range(len(tars))]
    fault_point("packing")  # tars staged, not yet verified nor marked ready
    keys = set(index["key"].to_pylist())
    problems = verify_bridge_tars(staged_urls, keys) if tars else []
    if problems:
        _remove_staging(data_root, shard_id)
    else:
        data_root.write_parquet(layout.staged_bridge_index(shard_id), index)
    return StagedBridge(tars, index, problems)


def staged_index(data_root: DataRoot, shard_id: str) -> pa.Table | None:
    """The staged index when a checked set of tars waits for its commit, else None."""
    relative = layout.staged_bridge_index(shard_id)
    return data_root.read_parquet(relative) if data_root.exists(relative) else None


def commit_bridge(data_root: DataRoot, shard_id: str, index: pa.Table, manifest: pa.Table) -> None:
    """Publish the staged version: tars, index, then the manifest (the swap), then retire the old tars.

    Tars are named by their content (:func:`layout.bridge_tar`), so moving the new ones into
    ``bridge/`` never touches a tar the published manifest names: until the manifest is replaced,
    readers see the old version whole, and after it the new one whole. A failure at any step leaves
    the staged index in place and the next run finishes the commit (resumable and idempotent).
    """
    final_tars = sorted(set(index["tar_url"].to_pylist()))
    for final in final_tars:
        staged = _staged_tar_of(shard_id, final)
        if data_root.exists(staged):  # absent: an interrupted commit already moved it
            data_root.replace(staged, final)
            fault_point("commit")  # half moved: the published manifest still names the old tars
    missing = [final for final in final_tars if not data_root.exists(final)]
    if missing:
        raise FileNotFoundError(
            f"{shard_id}: the staged index names {missing[:3]}, neither staged nor in bridge/: "
            "re-run bridge_tars for this shard"
        )
    data_root.write_parquet(layout.bridge_index(shard_id), index)
    fault_point("commit-index")
    data_root.write_parquet(manifest_path(shard_id), manifest)  # the swap: readers now see the new version
    fault_point("commit-manifest")
    remove_stale_tars(data_root, shard_id, keep=set(final_tars))
    fault_point("commit-stale-tars")
    data_root.fs.rm(data_root.path(layout.staged_bridge_index(shard_id)))
    _remove_staging(data_root, shard_id)


def _staged_tar_of(shard_id: str, final: str) -> str:
    """Where :func:`pack_samples` staged the tar the index names ``final`` (``bridge/<shard>-NNNNNN-<digest>.tar``)."""
    number = int(final.rsplit("/", 1)[-1][len(shard_id) + 1 :][:6])
    return layout.staged_bridge_tar(shard_id, number)


def _remove_staging(data_root: DataRoot, shard_id: str) -> None:
    # On an object store an emptied "folder" no longer exists at all.
    with contextlib.suppress(FileNotFoundError):
        data_root.fs.rm(data_root.path(layout.bridge_staging_dir(shard_id)), recursive=True)
