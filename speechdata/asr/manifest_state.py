"""The ASR manifests' cross-shard index: a SQLite file of every candidate row's keys, the kept
recordings and each shard's eval candidates, so deduplication and the split are lookups of the
changed shard's keys, never a pass over the corpus (:mod:`speechdata.asr.incremental`); and the
build's totals, summed from the per-shard stats it keeps.
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
from dataclasses import dataclass, field

import polars as pl

from speechdata.asr.filters import REMOVAL_REASONS
from speechdata.asr.manifest import MANIFEST_COLUMNS, AsrManifestConfig, empty_split_reason
from speechdata.asr.manifest_rows import MANIFEST_SCHEMA, ShardOutputs
from speechdata.asr.split import HASH_BUCKETS, MIN_RECORDINGS_FOR_HELD_OUT, UTTERANCE_KEY
from speechdata.io import layout
from speechdata.io.storage import DataRoot

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
        # Only rows after this shard's in key order can change: a row's decision names the first holder
        # of its keys in (shard, row) order, so a row before every row of this shard has the same first
        # holder whatever this shard holds (and, being first of its audio or not, the same standing for
        # its text). Shards landing in key order thus neither scan nor mark an earlier one.
        # CROSS JOIN keeps the touched keys as the outer loop (SQLite does not reorder it): an index
        # range per key, never a scan of every candidate.
        connection.execute(
            "INSERT OR IGNORE INTO touched_text "
            "SELECT c.text_key FROM touched_audio a CROSS JOIN candidates c ON c.audio = a.k WHERE c.shard_id > ?",
            [shard_id],
        )
        connection.execute(
            "UPDATE shards SET marked = 1 WHERE shard_id IN ("
            " SELECT c.shard_id FROM touched_audio a CROSS JOIN candidates c ON c.audio = a.k WHERE c.shard_id > ?1"
            " UNION SELECT c.shard_id FROM touched_text t CROSS JOIN candidates c ON c.text_key = t.k"
            " WHERE c.shard_id > ?1)",
            [shard_id],
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
        why = empty_split_reason(self.recordings, self.validation_share)
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
