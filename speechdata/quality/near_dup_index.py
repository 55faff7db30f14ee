"""The corpus-wide near-duplicate index under ``index/near_duplicates/`` on the data root.

Layout (docs/near-duplicates.md, docs/storage-layout.md)::

    shards.parquet                        position, shard_id, state, entries_version, utterances,
                                          segment, reservation: the order and the commit point
    committed/<shard>.json                one shard's commit record (checksummed): rebuilds shards.parquet
    entries/<shard>-<version>.parquet     one row per utterance (signals + representative), 64 rows a
                                          row group; version = digest of the content
    segments/L<level>-<digest>.seg        postings key -> (owner, frame), sorted, blocked, checksummed
                                          (:mod:`.near_dup_postings`)

The order rule. A shard *reserves* a position in a short critical section (the index lock, held for
milliseconds: read ``shards.parquet``, append a ``reserved`` row, write it) and holds the lock of
its position (``_locks/near-duplicates-index/position-<n>.lock``) until it commits. It then waits
only for the shards reserved before it (:func:`wait_for_earlier`): each either commits, or is found
dead (its position lock is free) and its reservation is dropped, so it re-reserves after this one
when it runs again. The shard is then decided against exactly the shards committed before its
position (:class:`IndexReader`: the postings of its own keys, then the entries of the utterances
they name), and committed (:func:`commit_shard_entries`: entries file, level-0 segment, then the row
under the lock). A committed shard re-run keeps its position, so its decisions and the index are
byte-identical. No lock is held while a shard is fingerprinted or matched; the index lock is held
only for a reservation, a commit or a compaction's switch.

Cost per new shard: the shard's keys looked up block by block in each live segment (segments are
merged in tiers of :data:`FANOUT`, so there are few), plus the entries row groups of the utterances
those keys name. Nothing is cached between shards.

Repair (:func:`repair_index`, run by the stage whenever it finds damage): a ``shards.parquet`` that
cannot be read is rebuilt from the commit records; a segment that is damaged or missing is rebuilt
from the entries files of the shards it held (a shard whose entries file is also unreadable is
dropped from the index and re-indexed at the end by its next run); an entries file that cannot be
read is reported by name.

API for the whole-corpus batch pass (kept stable): :func:`read_order`, :func:`read_state`,
:class:`IndexReader` (a :class:`~.near_dup_matching.CandidateSource`; ``prefetch``/``settle``),
:func:`reserve_position`, :func:`wait_for_earlier`, :func:`position_lock` and
:func:`drop_reservation` (also under their earlier private names), :func:`commit_shard_entries`,
:func:`write_index` (a whole ordered corpus at once), :func:`entries_table`,
:func:`read_shard_entries`, :func:`repair_index`, :func:`compact_index`; keys and segments in
:mod:`.near_dup_postings` (:func:`~.near_dup_postings.index_keys`); decisions in
:func:`.near_dup_matching.decide_shard`.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import posixpath
import secrets
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from speechdata.io import layout
from speechdata.io.parquet_integrity import WRITE_OPTIONS, UnreadableIntermediate
from speechdata.io.shard_lock import LockHolder, ShardLocked, data_root_lock
from speechdata.io.storage import DataRoot
from speechdata.quality.fingerprint_audio import AudioFingerprint
from speechdata.quality.fingerprint_envelope import SHAPE_SEGMENTS, ShiftSignature
from speechdata.quality.near_dup_filter import (
    DamagedFilter,
    FilterBuilder,
    filter_bytes,
    filter_name,
    keys_maybe_in,
    verify_filter,
)
from speechdata.quality.near_dup_matching import Decision, IndexEntry, UtteranceSignals
from speechdata.quality.near_dup_postings import (
    BLOCK_RECORDS,
    POSTING_DTYPE,
    DamagedSegment,
    SegmentShard,
    SegmentWriter,
    index_keys,
    lookup_segment,
    merge_segments,
    position_of,
    rank_of,
    read_blocks,
    read_segment_header,
    segment_bytes,
    segment_name,
    verify_segment,
)

INDEX_LOCK_KEY = "near-duplicates-index"
"""The lock's folder under ``_locks/``: spelled like a shard id (so :func:`shard_lock` takes it);
no asset writes a product named :data:`INDEX_LOCK_PRODUCT`, so no shard's own lock can clash."""
INDEX_LOCK_PRODUCT = "corpus_index"
DEFAULT_LOCK_TIMEOUT_S = 1_800.0
LOCK_POLL_S = 0.5
WAIT_POLL_S = 0.1
LIVENESS_CHECK_S = 2.0
"""How often a waiting shard tries the position locks of the shards it waits for (a lock it can take
is a run that is gone): an S3 request per shard waited for."""
"""How often a shard waiting for the shards reserved before it reads the order (a small file): each
of a queue of shards landing together waits at most this long past the one before it commits."""
ENTRIES_ROW_GROUP = 64
"""Entries rows per row group: fetching a candidate reads its group, not its shard."""
FANOUT = 8
"""Segments of one level merged into one of the next level."""
MERGE_CHUNK_POSTINGS = 2_000_000
"""A merge reads and sorts its inputs this many postings at a time (about 60 MB): segments grow
without a size cap while a merge's memory stays bounded."""
RESERVED, COMMITTED = "reserved", "committed"

