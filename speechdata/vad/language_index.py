"""Which shards, tars and files hold each language: the corpus's ``lid_index.pkl`` as a parquet table.

``language_index/language=<lang>/shard-<shard>.parquet`` holds the rows of one shard that holds the
language: the tar the loader streams, how many files (and which tar keys), hours of audio, of speech
and of usable chunks. :func:`update_language_shard_index` rewrites only the parts of shards whose
inputs changed (a new shard costs that shard, not the corpus); :func:`build_language_shard_index`
builds the whole table from every shard's ``vad_segments.parquet`` with DuckDB. Read back by
:func:`build_urls` (plain parquet reads, so training code needs neither Dagster nor DuckDB), by
DuckDB (``read_parquet('.../language_index/*/*.parquet', hive_partitioning = true)``) or polars.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import duckdb
import pyarrow as pa

from speechdata.accounting.ledger_gate import require_balanced
from speechdata.accounting.ledgers import produced_utterances
from speechdata.io import layout
from speechdata.io.duckdb_object_store import duckdb_location, enable_data_root_reads
from speechdata.io.shard_versions import LEDGER_INPUTS, shard_input_versions
from speechdata.io.storage import DataRoot, escape_glob
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
    """One row per shard with files in ``language``, from every shard's VAD table (sorted by shard),
    rebuilt from scratch (:func:`update_language_shard_index` is the incremental build).

    Raises :class:`~speechdata.accounting.ledger_gate.UnbalancedLedger` when a contributing shard's ``vad``
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
    return _index_table(language, rows, chunk_s, num_chunks)


def _index_table(language: str, rows: Iterable[tuple], chunk_s: float, num_chunks: int) -> pa.Table:
    """Index rows from ``(shard, tar_path, tar_key, duration_s, speech_s, start_s, end_s)`` tuples in
    ``(shard, audio_path)`` order: one per ``(shard, tar_path)``."""
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


def shard_language_rows(
    data_root: DataRoot, shard_id: str, language: str, *, chunk_s: float, num_chunks: int
) -> pa.Table:
    """One shard's rows of ``language``'s index, from its VAD table alone."""
    # Plain Python over one shard's rows: pyarrow.compute's first call imports pandas (seconds).
    table = data_root.read_parquet(layout.vad_segments(shard_id), list(_VAD_COLUMNS))
    columns = [table[name].to_pylist() for name in _VAD_COLUMNS]
    rows = sorted((row for row in zip(*columns, strict=True) if row[-1] == language), key=lambda row: row[-2])
    return _index_table(language, (row[:-2] for row in rows), chunk_s, num_chunks)


_VAD_COLUMNS = ("shard", "tar_path", "tar_key", "duration_s", "speech_s", "start_s", "end_s", "audio_path", "language")

TOTALS = ("files", "streamable_files", "hours", "speech_hours", "usable_chunk_hours")

LANGUAGE_INDEX_STATE_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.string(), nullable=False),
        pa.field("inputs_version", pa.string(), nullable=False),
        pa.field("chunk_s", pa.float64(), nullable=False),
        pa.field("num_chunks", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        *(LANGUAGE_INDEX_SCHEMA.field(name) for name in TOTALS),
    ]
)


@dataclass(frozen=True)
class LanguageIndexUpdate:
    language: str
    shards: int
    """Index rows (shards holding the language, one per tar) after the update."""
    totals: dict[str, float]
    """The index's ``files``, ``streamable_files``, ``hours``, ``speech_hours`` and ``usable_chunk_hours``."""
    shards_checked: list[str]
    """The shards whose inputs changed since the last update: only their VAD tables and ledgers were read."""
    parts_written: list[str] = field(default_factory=list)
    parts_removed: list[str] = field(default_factory=list)
    written: pa.Table = field(default_factory=LANGUAGE_INDEX_SCHEMA.empty_table)
    """The rows written by this update (the changed shards' rows)."""

    @property
    def shards_changed(self) -> list[str]:
        """Shards whose part was written or removed: the only ones whose tars a part stopped naming."""
        return sorted(set(self.parts_written) | set(self.parts_removed))


def vad_input_versions(data_root: DataRoot) -> dict[str, str]:
    """The version of every segmented shard's VAD table and ledger inputs (listings only)."""
    return shard_input_versions(data_root, layout.vad_segments, LEDGER_INPUTS)


