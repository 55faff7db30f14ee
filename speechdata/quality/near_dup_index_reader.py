"""The committed shards before a position, read as a candidate source: postings of the shard's own
keys (segment by segment, past each segment's key filter), then the entries rows they name."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from speechdata.io import layout
from speechdata.io.parquet_integrity import UnreadableIntermediate
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_filter import (
    DamagedFilter,
    keys_maybe_in,
)
from speechdata.quality.near_dup_index_commit import (
    _filter_relative,
    _segment_relative,
)
from speechdata.quality.near_dup_index_entries import (
    _parse_entry,
)
from speechdata.quality.near_dup_index_order import (
    COMMITTED,
    IndexDamaged,
    IndexedShard,
    read_state,
)
from speechdata.quality.near_dup_matching import IndexEntry
from speechdata.quality.near_dup_postings import (
    POSTING_DTYPE,
    DamagedSegment,
    lookup_segment,
    position_of,
    rank_of,
)


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
