"""Remove the ASR FLACs that no published table names any more, and only those.

A FLAC is published by its shard's ``asr_flac.parquet`` (the extraction's index) and by the
manifests (``asr/manifests/<split>.parquet`` and the NeMo ``.jsonl`` beside it, written from the
same frame). :func:`remove_unreferenced_flacs` runs after the manifest build has written every
manifest file, so what a reader can still open names only kept files.

One more kind of FLAC is kept though nothing names it yet: a file newer than its shard's index
belongs to an extraction still in flight (its files are written before its index) or to one that
failed before its index; the shard's next successful extraction publishes or orphans it, and the
next collection after that removes it. A shard with no index at all is skipped for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from speechdata.io import layout
from speechdata.io.listing import modified_s
from speechdata.io.storage import DataRoot

MANIFEST_SPLITS = ("train", "validation", "eval")


def published_flac_paths(data_root: DataRoot) -> set[str]:
    """``flac_path`` (relative to the data root) of every row of every index, manifest and part."""
    named: set[str] = set()
    for index in data_root.glob(layout.asr_flac_index("*")):
        named |= shard_published_flac_paths(data_root, index.split("/")[-2])
    for split in MANIFEST_SPLITS:
        if data_root.exists(layout.asr_manifest(split)):
            named.update(data_root.read_parquet(layout.asr_manifest(split), ["flac_path"])["flac_path"].to_pylist())
    return named


def shard_published_flac_paths(data_root: DataRoot, shard_id: str) -> set[str]:
    """``flac_path`` of the shard's index and of its manifest parts: every published name of a FLAC
    under ``asr/flac/<shard>/`` once the corpus-wide files are concatenated from the parts (each
    manifest row's FLAC is its own shard's; ``eval`` is a subset of the validation parts)."""
    named: set[str] = set()
    for relative in (
        layout.asr_flac_index(shard_id),
        layout.asr_manifest_part("train", shard_id),
        layout.asr_manifest_part("validation", shard_id),
    ):
        if data_root.exists(relative):
            named.update(data_root.read_parquet(relative, ["flac_path"])["flac_path"].to_pylist())
    return named


def remove_unreferenced_flacs(data_root: DataRoot, shard_ids: Iterable[str] | None = None) -> int:
    """Remove every FLAC under ``asr/flac/`` that no index or manifest names and that is older than
    its shard's index; return how many were removed. Call it only after the manifests are written.

    ``shard_ids``: only those shards' folders, each checked against its own index and manifest parts
    (what the incremental build does for the shards that changed: its corpus-wide files were just
    concatenated from those parts); None: every shard, against every published table."""
    flac_root = data_root.path(f"{layout.ASR}/flac")
    if not data_root.fs.exists(flac_root):
        return 0
    if shard_ids is None:
        named = published_flac_paths(data_root)
        directories = [d.rstrip("/").rsplit("/", 1)[-1] for d in data_root.fs.ls(flac_root, detail=False)]
    else:
        named = None
        directories = sorted(shard_ids)
    removed = 0
    for shard_id in directories:
        if not layout.is_valid_shard_id(shard_id) or not data_root.exists(layout.asr_flac_index(shard_id)):
            continue
        directory = data_root.path(layout.asr_flac_dir(shard_id))
        if not data_root.fs.exists(directory):
            continue
        shard_named = named if named is not None else shard_published_flac_paths(data_root, shard_id)
        published_at = modified_s(data_root.fs.info(data_root.path(layout.asr_flac_index(shard_id))))
        for info in data_root.fs.ls(directory, detail=True):
            name = info["name"].rsplit("/", 1)[-1]
            relative = f"{layout.asr_flac_dir(shard_id)}/{name}"
            if not name.endswith(".flac") or relative in shard_named or modified_s(info) >= published_at:
                continue
            data_root.fs.rm(info["name"])
            removed += 1
    return removed