ORDER_SCHEMA = pa.schema(
    [
        pa.field("position", pa.int64(), nullable=False),
        pa.field("shard_id", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("entries_version", pa.string()),
        pa.field("utterances", pa.int64(), nullable=False),
        pa.field("segment", pa.string()),
        pa.field("reservation", pa.string()),
    ]
)
"""``state``: ``reserved`` (position taken, not committed: ``reservation`` is the run's token) or
``committed`` (``entries_version`` names its entries file, ``segment`` the segment holding its postings)."""

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
        pa.field("speaker_embedding", pa.binary()),
        pa.field("envelope", pa.binary()),
        pa.field("spectral_shape", pa.binary()),
        pa.field("speech_span_s", pa.float64()),
    ]
)
"""``sub_fingerprints``: little-endian uint32 per frame; ``active_frames``: one bit per frame
(numpy ``packbits``); ``transcript_signature``: little-endian uint64 MinHash values, null for an
empty transcript; ``speaker_embedding``: 256 little-endian float16 (512 bytes; half precision moves
a cosine by less than 0.001), null when the utterance has none. ``envelope``: 64 little-endian float16 (the
loudness envelope, :mod:`.fingerprint_envelope`), null when flat or short, with ``spectral_shape``
(12 x 52 int8) and the speech span in seconds.
Entries files written before these columns existed read as null: their utterances count as the
same speaker and have no envelope."""


@dataclass(frozen=True)
class IndexedShard:
    """A row of ``shards.parquet``."""

    position: int
    shard_id: str
    entries_version: str | None
    utterances: int
    state: str = COMMITTED
    segment: str | None = None
    reservation: str | None = None


@dataclass(frozen=True)
class Reservation:
    """A shard's place in the index order, held (with its position lock) until it commits."""

    shard_id: str
    position: int
    token: str
    recommit: bool
    """The shard was committed before (a re-run): it keeps its position."""


class CorpusIndexBusy(RuntimeError):
    """The index stayed locked by another run for longer than the caller would wait."""


class ReservationLost(RuntimeError):
    """The shard's reservation was dropped (taken for dead, or lost with a rebuilt order): reserve again."""


class IndexDamaged(RuntimeError):
    """A part of the index failed its checksum or is missing: :func:`repair_index` rebuilds it.
    ``entries_of``: the shard whose entries file could not be read, when that was the part."""

    def __init__(self, message: str, entries_of: str | None = None):
        super().__init__(message)
        self.entries_of = entries_of


# --- the index lock and the order -------------------------------------------------------------


@contextlib.contextmanager
def corpus_index_lock(
    data_root: DataRoot,
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> Iterator[LockHolder | None]:
    """Hold the corpus index's lock for the block, waiting up to ``timeout_s`` for another holder.

    Held only for a reservation, a commit or a compaction's switch (milliseconds). A holder that
    died is taken over (:func:`speechdata.io.shard_lock.data_root_lock`: a lock file on a local
    root, a conditionally created object on S3). A store without exclusive create (GCS, Azure) runs
    the block unlocked (yields None): the deployment must run one ``near_duplicates`` step at a time
    there (docs/near-duplicates.md).
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


def _position_lock(data_root: DataRoot, position: int, run_id=None, holder_finished=None):
    return data_root_lock(
        data_root, INDEX_LOCK_KEY, f"position-{position:012d}", run_id=run_id, holder_finished=holder_finished
    )


def read_state(data_root: DataRoot) -> list[IndexedShard]:
    """Every row of ``shards.parquet`` (reserved and committed), by position; empty before the first
    shard. Raises :class:`IndexDamaged` when the file cannot be read."""
    relative = layout.near_duplicates_index_order()
    if not data_root.exists(relative):
        return []
    try:
        table = data_root.read_parquet(relative)
    except UnreadableIntermediate as exc:
        raise IndexDamaged(str(exc)) from exc
    rows = table.to_pylist()
    shards = [
        IndexedShard(
            position=row["position"],
            shard_id=row["shard_id"],
            entries_version=row["entries_version"],
            utterances=row["utterances"],
            state=row.get("state") or COMMITTED,
            segment=row.get("segment"),
            reservation=row.get("reservation"),
        )
        for row in rows
    ]
    return sorted(shards, key=lambda shard: shard.position)


def read_order(data_root: DataRoot) -> list[IndexedShard]:
    """The committed shards, by position; empty before the first shard is indexed."""
    return [shard for shard in read_state(data_root) if shard.state == COMMITTED]


def _write_state(data_root: DataRoot, shards: Sequence[IndexedShard]) -> None:
    rows = [
        {field.name: getattr(shard, field.name) for field in ORDER_SCHEMA}
        for shard in sorted(shards, key=lambda s: s.position)
    ]
    data_root.write_parquet(layout.near_duplicates_index_order(), pa.Table.from_pylist(rows, schema=ORDER_SCHEMA))


# --- reserving, waiting, committing ------------------------------------------------------------


@contextlib.contextmanager
def reserve_position(
    data_root: DataRoot,
    shard_id: str,
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> Iterator[Reservation]:
    """Take ``shard_id``'s place in the index order for the block: its committed position when it
    was indexed before, its own earlier reservation when a run of it died, else the next position.
    The position's lock is held for the block (it tells waiting shards this run is alive)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with corpus_index_lock(
            data_root, timeout_s=max(deadline - time.monotonic(), 0.0), run_id=run_id, holder_finished=holder_finished
        ):
            state = read_state(data_root)
            mine = next((shard for shard in state if shard.shard_id == shard_id), None)
            position = mine.position if mine else max((shard.position for shard in state), default=-1) + 1
            stack = contextlib.ExitStack()
            try:
                stack.enter_context(_position_lock(data_root, position, run_id, holder_finished))
            except ShardLocked as locked:
                stack.close()
                if time.monotonic() >= deadline:
                    raise CorpusIndexBusy(
                        f"index position {position} of {shard_id} stayed held by {locked.holder.describe()}"
                    ) from locked
                busy = True
            else:
                busy = False
                token = secrets.token_hex(8)
                recommit = mine is not None and mine.state == COMMITTED
                if not recommit:
                    reserved = IndexedShard(position, shard_id, None, 0, RESERVED, None, token)
                    _write_state(data_root, [s for s in state if s.shard_id != shard_id] + [reserved])
        if busy:
            time.sleep(LOCK_POLL_S)
            continue
        with stack:
            yield Reservation(shard_id, position, token, recommit)
        return