def update_language_shard_index(
    data_root: DataRoot, language: str, *, chunk_s: float = DEFAULT_CHUNK_S, num_chunks: int = DEFAULT_NUM_CHUNKS
) -> LanguageIndexUpdate:
    """Bring ``language``'s index up to date, reading and gating only the shards that changed.

    The index is one part per shard (:func:`speechdata.io.layout.language_shard_index_part`); the
    state table (:func:`speechdata.io.layout.language_shard_index_state`) holds the version of each
    shard's inputs its part was built from (:func:`vad_input_versions`) and its totals. A shard whose
    version is unchanged is not read; a changed one has its ``vad`` ledger checked (every changed
    shard before anything is written: an unbalanced one stops the update and the index stays as it
    was) and its part rewritten, or removed when it holds no file of the language; a shard with no
    VAD table any more loses its part. A single-file index left by an earlier build
    (:func:`speechdata.io.layout.language_shard_index`) is rebuilt into parts and removed last.

    The state is written after the parts: a run killed before it leaves those shards "changed", and
    the next run rewrites the same bytes.
    """
    versions = vad_input_versions(data_root)
    state_path = layout.language_shard_index_state(language)
    legacy = layout.language_shard_index(language)
    state: dict[str, dict] = {}
    if data_root.exists(state_path) and not data_root.exists(legacy):
        state = {row["shard"]: row for row in data_root.read_parquet(state_path).to_pylist()}

    def unchanged(shard_id: str) -> bool:
        row = state.get(shard_id)
        return (
            row is not None
            and row["inputs_version"] == versions[shard_id]
            and row["chunk_s"] == chunk_s
            and row["num_chunks"] == num_chunks
        )

    changed = [shard_id for shard_id in versions if not unchanged(shard_id)]
    gone = sorted(set(state) - set(versions))
    for shard_id in changed:
        require_balanced(data_root, shard_id, "vad", produced_utterances(data_root, shard_id, "vad") or set())
    written, removed, written_tables = [], [], []
    new_state = {shard_id: row for shard_id, row in state.items() if shard_id in versions}
    for shard_id in changed:
        rows = shard_language_rows(data_root, shard_id, language, chunk_s=chunk_s, num_chunks=num_chunks)
        part = layout.language_shard_index_part(language, shard_id)
        if rows.num_rows:
            data_root.write_parquet(part, rows)
            written.append(shard_id)
            written_tables.append(rows)
        elif data_root.exists(part):
            data_root.fs.rm(data_root.path(part))
            removed.append(shard_id)
        new_state[shard_id] = {
            "shard": shard_id,
            "inputs_version": versions[shard_id],
            "chunk_s": chunk_s,
            "num_chunks": num_chunks,
            "rows": rows.num_rows,
            **{name: sum(rows[name].to_pylist()) for name in TOTALS},
        }
    for shard_id in gone:
        part = layout.language_shard_index_part(language, shard_id)
        if data_root.exists(part):
            data_root.fs.rm(data_root.path(part))
            removed.append(shard_id)
    rows_by_shard = [new_state[shard_id] for shard_id in sorted(new_state)]
    data_root.write_parquet(state_path, pa.Table.from_pylist(rows_by_shard, schema=LANGUAGE_INDEX_STATE_SCHEMA))
    if data_root.exists(legacy):
        data_root.fs.rm(data_root.path(legacy))
    return LanguageIndexUpdate(
        language=language,
        shards=sum(row["rows"] for row in rows_by_shard),
        totals={name: sum(row[name] for row in rows_by_shard) for name in TOTALS},
        shards_checked=changed,
        parts_written=written,
        parts_removed=removed,
        written=pa.concat_tables(written_tables) if written_tables else LANGUAGE_INDEX_SCHEMA.empty_table(),
    )


def language_index_parts(data_root: DataRoot, language: str) -> list[str]:
    """The files that hold ``language``'s index, relative to the data root: the single file an earlier
    build wrote while it is still there (it is removed only once every part is written), else the
    per-shard parts."""
    legacy = layout.language_shard_index(language)
    if data_root.exists(legacy):
        return [legacy]
    directory = layout.language_shard_index_dir(language)
    return sorted(
        f"{directory}/{path.rstrip('/').rsplit('/', 1)[-1]}"
        for path in data_root.glob(layout.language_shard_index_part(language, "*"))
    )


def read_language_shard_index(data_root: DataRoot, language: str) -> pa.Table:
    """The stored index of one language (every part, sorted by shard); an empty table if it was never built."""
    parts = [
        data_root.read_parquet(part).cast(LANGUAGE_INDEX_SCHEMA) for part in language_index_parts(data_root, language)
    ]
    if not parts:
        return LANGUAGE_INDEX_SCHEMA.empty_table()
    table = pa.concat_tables(parts)
    order = sorted(
        range(table.num_rows),
        key=list(zip(table["shard"].to_pylist(), table["tar_path"].to_pylist(), strict=True)).__getitem__,
    )
    return table.take(pa.array(order, pa.int64()))


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
