"""The corpus-wide near-duplicate index under ``index/near_duplicates/`` on the data root.

``shards.parquet`` lists the indexed shards in the order they were indexed (``position``), each
with the version of its entries file; it is the commit point: a shard is in the index exactly when
it is listed there. ``entries/<shard>-<version>.parquet`` holds one row per utterance of a shard:
its exact audio hash, audio fingerprint, transcript MinHash and representative. The version is a
digest of the file's content, so re-indexing a shard with the same audio writes the same file
under the same name, and re-indexing changed audio writes a new file that the order file names
only once it is complete (the old one is removed after that).

Readers and writers hold :func:`corpus_index_lock`: two shards indexed at once are indexed one
after the other, so the second sees the first's utterances and cannot keep a copy of them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import posixpath
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speechdata.io import layout
from speechdata.io.parquet_integrity import WRITE_OPTIONS
from speechdata.io.shard_lock import LockHolder, ShardLocked, data_root_lock
from speechdata.io.storage import DataRoot
from speechdata.quality.fingerprint_audio import AudioFingerprint
from speechdata.quality.near_dup_matching import Decision, UtteranceSignals

INDEX_LOCK_KEY = "near-duplicates-index"
"""The lock's folder under ``_locks/``: spelled like a shard id (so :func:`shard_lock` takes it);
no asset writes a product named :data:`INDEX_LOCK_PRODUCT`, so no shard's own lock can clash."""
INDEX_LOCK_PRODUCT = "corpus_index"
DEFAULT_LOCK_TIMEOUT_S = 1_800.0
LOCK_POLL_S = 0.5

ORDER_SCHEMA = pa.schema(
    [
        pa.field("position", pa.int64(), nullable=False),
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("entries_version", pa.string(), nullable=False),
        pa.field("utterances", pa.int64(), nullable=False),
    ]
)

ENTRIES_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("exact_hash", pa.string()),
        pa.field("sub_fingerprints", pa.binary(), nullable=False),
        pa.field("active_frames", pa.binary(), nullable=False),
        pa.field("transcript_signature", pa.binary()),
        pa.field("transcript_words", pa.int32(), nullable=False),
        pa.field("representative_shard", pa.string(), nullable=False),
        pa.field("representative_utt", pa.string(), nullable=False),
    ]
)
"""``sub_fingerprints``: little-endian uint32 per frame; ``active_frames``: one bit per frame
(numpy ``packbits``); ``transcript_signature``: little-endian uint64 MinHash values, null for an
empty transcript."""


@dataclass(frozen=True)
class IndexedShard:
    position: int
    shard_id: str
    entries_version: str
    utterances: int


class CorpusIndexBusy(RuntimeError):
    """The index stayed locked by another run for longer than the caller would wait."""