def wait_for_earlier(
    data_root: DataRoot,
    reservation: Reservation,
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> list[IndexedShard]:
    """Wait until no shard before ``reservation`` is still reserved: each commits, or its run is
    found gone (its position lock can be taken) and its reservation is dropped. Returns the state
    then (the committed shards before ``reservation`` are what it is decided against)."""
    deadline = time.monotonic() + timeout_s
    next_liveness_check = 0.0
    while True:
        state = read_state(data_root)
        pending = [s for s in state if s.state == RESERVED and s.position < reservation.position]
        if not pending:
            return state
        if time.monotonic() >= next_liveness_check:
            next_liveness_check = time.monotonic() + LIVENESS_CHECK_S
            for shard in pending:
                try:
                    with _position_lock(data_root, shard.position, run_id, holder_finished):
                        _drop_reservation(data_root, shard, run_id=run_id, holder_finished=holder_finished)
                except ShardLocked:
                    continue
            continue  # read the order again: a dropped reservation is no longer waited for
        # Until the next liveness check, watch the pending shards' commit records (a small file
        # each) rather than the order, which grows with the corpus.
        while time.monotonic() < next_liveness_check:
            if time.monotonic() >= deadline:
                raise CorpusIndexBusy(
                    f"shards reserved before {reservation.shard_id} (position {reservation.position}) did not "
                    f"commit in {timeout_s:.0f} s: {', '.join(f'{s.shard_id} at {s.position}' for s in pending)}"
                )
            if all(_committed_at(data_root, shard) for shard in pending):
                break
            time.sleep(WAIT_POLL_S)


def _committed_at(data_root: DataRoot, shard: IndexedShard) -> bool:
    """Whether ``shard``'s commit record names its reserved position (it has committed there)."""
    try:
        return (
            json.loads(data_root.fs.cat_file(data_root.path(_commit_record_relative(shard.shard_id))))["position"]
            == shard.position
        )
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return False


def _drop_reservation(data_root: DataRoot, shard: IndexedShard, **lock_options) -> None:
    """Remove ``shard``'s reservation if it is still the one read (its run was found gone)."""
    with corpus_index_lock(data_root, **lock_options):
        state = read_state(data_root)
        if any(s.position == shard.position and s.reservation == shard.reservation for s in state):
            _write_state(data_root, [s for s in state if s.position != shard.position])


position_lock = _position_lock
"""The lock a reserving run holds on its position until it commits (taking it proves that run gone)."""
drop_reservation = _drop_reservation


def entries_table(signals: Sequence[UtteranceSignals], decisions: Sequence[Decision]) -> pa.Table:
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
                "speaker_embedding": None
                if utterance.speaker_embedding is None
                else np.asarray(utterance.speaker_embedding, "<f2").tobytes(),
                **_shift_columns(utterance.shift),
            }
        )
    return pa.Table.from_pylist(rows, schema=ENTRIES_SCHEMA)


def _shift_columns(shift: ShiftSignature | None) -> dict:
    if shift is None:
        return {"envelope": None, "spectral_shape": None, "speech_span_s": None}
    return {
        "envelope": np.asarray(shift.envelope, "<f2").tobytes(),
        "spectral_shape": np.asarray(shift.spectral_shape, np.int8).tobytes(),
        "speech_span_s": shift.span_s,
    }


ENTRIES_VERSION_CHARS = 16


def _entries_bytes(entries: pa.Table) -> tuple[bytes, str]:
    buffer = io.BytesIO()
    pq.write_table(entries, buffer, compression="zstd", row_group_size=ENTRIES_ROW_GROUP, **WRITE_OPTIONS)
    content = buffer.getvalue()
    return content, hashlib.sha256(content).hexdigest()[:ENTRIES_VERSION_CHARS]


def _segment_relative(name: str) -> str:
    return f"{layout.NEAR_DUPLICATES_INDEX}/segments/{name}"


