"""Which shards, tars and files hold each language: the corpus's ``lid_index.pkl`` as a parquet table.

``language_index/language=<lang>/part-0.parquet`` has one row per shard that holds the language:
the tar the loader streams, how many files (and which tar keys), hours of audio, of speech and of
usable chunks. It is built from every shard's ``vad_segments.parquet`` with DuckDB, and read back by
:func:`build_urls` (plain parquet reads, so training code needs neither Dagster nor DuckDB), by
DuckDB (``read_parquet('.../language_index/*/*.parquet', hive_partitioning = true)``) or polars.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import duckdb
import pyarrow as pa

from speechdata.io import layout
from speechdata.io.duckdb_object_store import duckdb_location, enable_data_root_reads
from speechdata.io.storage import DataRoot, escape_glob
from speechdata.ledger_gate import require_balanced
from speechdata.ledgers import produced_utterances
from speechdata.vad.chunks import DEFAULT_CHUNK_S, DEFAULT_NUM_CHUNKS, usable_chunk_seconds

LANGUAGE_INDEX_SCHEMA = pa.schema(
    [
        pa.field("language", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("tar_path", pa.string(), nullable=False),
        pa.field("files", pa.int64(), nullable=False),
        pa.field("streamable_files", pa.int64(), nullable=False),
        pa.field("hours", pa.float64(), nullable=False),
        pa.field("speech_hours", pa.float64(), nullable=False),
        pa.field("usable_chunk_hours", pa.float64(), nullable=False),
        pa.field("tar_keys", pa.list_(pa.string()), nullable=False),
    ]
)

_VAD_GLOB = f"{layout.SHARDS}/*/vad_segments.parquet"  # temp files are "._tmp-*", never matched


def build_language_shard_index(
    data_root: DataRoot, language: str, *, chunk_s: float = DEFAULT_CHUNK_S, num_chunks: int = DEFAULT_NUM_CHUNKS
) -> pa.Table:
    """One row per shard with files in ``language``, from every shard's VAD table (sorted by shard).

    Raises :class:`~speechdata.ledger_gate.UnbalancedLedger` when a contributing shard's ``vad``
    ledger does not balance."""
    if not data_root.glob(_VAD_GLOB):
        return LANGUAGE_INDEX_SCHEMA.empty_table()
    source = f"{escape_glob(duckdb_location(data_root.url))}/{_VAD_GLOB}"
    with duckdb.connect() as connection:
        enable_data_root_reads(connection, data_root)
        rows = connection.execute(
            "SELECT shard, tar_path, tar_key, duration_s, speech_s, start_s, end_s "
            "FROM read_parquet(?) WHERE language = ? ORDER BY shard, audio_path",
            [source, language],
        ).fetchall()
    # Every shard is checked, not only those with rows here: a lost row may be the shard's only
    # file in this language. An unbalanced shard (a stale table after a re-landing, a lost row)
    # stops the build (UnbalancedLedger names it), and the previous index stays.
    for path in sorted(data_root.glob(_VAD_GLOB)):
        shard = path.rstrip("/").split("/")[-2]
        require_balanced(data_root, shard, "vad", produced_utterances(data_root, shard, "vad") or set())
    by_shard: dict[tuple[str, str], dict] = defaultdict(
        lambda: {"files": 0, "keys": [], "audio_s": 0.0, "speech_s": 0.0, "usable_s": 0.0}
    )
    for shard, tar_path, tar_key, duration_s, speech_s, start_s, end_s in rows:
        entry = by_shard[(shard, tar_path)]
        entry["files"] += 1
        entry["audio_s"] += duration_s
        entry["speech_s"] += speech_s
        if tar_key is not None:
            entry["keys"].append(tar_key)
            entry["usable_s"] += usable_chunk_seconds(start_s, end_s, chunk_s, num_chunks)
    return pa.Table.from_pylist(
        [
            {
                "language": language,
                "shard": shard,
                "tar_path": tar_path,
                "files": e["files"],
                "streamable_files": len(e["keys"]),
                "hours": e["audio_s"] / 3600.0,
                "speech_hours": e["speech_s"] / 3600.0,
                "usable_chunk_hours": e["usable_s"] / 3600.0,
                "tar_keys": e["keys"],
            }
            for (shard, tar_path), e in sorted(by_shard.items())
        ],
        schema=LANGUAGE_INDEX_SCHEMA,
    )


def read_language_shard_index(data_root: DataRoot, language: str) -> pa.Table:
    """The stored index of one language; an empty table if it was never built."""
    relative = layout.language_shard_index(language)
    if not data_root.exists(relative):
        return LANGUAGE_INDEX_SCHEMA.empty_table()
    return data_root.read_parquet(relative)


def build_urls(langs: Iterable[str], data_root: DataRoot | str) -> list[str]:
    """URLs of the tars holding streamable files in any of ``langs`` (the original loader's ``build_urls``).

    Tars hold mixed languages: filter samples with the loader's ``languages``, as the original loader did.
    """
    root = DataRoot(data_root) if isinstance(data_root, str) else data_root
    tar_paths: set[str] = set()
    for language in set(langs):
        index = read_language_shard_index(root, language)
        for tar_path, streamable in zip(
            index["tar_path"].to_pylist(), index["streamable_files"].to_pylist(), strict=True
        ):
            if streamable:
                tar_paths.add(tar_path)
    return [root.uri(path) for path in sorted(tar_paths)]
