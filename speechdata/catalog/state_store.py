"""The catalog refresh's state on an object-store data root: a snapshot and the deltas since it.

DuckDB cannot write to a bucket, so a refresh over an object-store root works on a local copy of the
state (``.catalog.duckdb.state`` beside the local catalog) and puts it back for the next worker.
The state grows with the corpus while a refresh told which shards changed touches only their rows,
so what goes up is what changed. Under :data:`STATE_FOLDER` the root holds

* ``log.json``: the state as the root publishes it, the name of a snapshot and the deltas to apply
  to it in order (``{"snapshot": "snapshot-<12 hex>.duckdb", "deltas": ["delta-<12 hex>.duckdb", ...]}``);
  written last and whole, it is the commit point: a part it does not name is not part of the state;
* ``snapshot-*.duckdb``: a whole state file, put up after a refresh that listed the whole root and
  once in :data:`DELTAS_PER_SNAPSHOT` refreshes (so a worker starting afresh applies at most that many deltas);
* ``delta-*.duckdb``: after a scoped refresh, the rows of the shards it looked at (``delta_scope``),
  table by table, and the few one-row tables whole. Applying it deletes those shards' rows and
  inserts the delta's.

Beside the local copy, ``<state>.uploaded`` (JSON) records the log this copy matches and the shards
whose rows may differ from it (``pending``: written before a refresh changes the local state, cleared
once the refresh's part and log are up). So a refresh killed anywhere (mid-transaction, mid-upload,
between the part and the log, between the log and the record) leaves either the root's log as it
was, with the local copy ahead of it by at most the pending shards, which the next delta carries, or
the log a refresh ahead, whose delta re-applied to the local copy changes nothing (delete and insert
of the same rows). A local copy the root's log does not extend (another worker's snapshot replaced
our log) is replaced by the root's; when it may hold changes the root's lacks (pending shards, a
left-over write-ahead log, no record of what it is) the refresh then lists the whole root
(:meth:`ObjectStoreState.fetch` returns False). Refreshes of one root are meant to run one at a time
(the refresh lock covers one machine): two at the same moment from two machines may lose one's delta
until a full listing. Parts no log names any more are removed when a snapshot goes up.

A root whose state predates the log (a whole ``.catalog.duckdb.state``, :data:`LEGACY_STATE_FILE`)
is read as a starting point, listed whole once and removed after the first snapshot.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import duckdb

from speechdata.catalog.incremental import shard_of_path_sql
from speechdata.catalog.view_definitions import MANIFEST_GLOB, REJECTS_GLOB
from speechdata.io.duckdb_object_store import upload_database
from speechdata.io.storage import DataRoot

STATE_FOLDER = ".catalog.duckdb.state.d"
"""The state's parts and log, relative to an object-store data root."""
STATE_LOG = f"{STATE_FOLDER}/log.json"
LEGACY_STATE_FILE = ".catalog.duckdb.state"
"""Where a root kept the whole state before the log (read once as a starting point)."""
DELTAS_PER_SNAPSHOT = 100
"""A snapshot goes up (the state whole) once the log names this many deltas."""
RECORD_SUFFIX = ".uploaded"
DELTA_BLOCK_SIZE = 16384
"""DuckDB's smallest block: a delta of one shard is about 0.3 MB instead of about 5 MB at the default."""

_SCOPE_TABLE = "delta_scope"
_SHARD_OF_PATH = {
    "catalog_manifest_files": MANIFEST_GLOB,
    "catalog_manifest_groups": MANIFEST_GLOB,
    "catalog_rejects_files": REJECTS_GLOB,
    "catalog_rejected_ids": REJECTS_GLOB,
}
"""Per-file tables: the shard of a row is its file's (the path), whatever the file holds."""


def shard_expression(table: str, columns: str) -> str | None:
    """SQL for the shard a row of the state ``table`` belongs to; None for a table kept whole (one row)."""
    if table in _SHARD_OF_PATH:
        return shard_of_path_sql(_SHARD_OF_PATH[table])
    if any(column.split()[0] == "shard" for column in columns.split(",")):
        return "shard"
    return None


