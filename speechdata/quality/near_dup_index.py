"""The corpus-wide near-duplicate index under ``index/near_duplicates/`` on the data root.

Layout (docs/near-duplicates.md, docs/storage-layout.md)::

    shard_list/head.json                  the order's snapshot head (checksummed): the last record
                                          folded in, the next position, each part's file, the
                                          reserved rows, each part's summary (:mod:`.near_dup_order_log`;
                                          what a new shard reads: :mod:`.near_dup_order_directory`)
    shard_list/parts/<part>-<sha>.parquet position, shard_id, state, entries_version, utterances,
                                          segment, reservation of PART_ROWS positions
    shard_list/members/<sha>.bin          the parts' membership filters (:mod:`.near_dup_order_members`)
    order/<seq>.json                      one change to the order after the snapshot, checksummed: the
                                          commit point; folded into the parts it touches every
                                          FOLD_EVERY
    committed/<shard>.json                one shard's commit record (checksummed): rebuilds the order
    entries/<shard>-<version>.parquet     one row per utterance (signals + representative), 64 rows a
                                          row group; version = digest of the content
    entries_written/<shard>.json          the versions of a shard's entries files its commit removes
    segments/L<level>-<digest>.seg        postings key -> (owner, frame), sorted, blocked, checksummed
                                          (:mod:`.near_dup_postings`)
    segments/L<level>-<digest>.seg.filter the segment's key filter: a blocked Bloom filter, each line
                                          checked (:mod:`.near_dup_filter`)

The order rule. A shard *reserves* a position in a short critical section (the index lock, held for
milliseconds: read the order's head, write a record of its ``reserved`` row) and holds the lock of
its position (``_locks/near-duplicates-index/position-<n>.lock``) until it commits. It then waits
only for the shards reserved before it (:func:`wait_for_earlier`): each either commits, or is found
dead (its position lock is free) and its reservation is dropped, so it re-reserves after this one
when it runs again. The shard is then decided against exactly the shards committed before its
position (:class:`IndexReader`: the postings of its own keys, then the entries of the utterances
they name), and committed (:func:`commit_shard_entries`: entries file, level-0 segment, then the row
under the lock). A committed shard re-run keeps its position, so its decisions and the index are
byte-identical. No lock is held while a shard is fingerprinted or matched; the index lock is held
only for a reservation, a commit or a compaction's switch.

Cost per new shard: the shard's keys tested against each live segment's key filter (one 64-byte
line per key), the keys that pass looked up block by block in that segment (segments are merged in
tiers of ``FANOUT``, so there are few), plus the entries row groups of the utterances those keys
name. Nothing is cached between shards. A shard's run merges only what creates a small level; the
larger merges are the compaction job's (:mod:`.near_dup_compaction`).

Repair (:func:`repair_index`, run by the stage whenever it finds damage): the shard list's head, a
part or an order record that cannot be read (or a gap in the records) is rebuilt from the commit records; a key filter that is damaged or missing is
rebuilt from its segment; a segment that is damaged or missing is rebuilt
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

The code, along its seams: the order, its locks and commit records (:mod:`.near_dup_index_order`),
entries files (:mod:`.near_dup_index_entries`), committing a shard (:mod:`.near_dup_index_commit`),
reading (:mod:`.near_dup_index_reader`), repair (:mod:`.near_dup_index_repair`), compaction (:mod:`.near_dup_index_merge`;
which merges run where: :mod:`.near_dup_compaction`). This
module names the public API of all of them.
"""

from __future__ import annotations

from speechdata.quality.near_dup_index_commit import (
    commit_shard_entries,
)
from speechdata.quality.near_dup_index_entries import (
    ENTRIES_ROW_GROUP,
    ENTRIES_SCHEMA,
    entries_table,
    read_shard_entries,
    remove_unlisted_entries,
)
from speechdata.quality.near_dup_index_merge import (
    FANOUT,
    compact_index,
    write_index,
)
from speechdata.quality.near_dup_index_order import (
    COMMITTED,
    DEFAULT_LOCK_TIMEOUT_S,
    INDEX_LOCK_KEY,
    INDEX_LOCK_PRODUCT,
    LOCK_POLL_S,
    ORDER_SCHEMA,
    RESERVED,
    CorpusIndexBusy,
    IndexDamaged,
    IndexedShard,
    Reservation,
    ReservationLost,
    corpus_index_lock,
    drop_reservation,
    position_lock,
    read_order,
    read_state,
    reserve_position,
    wait_for_earlier,
)
from speechdata.quality.near_dup_index_reader import (
    IndexReader,
)
from speechdata.quality.near_dup_index_repair import (
    repair_index,
)
from speechdata.quality.near_dup_postings import (
    index_keys,
)

__all__ = [
    "COMMITTED",
    "CorpusIndexBusy",
    "DEFAULT_LOCK_TIMEOUT_S",
    "ENTRIES_ROW_GROUP",
    "ENTRIES_SCHEMA",
    "FANOUT",
    "INDEX_LOCK_KEY",
    "INDEX_LOCK_PRODUCT",
    "IndexDamaged",
    "IndexReader",
    "IndexedShard",
    "LOCK_POLL_S",
    "ORDER_SCHEMA",
    "RESERVED",
    "Reservation",
    "ReservationLost",
    "commit_shard_entries",
    "compact_index",
    "corpus_index_lock",
    "drop_reservation",
    "entries_table",
    "index_keys",
    "position_lock",
    "read_order",
    "read_shard_entries",
    "read_state",
    "remove_unlisted_entries",
    "repair_index",
    "reserve_position",
    "wait_for_earlier",
    "write_index",
]
