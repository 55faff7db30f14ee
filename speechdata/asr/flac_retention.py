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

from speechdata.io import layout
from speechdata.io.listing import modified_s
from speechdata.io.storage import DataRoot

MANIFEST_SPLITS = ("train", "validation", "eval")


def published_flac_paths(data_root: DataRoot) -> set[str]:
    """``flac_path`` (relative to the data root) of every row of every index and manifest."""
    named: set[str] = set()
    for index in data_root.glob(layout.asr_flac_index("*")):
        shard_id = index.split("/")[-2]
        named.update(data_root.read_parquet(layout.asr_flac_index(shard_id), ["flac_path"])["flac_path"].to_pylist())
    for split in MANIFEST_SPLITS:
        if data_root.exists(layout.asr_manifest(split)):
            named.update(data_root.read_parquet(layout.asr_manifest(split), ["flac_path"])["flac_path"].to_pylist())
    return named


def remove_unreferenced_flacs(data_root: DataRoot) -> int:
    """Remove every FLAC under ``asr/flac/`` that no index or manifest names and that is older than
    its shard's index; return how many were removed. Call it only after the manifests are written."""
    flac_root = data_root.path(f"{layout.ASR}/flac")
    if not data_root.fs.exists(flac_root):
        return 0
    named = published_flac_paths(data_root)
    removed = 0
    for directory in data_root.fs.ls(flac_root, detail=False):
        shard_id = directory.rstrip("/").rsplit("/", 1)[-1]
        if not layout.is_valid_shard_id(shard_id) or not data_root.exists(layout.asr_flac_index(shard_id)):
            continue
        published_at = modified_s(data_root.fs.info(data_root.path(layout.asr_flac_index(shard_id))))
        for info in data_root.fs.ls(directory, detail=True):
            name = info["name"].rsplit("/", 1)[-1]
            relative = f"{layout.asr_flac_dir(shard_id)}/{name}"
            if not name.endswith(".flac") or relative in named or modified_s(info) >= published_at:
                continue
            data_root.fs.rm(info["name"])
            removed += 1
    return removed