@dataclass
class ObjectStoreState:
    """The local copy at ``state_path`` of ``root``'s state, and how it stands against the root's log."""

    root: DataRoot
    state_path: str
    tables: Mapping[str, str]
    """Every state table (name -> column definitions)."""
    deltas_per_snapshot: int | None = None
    """Default :data:`DELTAS_PER_SNAPSHOT`."""
    log: dict | None = None
    pending: list[str] | None = field(default_factory=list)
    """Shards whose local rows may differ from the root's log; None: any may (a snapshot must go up)."""

    @property
    def record_path(self) -> str:
        return self.state_path + RECORD_SUFFIX

    def fetch(self) -> bool:
        """Bring the local copy to the root's log; returns whether a refresh scoped to the changed
        shards may start from it (False: list the root whole). A few small reads when it is current."""
        self.log = self._read_log()
        if self.log is None:
            self.pending = None
            if not os.path.exists(self.state_path) and self.root.exists(LEGACY_STATE_FILE):
                self.root.fs.get(self.root.path(LEGACY_STATE_FILE), self.state_path)
            return False  # nothing published as a log: whatever is here came from elsewhere
        record = self._read_record()
        local = os.path.exists(self.state_path)
        trusted = local and record is not None and not os.path.exists(self.state_path + ".wal")
        if trusted and _extends(self.log, record["log"]):
            missing = self.log["deltas"][len(record["log"]["deltas"]) :]
            try:
                self._apply(missing)
            except FileNotFoundError:
                return self._start_over(trusted=False)
            self.pending = record["pending"]
            if missing:
                self._write_record()
            return True
        # Another worker's log replaced ours: its state is a valid start unless ours held changes it
        # may lack (pending shards, a left-over write-ahead log, no record of what this copy is).
        settled = trusted and record["pending"] == []
        return self._start_over(trusted=settled or not local)

    def begin(self, shards: Collection[str] | None) -> None:
        """Record, before the local copy changes, the shards a refresh may change (None: any)."""
        if self.pending is not None and shards is not None:
            self.pending = sorted(set(self.pending) | set(shards))
        else:
            self.pending = None
        self._write_record()

    def publish(self, scope: Collection[str] | None) -> None:
        """Put the refreshed local copy (closed) up: a delta of the shards the refresh listed
        (``scope``) and the pending ones, or a snapshot; then the log."""
        old = self.log
        limit = self.deltas_per_snapshot or DELTAS_PER_SNAPSHOT
        snapshot = scope is None or self.pending is None or old is None or len(old["deltas"]) + 1 >= limit
        if snapshot:
            name = f"snapshot-{uuid.uuid4().hex[:12]}.duckdb"
            upload_database(self.root, self.state_path, f"{STATE_FOLDER}/{name}")
            new = {"snapshot": name, "deltas": []}
        else:
            name = f"delta-{uuid.uuid4().hex[:12]}.duckdb"
            self._upload_delta(name, sorted(set(self.pending) | set(scope)))
            new = {"snapshot": old["snapshot"], "deltas": [*old["deltas"], name]}
        with self.root.open_atomic(STATE_LOG) as file:
            file.write(json.dumps(new, sort_keys=True).encode("utf-8"))
        self.log, self.pending = new, []
        self._write_record()
        if snapshot:
            self._remove_unnamed_parts()

    # --- the root's side

    def _read_log(self) -> dict | None:
        try:
            log = json.loads(self.root.fs.cat_file(self.root.path(STATE_LOG)))
        except FileNotFoundError:
            return None
        except ValueError as error:
            raise ValueError(f"{self.root.uri(STATE_LOG)} is not a catalog state log ({error})") from error
        if not _is_log(log):
            raise ValueError(f"{self.root.uri(STATE_LOG)} is not a catalog state log (snapshot and deltas)")
        return log

    def _get_part(self, name: str, local_path: str) -> None:
        if not _is_part_name(name):
            raise ValueError(f"{self.root.uri(STATE_LOG)} names {name!r}, not a part of the catalog state")
        _remove(local_path)
        self.root.fs.get(self.root.path(f"{STATE_FOLDER}/{name}"), local_path)

    def _upload_delta(self, name: str, shards: list[str]) -> None:
        delta_path = f"{self.state_path}.{name}"
        _remove(delta_path)
        try:
            with duckdb.connect() as connection:
                # Small blocks: a delta holds a few rows per table, and DuckDB gives each table a block.
                connection.execute(f"ATTACH {_sql_literal(delta_path)} AS delta (BLOCK_SIZE {DELTA_BLOCK_SIZE})")
                connection.execute(f"ATTACH {_sql_literal(self.state_path)} AS state (READ_ONLY)")
                connection.execute(f"CREATE TABLE delta.{_SCOPE_TABLE} (shard VARCHAR)")
                connection.execute(f"INSERT INTO delta.{_SCOPE_TABLE} SELECT unnest(?::VARCHAR[])", [shards])
                existing = {
                    row[0]
                    for row in connection.execute(
                        "SELECT table_name FROM duckdb_tables() WHERE database_name = 'state'"
                    ).fetchall()
                }
                for table, columns in self.tables.items():
                    if table not in existing:
                        continue
                    shard = shard_expression(table, columns)
                    where = f" WHERE {shard} IN (SELECT shard FROM delta.{_SCOPE_TABLE})" if shard else ""
                    connection.execute(f"CREATE TABLE delta.{table} AS SELECT * FROM state.{table}{where}")
                connection.execute("DETACH state")
                connection.execute("DETACH delta")
            upload_database(self.root, delta_path, f"{STATE_FOLDER}/{name}")
        finally:
            _remove(delta_path)

    def _remove_unnamed_parts(self) -> None:
        named = {self.log["snapshot"], *self.log["deltas"]}
        with contextlib.suppress(FileNotFoundError):
            for path in self.root.fs.ls(self.root.path(STATE_FOLDER), detail=False):
                name = posixpath.basename(path.rstrip("/"))
                if _is_part_name(name) and name not in named:
                    with contextlib.suppress(FileNotFoundError):
                        self.root.fs.rm(path)
        with contextlib.suppress(FileNotFoundError):
            if self.root.exists(LEGACY_STATE_FILE):
                self.root.fs.rm(self.root.path(LEGACY_STATE_FILE))

    # --- the local side

    def _start_over(self, *, trusted: bool) -> bool:
        """The local copy replaced by the root's snapshot and deltas; returns ``trusted`` (False when
        a local copy was dropped: what it held beyond the root's log is found by a full listing)."""
        _remove(self.record_path)
        _remove(self.state_path)
        try:
            self._get_part(self.log["snapshot"], self.state_path)
            self._apply(self.log["deltas"])
        except FileNotFoundError:
            _remove(self.state_path)  # a part gone: the refresh starts from nothing and lists the root
            self.pending = None
            return False
        self.pending = []
        self._write_record()
        return trusted

    def _apply(self, deltas: list[str]) -> None:
        if not deltas:
            return
        with duckdb.connect(self.state_path) as state:
            for table, columns in self.tables.items():
                state.execute(f"CREATE TABLE IF NOT EXISTS {table} ({columns})")
            for name in deltas:
                delta_path = f"{self.state_path}.{name}"
                self._get_part(name, delta_path)
                try:
                    _apply_delta(state, delta_path, self.tables)
                finally:
                    _remove(delta_path)

    def _read_record(self) -> dict | None:
        try:
            with open(self.record_path, encoding="utf-8") as file:
                record = json.load(file)
        except (FileNotFoundError, ValueError):
            return None
        if not isinstance(record, dict) or not _is_log(record.get("log")):
            return None  # an older kind of record (a fingerprint): the copy is not trusted
        pending = record.get("pending")
        if pending is not None and not (isinstance(pending, list) and all(isinstance(s, str) for s in pending)):
            return None
        return record

    def _write_record(self) -> None:
        written = f"{self.record_path}.{uuid.uuid4().hex[:12]}.tmp"
        with open(written, "w", encoding="utf-8") as file:
            json.dump({"log": self.log, "pending": self.pending}, file, sort_keys=True)
        os.replace(written, self.record_path)