@contextlib.contextmanager
def corpus_index_lock(
    data_root: DataRoot,
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> Iterator[LockHolder | None]:
    """Hold the corpus index's lock for the block, waiting up to ``timeout_s`` for another holder.

    A holder that died is taken over (:func:`speechdata.io.shard_lock.data_root_lock`: a lock file on
    a local root, a conditionally created object on S3). A store without exclusive create (GCS,
    Azure) runs the block unlocked (yields None): the deployment must run one ``near_duplicates``
    step at a time there (docs/near-duplicates.md).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        stack = contextlib.ExitStack()
        try:
            holder = stack.enter_context(
                data_root_lock(
                    data_root, INDEX_LOCK_KEY, INDEX_LOCK_PRODUCT, run_id=run_id, holder_finished=holder_finished
                )
            )
            break
        except ShardLocked as locked:
            stack.close()
            if time.monotonic() >= deadline:
                raise CorpusIndexBusy(
                    f"the near-duplicate index ({layout.NEAR_DUPLICATES_INDEX}) stayed locked for {timeout_s:.0f} s "
                    f"by {locked.holder.describe()} (lock {locked.lock_path})"
                ) from locked
            time.sleep(LOCK_POLL_S)
    with stack:
        yield holder


def read_order(data_root: DataRoot) -> list[IndexedShard]:
    """The indexed shards, by position; empty before the first shard is indexed."""
    if not data_root.exists(layout.near_duplicates_index_order()):
        return []
    table = data_root.read_parquet(layout.near_duplicates_index_order())
    shards = [IndexedShard(**row) for row in table.to_pylist()]
    return sorted(shards, key=lambda shard: shard.position)


def shards_before(order: list[IndexedShard], shard_id: str) -> list[IndexedShard]:
    """The shards indexed before ``shard_id`` (every indexed shard when it is not indexed yet)."""
    mine = next((shard for shard in order if shard.shard_id == shard_id), None)
    return [shard for shard in order if mine is None or shard.position < mine.position]


IndexEntry = tuple[UtteranceSignals, tuple[str, str]]
"""An indexed utterance and its representative (shard, utt_id)."""


class ParsedEntries:
    """The entries files this process has parsed, for the data root it indexed last.

    A step checks its shards one after another, each against every shard indexed before it: without
    this, each shard of a run re-read the whole index. An entries file's name carries the digest of
    its content, so a parsed file is never stale; a shard's other versions are dropped when one is
    read, and everything of another data root when that root is read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._root: str | None = None
        self._by_shard: dict[str, tuple[str, list[IndexEntry]]] = {}
        self.files_parsed = 0

    def read(self, data_root: DataRoot, shards: list[IndexedShard]) -> list[IndexEntry]:
        entries: list[IndexEntry] = []
        with self._lock:
            if self._root != data_root.url:
                self._root, self._by_shard = data_root.url, {}
            for shard in shards:
                cached = self._by_shard.get(shard.shard_id)
                if cached is None or cached[0] != shard.entries_version:
                    path = layout.near_duplicates_index_entries(shard.shard_id, shard.entries_version)
                    cached = (shard.entries_version, _parse_entries(shard.shard_id, data_root.read_parquet(path)))
                    self._by_shard[shard.shard_id] = cached
                    self.files_parsed += 1
                entries.extend(cached[1])
        return entries


PARSED_ENTRIES = ParsedEntries()


def _parse_entries(shard_id: str, table: pa.Table) -> list[IndexEntry]:
    entries = []
    for row in table.to_pylist():
        signature = row["transcript_signature"]
        signals = UtteranceSignals(
            shard_id=shard_id,
            utt_id=row["utt_id"],
            exact_hash=row["exact_hash"],
            fingerprint=AudioFingerprint.from_bytes(row["sub_fingerprints"], row["active_frames"]),
            transcript_signature=None if signature is None else np.frombuffer(signature, "<u8").astype(np.uint64),
            transcript_words=row["transcript_words"],
        )
        entries.append((signals, (row["representative_shard"], row["representative_utt"])))
    return entries


def read_entries(data_root: DataRoot, shards: list[IndexedShard]) -> list[IndexEntry]:
    """Every utterance of ``shards``, in index order, with its representative: each entries file
    read once per process (:class:`ParsedEntries`)."""
    return PARSED_ENTRIES.read(data_root, shards)


def entries_table(signals: list[UtteranceSignals], decisions: list[Decision]) -> pa.Table:
    rows = []
    for utterance, decision in zip(signals, decisions, strict=True):
        sub_fingerprints, active = utterance.fingerprint.to_bytes()
        signature = utterance.transcript_signature
        rows.append(
            {
                "utt_id": utterance.utt_id,
                "exact_hash": utterance.exact_hash,
                "sub_fingerprints": sub_fingerprints,
                "active_frames": active,
                "transcript_signature": None if signature is None else signature.astype("<u8").tobytes(),
                "transcript_words": utterance.transcript_words,
                "representative_shard": decision.representative_shard,
                "representative_utt": decision.representative_utt,
            }
        )
    return pa.Table.from_pylist(rows, schema=ENTRIES_SCHEMA)


ENTRIES_VERSION_CHARS = 16


def commit_shard(data_root: DataRoot, order: list[IndexedShard], shard_id: str, entries: pa.Table) -> IndexedShard:
    """Write ``shard_id``'s entries, then the order naming them (its old position kept, or the next
    one for a shard indexed for the first time), then remove the entries file it replaced. Call
    with the lock held and ``order`` read under it."""
    buffer = io.BytesIO()
    pq.write_table(entries, buffer, compression="zstd", **WRITE_OPTIONS)
    content = buffer.getvalue()
    version = hashlib.sha256(content).hexdigest()[:ENTRIES_VERSION_CHARS]
    data_root.write_bytes(layout.near_duplicates_index_entries(shard_id, version), content)
    previous = next((shard for shard in order if shard.shard_id == shard_id), None)
    position = previous.position if previous else max((shard.position for shard in order), default=-1) + 1
    indexed = IndexedShard(position, shard_id, version, entries.num_rows)
    updated = sorted([shard for shard in order if shard.shard_id != shard_id] + [indexed], key=lambda s: s.position)
    data_root.write_parquet(
        layout.near_duplicates_index_order(),
        pa.Table.from_pylist([vars(shard) for shard in updated], schema=ORDER_SCHEMA),
    )
    remove_unlisted_entries(data_root, shard_id, version)
    return indexed


def remove_unlisted_entries(data_root: DataRoot, shard_id: str, current_version: str) -> int:
    """Delete ``shard_id``'s entries files other than ``current_version`` (replaced ones, or one a
    killed run wrote before committing the order); return how many."""
    folder = data_root.path(layout.near_duplicates_index_entries_dir())
    if not data_root.fs.exists(folder):
        return 0
    keep = posixpath.basename(layout.near_duplicates_index_entries(shard_id, current_version))
    removed = 0
    for path in data_root.fs.ls(folder, detail=False):
        name = posixpath.basename(path)
        stem = name.removesuffix(".parquet")
        owner, _, version = stem.rpartition("-")
        if owner == shard_id and len(version) == ENTRIES_VERSION_CHARS and name != keep:
            with contextlib.suppress(FileNotFoundError):
                data_root.fs.rm(path)
                removed += 1
    return removed
