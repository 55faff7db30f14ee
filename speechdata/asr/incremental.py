"""The ASR manifests built shard by shard: a new shard costs that shard (and the few shards it
shares a duplicate with), not the corpus.

The result is the one :func:`speechdata.asr.manifest.build_asr_manifest` gives on every shard at once
(the tests hold them equal); only where the work happens changes:

* **Per shard, once per input version** (:func:`prepare_shard`): language corrections, the cheap
  filters, cleaning and the ``<|lang|>`` tag, and the keys of the later steps: the audio key (the
  MD5 of the PCM's SHA-1, 64 bits), the text key (a stable MD5 of recording, cleaned text and
  duration step), the recording's split bucket and the utterance's eval hash. Written to
  :func:`~speechdata.io.layout.asr_manifest_prepared`; the shard's inputs are not read again while
  their version (:mod:`speechdata.io.shard_versions`: listings only) is unchanged, and the ledger gate
  runs only for shards whose version changed.
* **Across shards, through an index** (a SQLite file, :func:`~speechdata.io.layout.asr_manifest_state`):
  every candidate row's audio and text key, so deduplication ("the first by ``(shard_id, utt_id)``
  is kept") is a lookup of the changed shard's keys, not a pass over the corpus. A changed shard
  marks for rewriting the shards that hold one of its keys (the first of a group may have moved)
  and those holding a text key of a row whose audio group it joined or left (two hops: text
  duplicates are counted among rows that are not audio duplicates). Kept recordings and their
  buckets decide the split; the recording forced into validation when none falls under the share
  (:mod:`speechdata.asr.split`) is recomputed from them, and a change marks the shards holding the
  old and the new one. Each shard's eval candidates (its ``eval_per_language`` smallest per
  language) are kept, so the eval subset is a small query.
* **Published per shard**: ``asr/manifests/parts/{train,validation}/<shard>.{parquet,jsonl}`` and
  ``parts/removed/<shard>.parquet``, rewritten only for the shards marked. ``eval`` is written whole
  (``eval_per_language`` rows per language). The corpus-wide files ``train``/``validation``
  ``.parquet``/``.jsonl`` and ``removed.parquet`` are a streamed concatenation of the parts in shard
  order (one part in memory at a time), skipped when nothing changed, or not written at all
  (``combined=False``: NeMo then reads the parts, e.g. as a comma-separated ``manifest_filepath``).

Crash safety: the prepared part is written before the index learns the shard's new version; the
index update and the marks it causes are one transaction; a marked shard's parts are written
before its mark is cleared; the combined files are flagged stale before any part changes and
rewritten (then the flag cleared) at the end. A run killed anywhere leaves marks and flags that make
the next run finish the same work, to the same bytes.

Anything that changes every shard's rows (the config, the corrections table, the audio root)
changes the build's fingerprint: the index is then emptied and every shard rebuilt, shard by shard
(memory stays one shard's).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import polars as pl
import pyarrow as pa

from speechdata.asr.filters import REMOVAL_REASONS, filtered_in_key_order, rejected_report
from speechdata.asr.manifest import (
    FLAC_COLUMNS,
    MANIFEST_COLUMNS,
    UTTERANCE_COLUMNS,
    AsrManifestConfig,
    _with_clean_text,
    apply_language_corrections,
    conform,
    manifest_row_columns,
    nemo_jsonl_bytes,
)
from speechdata.asr.split import HASH_BUCKETS, MIN_RECORDINGS_FOR_HELD_OUT, UTTERANCE_KEY, SaltedMd5
from speechdata.io import layout
from speechdata.io.faults import fault_point
from speechdata.io.storage import DataRoot

STATE_FORMAT = "asr-manifest-state-v2"  # v2: rows carry asr_confidence
TEXT_KEY_SALT = "asr-text-group-v1:"
AUDIO_KEY_SALT = "asr-audio-v1:"
NULL_AUDIO_KEY = -(2**63)
"""The audio key of a row without a PCM hash: such rows group together, as the corpus-wide build's
null-equal join groups them."""

MANIFEST_SCHEMA = {
    "utt_id": pl.String,
    "shard_id": pl.String,
    "text": pl.String,
    "duration": pl.Float64,
    "lang": pl.String,
    "audio_filepath": pl.String,
    "flac_path": pl.String,
    "source": pl.String,
    "recording_id": pl.String,
    "original_language": pl.String,
    "quality": pl.Float64,
    "text_source": pl.String,
    "asr_confidence": pl.Float32,
}
REMOVED_SCHEMA = {"shard_id": pl.String, "utt_id": pl.String, "reason": pl.String, "detail": pl.String}
PREPARED_SCHEMA = {
    "_row": pl.UInt32,
    "shard_id": pl.String,
    "utt_id": pl.String,
    "reason": pl.String,
    "detail": pl.String,
    **{name: dtype for name, dtype in MANIFEST_SCHEMA.items() if name not in ("utt_id", "shard_id")},
    "recording_key": pl.String,
    "audio_key": pl.Int64,
    "text_key": pl.Int64,
    "bucket": pl.Int64,
    "eval_key": pl.Int64,
}
assert list(MANIFEST_SCHEMA) == MANIFEST_COLUMNS


def _u64_as_ordered_i64(values: pl.Series) -> pl.Series:
    """A ``UInt64`` as an ``Int64`` of the same order (SQLite integers are signed)."""
    flipped = values.fill_null(0).to_numpy().astype(np.uint64) ^ np.uint64(1 << 63)
    return pl.Series(values.name, flipped.view(np.int64), dtype=pl.Int64).scatter(values.is_null().arg_true(), None)


def _u64_as_i64(values: pl.Series) -> pl.Series:
    """The same 64 bits as ``Int64``; nulls stay null."""
    bits = pl.Series(values.name, values.fill_null(0).to_numpy().view(np.int64), dtype=pl.Int64)
    return bits.scatter(values.is_null().arg_true(), None)


@dataclass(frozen=True)
class PreparedShard:
    rows: pl.DataFrame
    """:data:`PREPARED_SCHEMA`, in key order: every input row; ``reason`` set on those removed by a
    per-shard step, null on the candidates deduplication and the split decide."""
    relabeled: dict[str, int]
    input_rows: int


def prepare_shard(
    utterances: pl.DataFrame,
    flac: pl.DataFrame,
    *,
    config: AsrManifestConfig,
    audio_root: str,
    corrections: pl.DataFrame | None,
    salted_md5: SaltedMd5,
) -> PreparedShard:
    """Steps 1-3 of :mod:`speechdata.asr.manifest` for one shard, and the keys of steps 4-6."""
    utterances = apply_language_corrections(conform(utterances, UTTERANCE_COLUMNS), corrections)
    passing, rejected, joined = filtered_in_key_order(
        utterances,
        conform(flac, FLAC_COLUMNS),
        min_duration_s=config.min_duration_s,
        max_duration_s=config.max_duration_s,
        min_quality=config.min_quality,
    )
    early = rejected_report(rejected)
    passing = _with_clean_text(passing)
    duration_step = (
        (pl.col("duration_s") * 1000 / config.dedup_duration_resolution_ms).round().cast(pl.Int64).cast(pl.String)
    )
    candidates = passing.select(
        "_row",
        "shard_id",
        "utt_id",
        "reason",
        "detail",
        *manifest_row_columns(audio_root),
        "recording_key",
        "audio_sha1",
        pl.concat_str(
            [pl.col("recording_key"), pl.col("clean_text"), duration_step], separator="\x1f", ignore_nulls=False
        ).alias("text_group"),
        UTTERANCE_KEY.alias("utterance_key"),
    )
    # Any string hashes (a malformed hash stays a group of its own, as in the corpus-wide build).
    audio_key = _u64_as_i64(salted_md5(AUDIO_KEY_SALT + candidates["audio_sha1"]))
    # On the build's connection (opening one costs more than hashing a shard): salted again, so a text
    # key never equals a recording's hash.
    text_key = _u64_as_i64(salted_md5(TEXT_KEY_SALT + candidates["text_group"].fill_null("")))
    candidates = candidates.with_columns(
        audio_key.fill_null(NULL_AUDIO_KEY).alias("audio_key"),
        text_key.alias("text_key"),
        (salted_md5(candidates["recording_key"]) % HASH_BUCKETS).cast(pl.Int64).alias("bucket"),
        _u64_as_ordered_i64(salted_md5(candidates["utterance_key"])).alias("eval_key"),
    ).drop("audio_sha1", "text_group", "utterance_key")
    rows = pl.concat([conform(early, PREPARED_SCHEMA), conform(candidates, PREPARED_SCHEMA)], how="vertical").sort(
        "_row"
    )
    changed = joined.filter(pl.col("original_language").ne_missing(pl.col("language")))
    relabeled = Counter(
        f"{old if old is not None else 'null'}->{new if new is not None else 'null'}"
        for old, new in changed.select("original_language", "language").iter_rows()
    )
    return PreparedShard(rows=rows, relabeled=dict(sorted(relabeled.items())), input_rows=utterances.height)


# --- the state


_SCHEMA_SQL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS shards (
    shard_id TEXT PRIMARY KEY,
    inputs_version TEXT NOT NULL,
    marked INTEGER NOT NULL,          -- 1: its parts must be rewritten
    flacs_pending INTEGER NOT NULL,   -- 1: its FLACs must be collected once the manifests are written
    forced_at_write TEXT,             -- the forced validation recording its parts were written with
    prepared_info TEXT,               -- JSON: input rows and relabels, from its preparation
    stats TEXT                        -- JSON: rows per split and language, removals, relabels
);
CREATE INDEX IF NOT EXISTS shards_marked ON shards (shard_id) WHERE marked = 1;
CREATE INDEX IF NOT EXISTS shards_flacs_pending ON shards (shard_id) WHERE flacs_pending = 1;
CREATE TABLE IF NOT EXISTS candidates (
    shard_id TEXT NOT NULL, row INTEGER NOT NULL, utt_id TEXT NOT NULL,
    audio INTEGER NOT NULL, text_key INTEGER NOT NULL,
    PRIMARY KEY (shard_id, row)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS candidates_by_audio ON candidates (audio, shard_id, row);
CREATE INDEX IF NOT EXISTS candidates_by_text ON candidates (text_key, shard_id, row);
CREATE TABLE IF NOT EXISTS kept_recordings (
    shard_id TEXT NOT NULL, recording_key TEXT NOT NULL, bucket INTEGER NOT NULL,
    PRIMARY KEY (shard_id, recording_key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS kept_recordings_by_bucket ON kept_recordings (bucket, recording_key);
CREATE INDEX IF NOT EXISTS kept_recordings_by_key ON kept_recordings (recording_key);
CREATE TABLE IF NOT EXISTS eval_candidates (
    shard_id TEXT NOT NULL, lang TEXT NOT NULL, eval_key INTEGER NOT NULL, key TEXT NOT NULL, row TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS eval_candidates_by_shard ON eval_candidates (shard_id);
CREATE INDEX IF NOT EXISTS eval_candidates_by_order ON eval_candidates (lang, eval_key, key);
CREATE TABLE IF NOT EXISTS correction_ids (shard_id TEXT NOT NULL, utt_id TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS correction_ids_by_shard ON correction_ids (shard_id);
"""


