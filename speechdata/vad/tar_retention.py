"""Remove the packed audio tars that no published VAD table names any more, and only those.

A packed tar (``shards/<shard>/audio-<sha16>.tar``) is named by its shard's
``vad_segments.parquet`` and by every language index part (``language_index/language=<lang>/
part-0.parquet``) built while that table was current. A language index is rebuilt per language, at
its own time, so a tar stays as long as any part still names it: the loader a part leads to finds
the bytes the part described.

A tar newer than its shard's segments table belongs to a ``vad_segments`` run still in flight (the
tar is written before the table that names it); it is kept, and the next collection after that run
decides. A shard with no segments table is skipped for the same reason.
"""

from __future__ import annotations

from speechdata.io import layout
from speechdata.io.listing import modified_s
from speechdata.io.storage import DataRoot

_LANGUAGE_INDEX_GLOB = f"{layout.LANGUAGE_INDEX}/*/part-0.parquet"


def published_tar_paths(data_root: DataRoot) -> set[str]:
    """``tar_path`` (relative to the data root) of every row of every language index part."""
    named: set[str] = set()
    for path in data_root.glob(_LANGUAGE_INDEX_GLOB):
        relative = path[len(data_root.path("")) :]
        named.update(data_root.read_parquet(relative, ["tar_path"])["tar_path"].to_pylist())
    return named


def remove_unreferenced_packed_tars(data_root: DataRoot, shard_id: str | None = None) -> int:
    """Remove the packed tars of ``shard_id`` (every shard if None) that neither its segments table nor
    any language index names and that are older than its table; return how many were removed."""
    shard_ids = [shard_id] if shard_id is not None else _shards_with_segments(data_root)
    named = published_tar_paths(data_root)
    removed = 0
    for shard in shard_ids:
        table_path = layout.vad_segments(shard)
        if not data_root.exists(table_path):
            continue
        own = set(data_root.read_parquet(table_path, ["tar_path"])["tar_path"].to_pylist())
        published_at = modified_s(data_root.fs.info(data_root.path(table_path)))
        for info in data_root.fs.ls(data_root.path(layout.shard_dir(shard)), detail=True):
            name = info["name"].rstrip("/").rsplit("/", 1)[-1]
            relative = f"{layout.shard_dir(shard)}/{name}"
            if not layout.is_packed_audio_tar_name(name) or relative in own | named:
                continue
            if modified_s(info) >= published_at:
                continue
            data_root.fs.rm(info["name"])
            removed += 1
    return removed


def _shards_with_segments(data_root: DataRoot) -> list[str]:
    return sorted(path.split("/")[-2] for path in data_root.glob(layout.vad_segments("*")))