def _commit_record_relative(shard_id: str) -> str:
    return f"{layout.NEAR_DUPLICATES_INDEX}/committed/{shard_id}.json"


def _filter_relative(segment: str) -> str:
    return _segment_relative(filter_name(segment))


def _write_level0(data_root: DataRoot, shard_id: str, position: int, version: str, signals) -> str:
    """The shard's level-0 segment, its key filter written first (a segment never lacks one for long:
    a run killed between the two leaves a filter no segment names, removed once old)."""
    postings = index_keys(signals, position)
    content = segment_bytes(postings, 0, [SegmentShard(position, shard_id, version)])
    name = segment_name(content, 0)
    if not data_root.exists(_filter_relative(name)):
        data_root.write_bytes(_filter_relative(name), filter_bytes(postings["key"], name))
    if not data_root.exists(_segment_relative(name)):
        data_root.write_bytes(_segment_relative(name), content)
    return name


def _remove_segment(data_root: DataRoot, name: str) -> None:
    """Delete a segment and its filter (the segment first: a filter alone is never read)."""
    for relative in (_segment_relative(name), _filter_relative(name)):
        with contextlib.suppress(FileNotFoundError):
            data_root.fs.rm_file(data_root.path(relative))


def commit_shard_entries(
    data_root: DataRoot,
    reservation: Reservation,
    signals: Sequence[UtteranceSignals],
    decisions: Sequence[Decision],
    *,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> IndexedShard:
    """Write the shard's entries and level-0 segment, then commit its row (and its commit record)
    under the index lock; remove what it replaced. Raises :class:`ReservationLost` when the
    reservation was dropped meanwhile (nothing is committed: reserve and decide again)."""
    content, version = _entries_bytes(entries_table(signals, decisions))
    entries_relative = layout.near_duplicates_index_entries(reservation.shard_id, version)
    if not data_root.exists(entries_relative):
        data_root.write_bytes(entries_relative, content)
    with corpus_index_lock(data_root, timeout_s=timeout_s, run_id=run_id, holder_finished=holder_finished):
        state = read_state(data_root)
        mine = next((s for s in state if s.shard_id == reservation.shard_id), None)
        if mine is None or mine.position != reservation.position:
            raise ReservationLost(f"{reservation.shard_id} lost index position {reservation.position}")
        if mine.state == RESERVED and mine.reservation != reservation.token:
            raise ReservationLost(f"{reservation.shard_id}'s reservation of position {reservation.position} was taken")
        unchanged = mine.state == COMMITTED and mine.entries_version == version and _segment_present(data_root, mine)
        if unchanged:
            committed = mine
        else:
            segment = _write_level0(data_root, reservation.shard_id, reservation.position, version, signals)
            committed = IndexedShard(
                reservation.position, reservation.shard_id, version, len(signals), COMMITTED, segment
            )
            _write_state(data_root, [s for s in state if s.shard_id != reservation.shard_id] + [committed])
        _write_commit_record(data_root, committed)
    if not unchanged and mine.state == COMMITTED:
        _remove_unreferenced_segments(data_root, {mine.segment} - {None})
    remove_unlisted_entries(data_root, reservation.shard_id, version)
    return committed


def _segment_present(data_root: DataRoot, shard: IndexedShard) -> bool:
    return shard.segment is not None and data_root.exists(_segment_relative(shard.segment))


def _commit_record(shard: IndexedShard) -> bytes:
    body = {
        "shard_id": shard.shard_id,
        "position": shard.position,
        "entries_version": shard.entries_version,
        "utterances": shard.utterances,
    }
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    body["sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    return (json.dumps(body, sort_keys=True, indent=1) + "\n").encode()


def _write_commit_record(data_root: DataRoot, shard: IndexedShard) -> None:
    relative = _commit_record_relative(shard.shard_id)
    content = _commit_record(shard)
    with contextlib.suppress(FileNotFoundError):
        if data_root.fs.cat_file(data_root.path(relative)) == content:
            return
    data_root.write_bytes(relative, content)


def _state_from_commit_records(data_root: DataRoot) -> list[IndexedShard]:
    """The committed shards as their checksummed commit records name them, each mapped to no
    segment yet (:func:`repair_index` finds or rebuilds their postings)."""
    shards = []
    for path in sorted(data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/committed/*.json")):
        try:
            body = json.loads(data_root.fs.cat_file(path))
            digest = body.pop("sha256")
            canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
            if hashlib.sha256(canonical.encode()).hexdigest() != digest:
                continue
            shards.append(IndexedShard(body["position"], body["shard_id"], body["entries_version"], body["utterances"]))
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(shards, key=lambda s: s.position)


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


def _remove_unreferenced_segments(data_root: DataRoot, candidates: set[str]) -> None:
    if not candidates:
        return
    referenced = {s.segment for s in read_state(data_root)}
    for name in candidates - referenced:
        _remove_segment(data_root, name)


# --- reading: the candidate source ---------------------------------------------------------------


def _parse_entry(shard_id: str, row: dict) -> IndexEntry:
    signature, speaker, envelope = row["transcript_signature"], row.get("speaker_embedding"), row.get("envelope")
    signals = UtteranceSignals(
        shard_id=shard_id,
        utt_id=row["utt_id"],
        exact_hash=row["exact_hash"],
        fingerprint=AudioFingerprint.from_bytes(row["sub_fingerprints"], row["active_frames"]),
        transcript_signature=None if signature is None else np.frombuffer(signature, "<u8").astype(np.uint64),
        transcript_words=row["transcript_words"],
        speaker_embedding=None if speaker is None else np.frombuffer(speaker, "<f2").astype(np.float32),
        shift=None
        if envelope is None
        else ShiftSignature(
            np.frombuffer(envelope, "<f2").astype(np.float32),
            np.frombuffer(row["spectral_shape"], np.int8).reshape(SHAPE_SEGMENTS, -1),
            row["speech_span_s"],
        ),
    )
    return signals, (row["representative_shard"], row["representative_utt"])


class IndexReader:
    """The committed shards before ``position``, as a :class:`~.near_dup_matching.CandidateSource`:
    postings read block by block from the live segments, entries row group by row group. Holds
    nothing but the order's rows (and the postings of one :meth:`prefetch`); counts what it read
    (``postings_read``, ``rows_read``, ``filter_bytes_read``). A key a segment's filter rules out
    reads nothing of that segment.

    :meth:`prefetch` then :meth:`settle` let a shard read the postings of its keys from what is
    committed while shards reserved before it are still deciding, and then read only the postings
    of the shards that committed meanwhile: the result is the same as one read after them."""

    def __init__(self, data_root: DataRoot, position: int, state: Sequence[IndexedShard] | None = None):
        self.data_root = data_root
        self.position = position
        self.postings_read = 0
        self.rows_read = 0
        self.filter_bytes_read = 0
        self._prefetched: tuple[np.ndarray, dict[int, str | None], np.ndarray] | None = None
        self.settle(read_state(data_root) if state is None else state)

    def settle(self, state: Sequence[IndexedShard]) -> None:
        """Decide against the committed shards before the position in ``state`` from now on."""
        self.shards = {s.position: s for s in state if s.state == COMMITTED and s.position < self.position}

    @property
    def utterances(self) -> int:
        return sum(shard.utterances for shard in self.shards.values())

    def prefetch(self, keys: np.ndarray) -> None:
        """Read the postings of ``keys`` now; a later :meth:`postings` of the same keys reuses them
        for every shard still committed at the same entries version."""
        wanted = np.unique(keys.astype(np.uint64))
        versions = {position: shard.entries_version for position, shard in self.shards.items()}
        self._prefetched = (wanted, versions, self._lookup(wanted, self.shards))

    def postings(self, keys: np.ndarray) -> np.ndarray:
        wanted = np.unique(keys.astype(np.uint64))
        if self._prefetched is None or not np.array_equal(wanted, self._prefetched[0]):
            return self._lookup(wanted, self.shards)
        _, versions, prefetched = self._prefetched
        same = [p for p, shard in self.shards.items() if versions.get(p, "") == shard.entries_version]
        fresh = {p: shard for p, shard in self.shards.items() if versions.get(p, "") != shard.entries_version}
        kept = prefetched[np.isin(position_of(prefetched["owner"]), np.asarray(same, np.int64))]
        return np.concatenate([kept, self._lookup(wanted, fresh)])

    def _lookup(self, keys: np.ndarray, shards: dict[int, IndexedShard]) -> np.ndarray:
        by_segment: dict[str, set[int]] = defaultdict(set)
        for shard in shards.values():
            if shard.segment is None:
                raise IndexDamaged(f"{shard.shard_id} (position {shard.position}) is mapped to no segment")
            by_segment[shard.segment].add(shard.position)
        found = []
        for name, positions in sorted(by_segment.items()):
            relative = _segment_relative(name)
            try:
                present, read = keys_maybe_in(self.data_root, _filter_relative(name), name, keys)
            except FileNotFoundError as exc:
                raise IndexDamaged(f"the filter of segment {relative} is missing") from exc
            except DamagedFilter as exc:
                raise IndexDamaged(str(exc)) from exc
            self.filter_bytes_read += read
            if len(present) == 0:
                if not self.data_root.exists(relative):
                    raise IndexDamaged(f"segment {relative} is missing")
                continue
            try:
                with self.data_root.fs.open(self.data_root.path(relative), "rb") as handle:
                    header, postings = lookup_segment(handle, relative, present)
            except FileNotFoundError as exc:
                raise IndexDamaged(f"segment {relative} is missing") from exc
            except DamagedSegment as exc:
                raise IndexDamaged(str(exc)) from exc
            held = {(s.position, s.entries_version) for s in header.shards}
            for position in positions:
                if (position, shards[position].entries_version) not in held:
                    raise IndexDamaged(f"segment {relative} does not hold {shards[position].shard_id}")
            self.postings_read += len(postings)
            wanted = np.isin(position_of(postings["owner"]), np.fromiter(positions, np.int64))
            found.append(postings[wanted])
        return np.concatenate(found) if found else np.empty(0, POSTING_DTYPE)

    def entries(self, owners: Sequence[int]) -> dict[int, IndexEntry]:
        by_position: dict[int, list[int]] = defaultdict(list)
        for owner in owners:
            by_position[int(position_of(owner))].append(owner)
        fetched: dict[int, IndexEntry] = {}
        for position, wanted in sorted(by_position.items()):
            shard = self.shards[position]
            relative = layout.near_duplicates_index_entries(shard.shard_id, shard.entries_version)
            ranks = np.array([int(rank_of(owner)) for owner in wanted], np.int64)
            try:
                with self.data_root.open_parquet(relative) as parquet:
                    # Row groups as the file has them (64 rows; one for files written before that).
                    metadata = parquet.metadata
                    starts = np.cumsum([0] + [metadata.row_group(g).num_rows for g in range(metadata.num_row_groups)])
                    of_rank = np.searchsorted(starts, ranks, side="right") - 1
                    groups = sorted(set(of_rank.tolist()))
                    table = parquet.read_row_groups(groups)
            except (UnreadableIntermediate, FileNotFoundError) as exc:
                raise IndexDamaged(
                    f"entries of {shard.shard_id} ({relative}) unreadable: {exc}", shard.shard_id
                ) from exc
            if int(ranks.max()) >= int(starts[-1]):
                raise IndexDamaged(
                    f"entries of {shard.shard_id} ({relative}) hold fewer rows than indexed", shard.shard_id
                )
            rows = table.to_pylist()
            self.rows_read += len(rows)
            first_row = {
                group: int(sum(starts[g + 1] - starts[g] for g in groups[:i])) for i, group in enumerate(groups)
            }
            for owner, rank, group in zip(wanted, ranks.tolist(), of_rank.tolist(), strict=True):
                fetched[owner] = _parse_entry(shard.shard_id, rows[first_row[group] + rank - int(starts[group])])
        return fetched


def read_shard_entries(data_root: DataRoot, shard: IndexedShard) -> list[IndexEntry]:
    """Every utterance of one committed shard, in rank order."""
    relative = layout.near_duplicates_index_entries(shard.shard_id, shard.entries_version)
    return [_parse_entry(shard.shard_id, row) for row in data_root.read_parquet(relative).to_pylist()]


# --- repair and compaction -------------------------------------------------------------------------


def repair_index(
    data_root: DataRoot,
    *,
    damaged_entries: Sequence[str] = (),
    refingerprint: Callable[[str], Sequence[UtteranceSignals]] | None = None,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    **lock_options,
) -> list[str]:
    """Rebuild what is damaged or missing, under the index lock; return what was done, one line each.

    ``shards.parquet`` unreadable: rebuilt from the commit records (reservations are dropped: their
    runs reserve again). A committed shard whose segment is missing, damaged or does not hold it:
    mapped to a segment that holds it, or to a level-0 segment rebuilt from its entries file. A
    shard whose entries file cannot be read (or is named in ``damaged_entries``): its signals
    computed again from its audio (``refingerprint(shard_id)``, in ``utt_id`` order) and its
    representatives taken from its ``near_duplicates.parquet``, at its position; without either, it
    is dropped from the index (its next run indexes it again, at the end)."""
    done: list[str] = []
    with corpus_index_lock(data_root, timeout_s=timeout_s, **lock_options):
        try:
            state = read_state(data_root)
        except IndexDamaged as exc:
            state = _state_from_commit_records(data_root)
            done.append(f"rebuilt shards.parquet from {len(state)} commit records ({exc})")
        held_by_segment = _healthy_segments(data_root)
        done += _repair_filters(data_root, list(held_by_segment))
        repaired = []
        for shard in state:
            kept, line = _repair_shard(data_root, shard, held_by_segment, damaged_entries, refingerprint)
            if kept is not None:
                repaired.append(kept)
            if line:
                done.append(f"{shard.shard_id}: {line}")
        if done:
            _write_state(data_root, repaired)
            for shard in repaired:
                if shard.state == COMMITTED:
                    _write_commit_record(data_root, shard)
    return done


def _repair_shard(
    data_root: DataRoot,
    shard: IndexedShard,
    held_by_segment: dict[str, set[tuple[int, str]]],
    damaged_entries: Sequence[str],
    refingerprint: Callable[[str], Sequence[UtteranceSignals]] | None,
) -> tuple[IndexedShard | None, str | None]:
    """The shard's row after repair (None: dropped) and what was done (None: nothing)."""
    if shard.state != COMMITTED:
        return shard, None
    if shard.shard_id in damaged_entries and not _entries_readable(data_root, shard):
        rebuilt = _rebuild_entries(data_root, shard, refingerprint)
        if rebuilt is None:
            _remove_commit_record(data_root, shard)
            return None, "dropped from the index (entries unreadable, not rebuildable); re-run it"
        return rebuilt, "entries fingerprinted again from its audio"
    key = (shard.position, shard.entries_version)
    if shard.segment in held_by_segment and key in held_by_segment[shard.segment]:
        return shard, None
    holder = next((name for name, held in sorted(held_by_segment.items(), reverse=True) if key in held), None)
    if holder is not None:
        return replace(shard, segment=holder), f"postings found in segment {holder}"
    try:
        entries = read_shard_entries(data_root, shard)
    except (UnreadableIntermediate, FileNotFoundError):
        rebuilt = _rebuild_entries(data_root, shard, refingerprint)
        if rebuilt is None:
            _remove_commit_record(data_root, shard)
            return None, "dropped from the index (entries unreadable); re-run it"
        return rebuilt, "entries and segment fingerprinted again from its audio"
    segment = _write_level0(
        data_root, shard.shard_id, shard.position, shard.entries_version, [signals for signals, _ in entries]
    )
    return replace(shard, segment=segment, utterances=len(entries)), f"segment rebuilt from its entries ({segment})"


def _entries_readable(data_root: DataRoot, shard: IndexedShard) -> bool:
    try:
        read_shard_entries(data_root, shard)
    except (UnreadableIntermediate, FileNotFoundError):
        return False
    return True


def _remove_commit_record(data_root: DataRoot, shard: IndexedShard) -> None:
    with contextlib.suppress(FileNotFoundError):
        data_root.fs.rm_file(data_root.path(_commit_record_relative(shard.shard_id)))


def _rebuild_entries(
    data_root: DataRoot, shard: IndexedShard, refingerprint: Callable[[str], Sequence[UtteranceSignals]] | None
) -> IndexedShard | None:
    """The shard's entries and level-0 segment written again from its audio and its own decisions
    file, at its position; None when either is not there to read."""
    if refingerprint is None or not data_root.exists(layout.near_duplicates(shard.shard_id)):
        return None
    try:
        signals = list(refingerprint(shard.shard_id))
        rows = data_root.read_parquet(layout.near_duplicates(shard.shard_id)).to_pylist()
    except (UnreadableIntermediate, FileNotFoundError):
        return None
    copies = {row["utt_id"]: row for row in rows}
    decisions = [
        Decision(
            s.utt_id,
            copies[s.utt_id]["representative_shard"] if s.utt_id in copies else shard.shard_id,
            copies[s.utt_id]["representative_utt"] if s.utt_id in copies else s.utt_id,
            copies[s.utt_id]["kind"] if s.utt_id in copies else None,
            copies[s.utt_id]["similarity"] if s.utt_id in copies else 1.0,
        )
        for s in signals
    ]
    content, version = _entries_bytes(entries_table(signals, decisions))
    data_root.write_bytes(layout.near_duplicates_index_entries(shard.shard_id, version), content)
    segment = _write_level0(data_root, shard.shard_id, shard.position, version, signals)
    if version != shard.entries_version:
        with contextlib.suppress(FileNotFoundError):
            data_root.fs.rm_file(
                data_root.path(layout.near_duplicates_index_entries(shard.shard_id, shard.entries_version))
            )
    return replace(shard, entries_version=version, segment=segment, utterances=len(signals))


def _healthy_segments(data_root: DataRoot) -> dict[str, set[tuple[int, str]]]:
    """Each segment file whose header and blocks check out, with the (position, version) it holds;
    damaged ones are removed."""
    healthy = {}
    for path in data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*.seg"):
        name = posixpath.basename(path)
        try:
            with data_root.fs.open(path, "rb") as handle:
                header = verify_segment(handle, name)
        except DamagedSegment:
            _remove_segment(data_root, name)
            continue
        healthy[name] = {(s.position, s.entries_version) for s in header.shards}
    return healthy


def _repair_filters(data_root: DataRoot, segments: Sequence[str]) -> list[str]:
    """Rebuild the key filter of each of ``segments`` whose filter is missing or damaged, from the
    segment's postings; return what was done, one line each."""
    done = []
    for name in sorted(segments):
        try:
            with data_root.fs.open(data_root.path(_filter_relative(name)), "rb") as handle:
                verify_filter(handle, _filter_relative(name), name)
            continue
        except (FileNotFoundError, DamagedFilter) as exc:
            reason = "missing" if isinstance(exc, FileNotFoundError) else "damaged"
        relative = _segment_relative(name)
        try:
            with data_root.fs.open(data_root.path(relative), "rb") as handle:
                header = read_segment_header(handle, relative)
                builder = FilterBuilder(header.records)
                step = max(MERGE_CHUNK_POSTINGS // BLOCK_RECORDS, 1)
                for first in range(0, len(header.fences), step):
                    end = min(first + step, len(header.fences))
                    builder.add(read_blocks(handle, relative, header, first, end)["key"])
        except (FileNotFoundError, DamagedSegment):
            continue  # the segment itself is repaired by the shards that need it
        with data_root.open_atomic(_filter_relative(name)) as output:
            for piece in builder.finish(name):
                output.write(piece)
        done.append(f"filter of segment {name} rebuilt ({reason})")
    return done


def _level(name: str) -> int:
    return int(name.split("-", 1)[0].removeprefix("L"))


def compact_index(data_root: DataRoot, *, timeout_s: float = DEFAULT_LOCK_TIMEOUT_S, **lock_options) -> str | None:
    """Merge the :data:`FANOUT` earliest segments of the lowest level that has that many into one
    segment of the next level (one merge per call); return its name, or None when nothing was due.
    The merge runs outside the index lock; the switch (shards remapped, only where they still point
    at the merged segments with the same entries version) under it."""
    try:
        state = read_state(data_root)
    except IndexDamaged:
        return None  # repaired by the next run that needs it
    by_segment: dict[str, list[IndexedShard]] = defaultdict(list)
    for shard in state:
        if shard.state == COMMITTED and shard.segment:
            by_segment[shard.segment].append(shard)
    _remove_orphan_segments(data_root, set(by_segment))
    due = _due_merge(by_segment)
    if due is None:
        return None
    level, inputs = due
    members = {(s.position, s.entries_version): s for name in inputs for s in by_segment[name]}
    merged = _write_merged(data_root, inputs, members, level + 1)
    if merged is None:
        return None
    with corpus_index_lock(data_root, timeout_s=timeout_s, **lock_options):
        try:
            current = read_state(data_root)
        except IndexDamaged:
            return None
        switched = [
            replace(s, segment=merged)
            if s.state == COMMITTED and s.segment in inputs and (s.position, s.entries_version) in members
            else s
            for s in current
        ]
        _write_state(data_root, switched)
    _remove_unreferenced_segments(data_root, set(inputs) | {merged})
    return merged


def _due_merge(by_segment: dict[str, list[IndexedShard]]) -> tuple[int, list[str]] | None:
    """``(level, the FANOUT earliest segments of it)`` for the lowest level that has that many."""
    by_level: dict[int, list[str]] = defaultdict(list)
    for name in by_segment:
        by_level[_level(name)].append(name)
    for level in sorted(by_level):
        names = sorted(by_level[level], key=lambda name: min(s.position for s in by_segment[name]))
        if len(names) >= FANOUT:
            return level, names[:FANOUT]
    return None


def _write_merged(
    data_root: DataRoot, inputs: list[str], members: dict[tuple[int, str], IndexedShard], level: int
) -> str | None:
    """Merge ``inputs`` (keeping only ``members``' postings) into one segment of ``level``, streamed;
    its name, or None when an input is gone or damaged (the next run that reads it repairs it)."""
    shards = [SegmentShard(p, members[(p, v)].shard_id, v) for p, v in sorted(members)]
    with contextlib.ExitStack() as stack:
        opened = []
        for name in inputs:
            relative = _segment_relative(name)
            try:
                handle = stack.enter_context(data_root.fs.open(data_root.path(relative), "rb"))
                header = read_segment_header(handle, relative)
            except (FileNotFoundError, DamagedSegment):
                return None  # repaired by the next run that reads it
            held = {(s.position, s.entries_version) for s in header.shards}
            mine = [key for key, shard in members.items() if shard.segment == name]
            if not all(key in held for key in mine):
                return None
            # Only the positions the order maps to this segment: it may also hold an older version
            # of a shard since re-indexed elsewhere.
            opened.append((handle, relative, header, np.array([position for position, _ in mine], np.int64)))
        writer = SegmentWriter(key_filter=FilterBuilder(sum(header.records for _, _, header, _ in opened)))
        try:
            merge_segments(opened, writer, MERGE_CHUNK_POSTINGS)
        except DamagedSegment:
            return None
    merged, pieces = writer.finish(level, shards)
    with data_root.open_atomic(_filter_relative(merged)) as output:
        for piece in writer.key_filter.finish(merged):
            output.write(piece)
    with data_root.open_atomic(_segment_relative(merged)) as output:
        for piece in pieces:
            output.write(piece)
    return merged


ORPHAN_GRACE_S = 3_600.0
"""A segment no row names is removed once it is this old: younger ones may be a commit or a merge
still on its way to naming it."""


def _remove_orphan_segments(data_root: DataRoot, referenced: set[str]) -> int:
    """Delete segments no committed shard maps to (a run killed between writing its level-0 segment
    and its commit, a merge that lost its switch) once :data:`ORPHAN_GRACE_S` old; return how many."""
    removed = 0
    now = time.time()
    referenced = referenced | {filter_name(name) for name in referenced}
    folder = f"{layout.NEAR_DUPLICATES_INDEX}/segments"
    for path in data_root.glob(f"{folder}/*.seg") + data_root.glob(f"{folder}/*.seg.filter"):
        if posixpath.basename(path) in referenced:
            continue
        with contextlib.suppress(FileNotFoundError):
            if now - data_root.fs.modified(path).timestamp() >= ORPHAN_GRACE_S:
                data_root.fs.rm_file(path)
                removed += 1
    return removed


def write_index(
    data_root: DataRoot, shards: Sequence[tuple[str, Sequence[UtteranceSignals], Sequence[Decision]]]
) -> list[IndexedShard]:
    """Index a whole corpus at once, in the given order (positions 0, 1, ...), as the incremental
    path would have: for a batch pass that decided every shard with :func:`decide_shard` against
    the shards before it. Replaces any index there was; then compacts it."""
    committed = []
    with corpus_index_lock(data_root):
        for position, (shard_id, signals, decisions) in enumerate(shards):
            content, version = _entries_bytes(entries_table(signals, decisions))
            data_root.write_bytes(layout.near_duplicates_index_entries(shard_id, version), content)
            segment = _write_level0(data_root, shard_id, position, version, signals)
            shard = IndexedShard(position, shard_id, version, len(signals), COMMITTED, segment)
            _write_commit_record(data_root, shard)
            remove_unlisted_entries(data_root, shard_id, version)
            committed.append(shard)
        _write_state(data_root, committed)
    while compact_index(data_root):
        pass
    return committed