def _apply_delta(state: duckdb.DuckDBPyConnection, delta_path: str, tables: Mapping[str, str]) -> None:
    state.execute(f"ATTACH {_sql_literal(delta_path)} AS delta (READ_ONLY)")
    try:
        in_delta = {
            row[0]
            for row in state.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'delta'").fetchall()
        }
        state.begin()
        try:
            for table, columns in tables.items():
                if table not in in_delta:
                    continue
                shard = shard_expression(table, columns)
                where = f" WHERE {shard} IN (SELECT shard FROM delta.{_SCOPE_TABLE})" if shard else ""
                state.execute(f"DELETE FROM main.{table}{where}")
                state.execute(f"INSERT INTO main.{table} SELECT * FROM delta.{table}")
            state.commit()
        except BaseException:
            state.rollback()
            raise
    finally:
        state.execute("DETACH delta")


def _extends(log: dict, earlier: dict) -> bool:
    """Whether ``log`` is ``earlier`` with (possibly no) deltas appended."""
    count = len(earlier["deltas"])
    return log["snapshot"] == earlier["snapshot"] and log["deltas"][:count] == earlier["deltas"]


def _is_log(log) -> bool:
    return (
        isinstance(log, dict)
        and _is_part_name(log.get("snapshot"))
        and isinstance(log.get("deltas"), list)
        and all(_is_part_name(name) for name in log["deltas"])
    )


def _is_part_name(name) -> bool:
    """``snapshot-<12 hex>.duckdb`` or ``delta-<12 hex>.duckdb``: nothing a log names leaves the folder."""
    if not isinstance(name, str) or not name.endswith(".duckdb"):
        return False
    kind, _, tag = name[: -len(".duckdb")].partition("-")
    return kind in ("snapshot", "delta") and len(tag) == 12 and all(c in "0123456789abcdef" for c in tag)


def _remove(path: str) -> None:
    for leftover in (path, path + ".wal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(leftover)


def _sql_literal(text: str) -> str:
    """A SQL string literal for a local path this module named (ATTACH takes no parameters)."""
    return "'" + text.replace("'", "''") + "'"