def state_path(data_root: DataRoot) -> str:
    """Where the state's SQLite file lives: in the data root when it is a local (POSIX) filesystem;
    for an object store, in a local directory keyed by the root's URL (a lost file costs one full
    rebuild, never a wrong manifest: it only remembers what the parts already hold)."""
    if data_root.is_local:
        path = data_root.path(layout.asr_manifest_state())
    else:
        digest = hashlib.sha1(data_root.url.encode()).hexdigest()[:16]
        base = os.environ.get("SPEECHDATA_STATE_DIR") or os.path.join(tempfile.gettempdir(), "speechdata-state")
        path = os.path.join(base, digest, "asr_manifest.sqlite")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


@contextlib.contextmanager
def open_state(data_root: DataRoot) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(state_path(data_root), isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        connection.executescript(_SCHEMA_SQL)
        yield connection
    finally:
        connection.close()


@contextlib.contextmanager
def transaction(connection: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    connection.execute("BEGIN IMMEDIATE")
    try:
        yield connection
    except BaseException:
        connection.execute("ROLLBACK")
        raise
    connection.execute("COMMIT")


def state_value(connection: sqlite3.Connection, key: str) -> str | None:
    row = connection.execute("SELECT value FROM meta WHERE key = ?", [key]).fetchone()
    return None if row is None else row[0]


def set_state_value(connection: sqlite3.Connection, key: str, value: str | None) -> None:
    if value is None:
        connection.execute("DELETE FROM meta WHERE key = ?", [key])
    else:
        connection.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", [key, value])


def reset_for_fingerprint(connection: sqlite3.Connection, fingerprint: str) -> bool:
    """Empty the state when the build's fingerprint changed (every shard is then rebuilt); True if so."""
    if state_value(connection, "fingerprint") == fingerprint:
        return False
    with transaction(connection):
        # Shards stay listed (their FLACs and parts are still to be handled), every one marked changed.
        connection.execute("UPDATE shards SET inputs_version = '', marked = 1, flacs_pending = 1")
        for table in ("candidates", "kept_recordings", "eval_candidates", "correction_ids"):
            connection.execute(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
        set_state_value(connection, "fingerprint", fingerprint)
        set_state_value(connection, "forced", None)
        set_state_value(connection, "combined_current", "0")
    return True


def _keys_table(connection: sqlite3.Connection, name: str, values) -> None:
    connection.execute(f"CREATE TEMP TABLE IF NOT EXISTS {name} (k INTEGER PRIMARY KEY)")
    connection.execute(f"DELETE FROM {name}")  # noqa: S608 - fixed table names
    connection.executemany(f"INSERT OR IGNORE INTO {name} VALUES (?)", ((int(v),) for v in values))  # noqa: S608


def replace_candidates(
    connection: sqlite3.Connection, shard_id: str, version: str, rows: pl.DataFrame | None, info: str | None = None
) -> None:
    """One transaction: the shard's candidate keys replaced by ``rows``' (``None``: the shard is gone),
    its new version recorded, and every shard whose rows' decisions this may change marked."""
    with transaction(connection):
        old = connection.execute("SELECT audio, text_key FROM candidates WHERE shard_id = ?", [shard_id]).fetchall()
        connection.execute("DELETE FROM candidates WHERE shard_id = ?", [shard_id])
        new = [] if rows is None else rows.filter(pl.col("reason").is_null())
        if rows is not None:
            connection.executemany(
                "INSERT INTO candidates VALUES (?, ?, ?, ?, ?)",
                new.select("shard_id", "_row", "utt_id", "audio_key", "text_key").iter_rows(),
            )
        audio = {a for a, _ in old} | (set() if rows is None else set(new["audio_key"].to_list()))
        text = {t for _, t in old} | (set() if rows is None else set(new["text_key"].to_list()))
        _keys_table(connection, "touched_audio", audio)
        _keys_table(connection, "touched_text", text)
        # CROSS JOIN keeps the touched keys as the outer loop (SQLite does not reorder it): a lookup in
        # the index per key, never a scan of every candidate.
        connection.execute(
            "INSERT OR IGNORE INTO touched_text "
            "SELECT c.text_key FROM touched_audio a CROSS JOIN candidates c ON c.audio = a.k"
        )
        connection.execute(
            "UPDATE shards SET marked = 1 WHERE shard_id IN ("
            " SELECT c.shard_id FROM touched_audio a CROSS JOIN candidates c ON c.audio = a.k"
            " UNION SELECT c.shard_id FROM touched_text t CROSS JOIN candidates c ON c.text_key = t.k)"
        )
        if rows is None:
            for table in ("shards", "kept_recordings", "eval_candidates", "correction_ids"):
                connection.execute(f"DELETE FROM {table} WHERE shard_id = ?", [shard_id])  # noqa: S608
        else:
            connection.execute(
                "INSERT INTO shards (shard_id, inputs_version, marked, flacs_pending, prepared_info) "
                "VALUES (?, ?, 1, 1, ?) ON CONFLICT (shard_id) DO UPDATE SET inputs_version = excluded.inputs_version, "
                "marked = 1, flacs_pending = 1, prepared_info = excluded.prepared_info",
                [shard_id, version, info],
            )
        set_state_value(connection, "combined_current", "0")


def duplicate_decisions(connection: sqlite3.Connection, shard_id: str, rows: pl.DataFrame) -> pl.DataFrame:
    """``_row``, ``reason`` and ``detail`` of the shard's candidates that are duplicates, from the index."""
    candidates = rows.filter(pl.col("reason").is_null()).select("_row", "utt_id", "audio_key", "text_key")
    connection.execute(
        "CREATE TEMP TABLE IF NOT EXISTS current_rows (row INTEGER PRIMARY KEY, audio INT, text_key INT)"
    )
    connection.execute("DELETE FROM current_rows")
    connection.executemany(
        "INSERT INTO current_rows VALUES (?, ?, ?)", candidates.select("_row", "audio_key", "text_key").iter_rows()
    )
    firsts = connection.execute(
        """
        SELECT c.row,
          (SELECT k.shard_id || char(31) || k.row || char(31) || k.utt_id FROM candidates k
            WHERE k.audio = c.audio ORDER BY k.shard_id, k.row LIMIT 1),
          (SELECT h.shard_id || char(31) || h.row || char(31) || h.utt_id FROM candidates h
            WHERE h.text_key = c.text_key AND NOT EXISTS (
              SELECT 1 FROM candidates a WHERE a.audio = h.audio
                AND (a.shard_id < h.shard_id OR (a.shard_id = h.shard_id AND a.row < h.row)))
            ORDER BY h.shard_id, h.row LIMIT 1)
        FROM current_rows c ORDER BY c.row
        """
    ).fetchall()
    decided = []
    for row, audio_first, text_first in firsts:
        for first, reason, detail in (
            (audio_first, "duplicate_audio", "same audio as "),
            (text_first, "duplicate_text_in_recording", "same text and duration as "),
        ):
            first_shard, first_row, first_utt = first.split("\x1f", 2)
            if (first_shard, int(first_row)) != (shard_id, row):
                decided.append((row, reason, f"{detail}{first_shard}/{first_utt}"))
                break
    return pl.DataFrame(decided, schema={"_row": pl.UInt32, "reason": pl.String, "detail": pl.String}, orient="row")


@dataclass(frozen=True)
class ShardOutputs:
    train: pl.DataFrame
    validation: pl.DataFrame
    removed: pl.DataFrame
    kept: pl.DataFrame
    """The kept rows with ``recording_key``, ``bucket``, ``eval_key`` and ``held_out`` (in validation)."""


def shard_outputs(
    connection: sqlite3.Connection, shard_id: str, rows: pl.DataFrame, *, validation_share: float, forced: str | None
) -> ShardOutputs:
    duplicates = duplicate_decisions(connection, shard_id, rows)
    decided = rows.join(duplicates, on="_row", how="left", suffix="_dup").with_columns(
        pl.coalesce("reason", "reason_dup").alias("reason"), pl.coalesce("detail", "detail_dup").alias("detail")
    )
    removed = (
        decided.filter(pl.col("reason").is_not_null())
        .select("shard_id", "utt_id", "reason", pl.col("detail").fill_null(""))
        .pipe(conform, REMOVED_SCHEMA)
    )
    threshold = int(validation_share * HASH_BUCKETS)
    held_out = (pl.col("bucket") < threshold) | (pl.col("recording_key") == pl.lit(forced, pl.String)).fill_null(False)
    kept = decided.filter(pl.col("reason").is_null()).with_columns(held_out.alias("held_out"))
    return ShardOutputs(
        train=conform(kept.filter(~pl.col("held_out")), MANIFEST_SCHEMA),
        validation=conform(kept.filter(pl.col("held_out")), MANIFEST_SCHEMA),
        removed=removed,
        kept=kept,
    )


def replace_kept_recordings(connection: sqlite3.Connection, shard_id: str, kept: pl.DataFrame) -> None:
    recordings = kept.select("recording_key", "bucket").unique().sort("recording_key")
    with transaction(connection):
        connection.execute("DELETE FROM kept_recordings WHERE shard_id = ?", [shard_id])
        connection.executemany(
            "INSERT INTO kept_recordings VALUES (?, ?, ?)",
            ((shard_id, key, bucket) for key, bucket in recordings.iter_rows()),
        )


def forced_validation(connection: sqlite3.Connection, validation_share: float) -> tuple[str | None, int]:
    """The recording forced into validation (None if the hash rule holds one out, or cannot apply)
    and the number of kept recordings when it had to be counted (else -1: not needed)."""
    threshold = int(validation_share * HASH_BUCKETS)
    if validation_share <= 0:
        return None, -1
    if connection.execute("SELECT 1 FROM kept_recordings WHERE bucket < ? LIMIT 1", [threshold]).fetchone():
        return None, -1
    # No recording falls under the share: a small corpus, where counting them is cheap.
    recordings = connection.execute("SELECT COUNT(DISTINCT recording_key) FROM kept_recordings").fetchone()[0]
    if recordings < MIN_RECORDINGS_FOR_HELD_OUT:
        return None, recordings
    first = connection.execute("SELECT recording_key FROM kept_recordings ORDER BY bucket, recording_key LIMIT 1")
    return first.fetchone()[0], recordings


def recordings_count(connection: sqlite3.Connection) -> int:
    return connection.execute("SELECT COUNT(DISTINCT recording_key) FROM kept_recordings").fetchone()[0]


def prepared_info(prepared: PreparedShard) -> str:
    return json.dumps({"input_rows": prepared.input_rows, "relabeled": prepared.relabeled}, sort_keys=True)


def shard_stats(outputs: ShardOutputs, info: str) -> dict:
    def by_language(frame: pl.DataFrame) -> dict[str, list]:
        grouped = frame.group_by("lang").agg(pl.len(), pl.col("duration").sum()).sort("lang")
        return {lang: [int(n), float(seconds)] for lang, n, seconds in grouped.iter_rows()}

    prepared = json.loads(info)
    return {
        "input_rows": prepared["input_rows"],
        "train": by_language(outputs.train),
        "validation": by_language(outputs.validation),
        "removed": dict(sorted(Counter(outputs.removed["reason"].to_list()).items())),
        "relabeled": prepared["relabeled"],
    }


def replace_eval_candidates(
    connection: sqlite3.Connection, shard_id: str, outputs: ShardOutputs, eval_per_language: int, forced: str | None
) -> None:
    """The shard's eval candidates: per language, its ``eval_per_language`` validation rows with the
    smallest eval hash (the corpus's eval subset is always among them)."""
    top = (
        outputs.kept.filter(pl.col("held_out"))
        .with_columns(UTTERANCE_KEY.alias("key"))
        .sort("lang", "eval_key", "key")
        .group_by("lang", maintain_order=True)
        .head(eval_per_language)
    )
    rows = [
        (shard_id, row["lang"], row["eval_key"], row["key"], json.dumps({c: row[c] for c in MANIFEST_COLUMNS}))
        for row in top.iter_rows(named=True)
    ]
    connection.execute("DELETE FROM eval_candidates WHERE shard_id = ?", [shard_id])
    connection.executemany("INSERT INTO eval_candidates VALUES (?, ?, ?, ?, ?)", rows)


def eval_subset(connection: sqlite3.Connection, eval_per_language: int) -> pl.DataFrame:
    languages = [row[0] for row in connection.execute("SELECT DISTINCT lang FROM eval_candidates ORDER BY lang")]
    rows = [
        json.loads(text)
        for language in languages
        for (text,) in connection.execute(
            "SELECT row FROM eval_candidates WHERE lang = ? ORDER BY eval_key, key LIMIT ?",
            [language, eval_per_language],
        )
    ]
    return pl.DataFrame(rows, schema=MANIFEST_SCHEMA, orient="row") if rows else pl.DataFrame(schema=MANIFEST_SCHEMA)


# --- totals for the summary, from the per-shard stats (no manifest read)


@dataclass(frozen=True)
class AsrManifestTotals:
    train_rows: int = 0
    validation_rows: int = 0
    eval_rows: int = 0
    input_rows: int = 0
    hours: dict[str, dict[str, list]] = field(default_factory=dict)
    """``split -> lang -> [utterances, hours]``."""
    removed_by_reason: dict[str, int] = field(default_factory=dict)
    relabeled: dict[str, int] = field(default_factory=dict)
    recordings: int = 0
    """Kept recordings, counted only when a split is empty (-1 otherwise: not needed, and a pass)."""
    validation_share: float = 0.0
    forced_validation: str | None = None
    recordings_in_both_splits: int = 0
    """Kept recordings whose shards' parts were written with different forced recordings (0 unless a
    part is stale; the split rule gives every other recording one split by construction)."""

    def hours_by_language_and_split(self) -> pl.DataFrame:
        rows = [
            {"split": split, "lang": lang, "utterances": n, "hours": h}
            for split, by_lang in self.hours.items()
            for lang, (n, h) in by_lang.items()
        ]
        schema = {"split": pl.String, "lang": pl.String, "utterances": pl.UInt32, "hours": pl.Float64}
        return pl.DataFrame(rows, schema=schema).sort("split", "lang")

    @property
    def empty_splits(self) -> dict[str, str]:
        if self.recordings == 0:
            why = "no utterance passed the filters"
        elif self.validation_share == 0:
            why = "validation_share is 0"
        elif self.recordings < MIN_RECORDINGS_FOR_HELD_OUT:
            why = f"{self.recordings} recording(s): validation and eval need at least {MIN_RECORDINGS_FOR_HELD_OUT}"
        else:
            why = "every recording fell in another split"
        counts = {"train": self.train_rows, "validation": self.validation_rows, "eval": self.eval_rows}
        return {split: why for split, n in counts.items() if n == 0}


def totals(connection: sqlite3.Connection, config: AsrManifestConfig, eval_rows: int, forced: str | None):
    hours: dict[str, dict[str, list]] = {"eval": {}, "train": {}, "validation": {}}
    removed: Counter[str] = Counter()
    relabeled: Counter[str] = Counter()
    input_rows = 0
    for (stats_text,) in connection.execute("SELECT stats FROM shards WHERE stats IS NOT NULL ORDER BY shard_id"):
        stats = json.loads(stats_text)
        input_rows += stats["input_rows"]
        removed.update(stats["removed"])
        relabeled.update(stats["relabeled"])
        for split in ("train", "validation"):
            for lang, (n, seconds) in stats[split].items():
                entry = hours[split].setdefault(lang, [0, 0.0])
                entry[0] += n
                entry[1] += seconds
    for entry in (e for by_lang in hours.values() for e in by_lang.values()):
        entry[1] /= 3600
    leaks = 0
    if forced is not None or connection.execute("SELECT 1 FROM shards WHERE forced_at_write IS NOT NULL").fetchone():
        leaks = connection.execute(
            "SELECT COUNT(DISTINCT k.recording_key) FROM kept_recordings k JOIN shards s USING (shard_id) "
            "WHERE (k.recording_key = s.forced_at_write OR k.recording_key = ?) "
            "AND s.forced_at_write IS NOT ?",
            [forced, forced],
        ).fetchone()[0]
    train_rows = sum(n for n, _ in hours["train"].values())
    validation_rows = sum(n for n, _ in hours["validation"].values())
    empty = 0 in (train_rows, validation_rows, eval_rows)
    return AsrManifestTotals(
        train_rows=train_rows,
        validation_rows=validation_rows,
        eval_rows=eval_rows,
        input_rows=input_rows,
        hours=hours,
        removed_by_reason={reason: int(removed.get(reason, 0)) for reason in REMOVAL_REASONS},
        relabeled=dict(sorted(relabeled.items())),
        # Counted (a pass over the kept recordings) only where it explains an empty split.
        recordings=recordings_count(connection) if empty else -1,
        validation_share=config.validation_share,
        forced_validation=forced,
        recordings_in_both_splits=leaks,
    )


def fingerprint(config: AsrManifestConfig, quality_column: str, audio_root: str, corrections_version: str) -> str:
    return json.dumps(
        {
            "format": STATE_FORMAT,
            "config": asdict(config),
            "quality_column": quality_column,
            "audio_root": audio_root,
            "corrections": corrections_version,
        },
        sort_keys=True,
    )


PART_TO_ROOT = "../../../.."
"""A part's ``audio_filepath`` is relative to its own directory (``asr/manifests/parts/<split>/``),
as NeMo and :class:`speechdata.asr.dataset.AsrManifestDataset` resolve it: a part (or a list of
parts) is a manifest by itself."""


def with_audio_root(frame: pl.DataFrame, audio_root: str) -> pl.DataFrame:
    """``frame`` with ``audio_filepath`` made from ``flac_path`` under ``audio_root``."""
    return frame.with_columns((pl.lit(audio_root.rstrip("/") + "/") + pl.col("flac_path")).alias("audio_filepath"))


def write_shard_parts(data_root: DataRoot, shard_id: str, outputs: ShardOutputs) -> None:
    for kind, frame in (("train", outputs.train), ("validation", outputs.validation)):
        frame = with_audio_root(frame, PART_TO_ROOT)
        data_root.write_parquet(layout.asr_manifest_part(kind, shard_id), frame.to_arrow())
        data_root.write_bytes(layout.asr_manifest_part(kind, shard_id, "jsonl"), nemo_jsonl_bytes(frame))
    data_root.write_parquet(layout.asr_manifest_part("removed", shard_id), outputs.removed.to_arrow())
    fault_point("asr-manifest-shard-parts")


def remove_shard_parts(data_root: DataRoot, shard_id: str) -> None:
    paths = [layout.asr_manifest_part(kind, shard_id) for kind in layout.ASR_MANIFEST_PART_KINDS]
    paths += [layout.asr_manifest_part(kind, shard_id, "jsonl") for kind in ("train", "validation")]
    paths.append(layout.asr_manifest_prepared(shard_id))
    for path in paths:
        if data_root.exists(path):
            data_root.fs.rm(data_root.path(path))


def arrow_schema(schema: dict) -> pa.Schema:
    return pl.DataFrame(schema=schema).to_arrow().schema
