"""Remove the packed audio tars that no published VAD table names any more, and only those.

A packed tar (``shards/<shard>/audio-<sha16>.tar``) is named by its shard's
``vad_segments.parquet`` and by its shard's part of a language index (``language_index/language=<lang>/
shard-<shard>.parquet``, or the single ``part-0.parquet`` of an earlier build) built while that
table was current. A shard's tars live in its own folder, so only its own parts are read: the cost of
a collection is the shard's, not the corpus's. A language index is rebuilt per language, at
its own time, so a tar stays as long as any part still names it: the loader a part leads to finds
the bytes the part described.

A tar newer than its shard's segments table belongs to a ``vad_segments`` run still in flight (the
tar is written before the table that names it); it is kept, and the next collection after that run
decides. A shard with no segments table is skipped for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable

from speechdata.io import layout
from speechdata.io.listing import modified_s
from speechdata.io.storage import DataRoot

_LEGACY_INDEX_GLOB = layout.language_shard_index("*")


def published_tar_paths(data_root: DataRoot, shard_id: str | None = None) -> set[str]:
    """``tar_path`` (relative to the data root) of every row of every language index part; with
    ``shard_id``, of the parts that can name that shard's tars: its own part in every language (a
    shard's tars are in its own folder, so no other shard's part names them) and any single-file
    index an earlier build left."""
    named: set[str] = set()
    prefix = data_root.path("")
    if shard_id is None:
        paths = [path[len(prefix) :] for path in data_root.glob(layout.language_shard_index_part("*", "*"))]
        paths += [path[len(prefix) :] for path in data_root.glob(_LEGACY_INDEX_GLOB)]
    else:
        paths = _parts_naming(data_root, shard_id)
    for path in paths:
        named.update(data_root.read_parquet(path, ["tar_path"])["tar_path"].to_pylist())
    return named


def _parts_naming(data_root: DataRoot, shard_id: str) -> list[str]:
    """The shard's own part and any single-file index, in each language folder: one listing of the
    languages and a stat per language. A glob of ``language=*/shard-<id>.parquet`` would list every
    part of every language (one per shard): a cost per new shard that grows with the corpus, and a
    first import of N shards that costs N^2 (minutes at 4 760 shards)."""
    prefix = data_root.path("")
    part_name = layout.language_shard_index_part("any", shard_id).rsplit("/", 1)[-1]
    legacy_name = layout.language_shard_index("any").rsplit("/", 1)[-1]
    found = []
    for folder in sorted(data_root.glob(f"{layout.LANGUAGE_INDEX}/language=*")):
        relative = folder[len(prefix) :].rstrip("/")
        found += [path for path in (f"{relative}/{part_name}", f"{relative}/{legacy_name}") if data_root.exists(path)]
    return found


def remove_unreferenced_packed_tars(data_root: DataRoot, shard_id: str | Iterable[str] | None = None) -> int:
    """Remove the packed tars of ``shard_id`` (a shard, several, or every shard if None) that neither
    its segments table nor any language index names and that are older than its table; return how
    many were removed. Each shard reads only its own table and index parts."""
    if shard_id is None:
        shard_ids = _shards_with_segments(data_root)
    else:
        shard_ids = [shard_id] if isinstance(shard_id, str) else sorted(shard_id)
    removed = 0
    for shard in shard_ids:
        table_path = layout.vad_segments(shard)
        if not data_root.exists(table_path):
            continue
        own = set(data_root.read_parquet(table_path, ["tar_path"])["tar_path"].to_pylist())
        named = published_tar_paths(data_root, shard)
        published_at = modified_s(data_root.fs.info(data_root.path(table_path)))
        for info in data_root.fs.ls(data_root.path(layout.shard_dir(shard)), detail=True):
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            relative = f"{layout.shard_dir(shard)}/{name}"
            if not layout.is_packed_audio_tar_name(name) or relative in own or relative in named:
                continue
            if modified_s(info) >= published_at:
                continue
            data_root.fs.rm(info["name"])
            removed += 1
    return removed


def _shards_with_segments(data_root: DataRoot) -> list[str]:
    return sorted(path.split("/")[-2] for path in data_root.glob(layout.vad_segments("*")))
