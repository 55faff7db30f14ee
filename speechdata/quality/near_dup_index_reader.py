"""The committed shards before a position, read as a candidate source: postings of the shard's own
keys (segment by segment, past each segment's key filter), then the entries rows they name."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_filter import (
    DamagedFilter,
    KeyProbe,
    keys_maybe_in,
)
from speechdata.quality.near_dup_index_commit import (
    _filter_relative,
    _segment_relative,
)
from speechdata.quality.near_dup_index_entries import _parse_entry, read_entry_rows
from speechdata.quality.near_dup_index_order import (
    READ_ATTEMPTS,
    IndexDamaged,
    IndexedShard,
    _FoldedMeanwhile,
)
from speechdata.quality.near_dup_matching import IndexEntry
from speechdata.quality.near_dup_order_directory import ShardDirectory, read_directory
from speechdata.quality.near_dup_postings import (
    POSTING_DTYPE,
    DamagedSegment,
    SegmentHeader,
    SegmentShard,
    block_ranges,
    capped_postings_mask,
    key_posting_cap,
    lookup_segment,
    position_of,
    rank_of,
    sorted_contains,
    sorted_unique,
    uncertain_capped_keys,
)

SKIP_CAPPED_KEYS = True
"""Whether a lookup stops reading a sampled audio key once more than ``MAX_KEY_OCCURRENCES`` of its
postings before the position were counted (the key never votes): off, every key is read in every
live segment, as before (the exactness tests and the benchmark compare the two)."""


class _CountingHandle:
    """A binary file handle that counts the bytes read through it."""

    def __init__(self, handle):
        self._handle, self.bytes_read = handle, 0

    def read(self, size: int = -1) -> bytes:
        data = self._handle.read(size)
        self.bytes_read += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._handle.seek(offset, whence)


class IndexReader:
    """The committed shards before ``position``, as a :class:`~.near_dup_matching.CandidateSource`:
    postings read block by block from the live segments, entries row group by row group. Reads of
    the shard list only its head, its records and the part holding ``position``
    (:class:`~.near_dup_order_directory.ShardDirectory`): the segments to read and each part's rows
    mapped to them come from the head's part summaries, the owner of a posting from its segment's
    header; a part is read only where a segment holds a different number of its shards than the
    summary maps there (a shard re-indexed elsewhere since). Counts what it read
    (``postings_read``, ``rows_read`` with ``entries_fetched`` the utterances they were read for,
    ``filter_bytes_read``, ``segment_bytes_read``, ``parts_read``, ``blocks_read`` with
    ``blocks_read_by_chance`` those read only for keys a filter let through that the segment does
    not hold). A key a segment's filter rules out reads nothing of that segment.

    :meth:`prefetch` then :meth:`settle` let a shard read the postings of its keys from what is
    committed while shards reserved before it are still deciding, and then read only the segments
    that appeared meanwhile: a segment's postings of the same keys never change (segments are
    immutable), and which of them count is decided against the state :meth:`settle` gave, so the
    result is the same as one read after them."""

    def __init__(self, data_root: DataRoot, position: int, state: Sequence[IndexedShard] | None = None):
        self.data_root = data_root
        self.position = position
        self.postings_read = 0
        self.rows_read = 0
        self.filter_bytes_read = 0
        self.segment_bytes_read = 0
        self.entries_fetched = 0
        self._looked_up: list[tuple[str, np.ndarray, np.ndarray]] = []
        """Per segment lookup: the segment, the keys its filter let through, the keys found (unique:
        no view that would keep every chunk's postings alive); ``_fences``: each segment's, once."""
        self._fences: dict[str, np.ndarray] = {}
        self._keys: np.ndarray | None = None
        self._probe: tuple[np.ndarray, KeyProbe] | None = None
        """The last keys looked up and their filter probe, made once for every segment."""
        self._read: dict[str, tuple[SegmentHeader | None, np.ndarray, np.ndarray]] = {}
        """Segment -> its header (None: its filter ruled every key out), its postings of the keys
        looked up in it, and which of ``_keys`` those are (bool per key: every one, or those still
        voting when it was read)."""
        self._full_probe: tuple[np.ndarray, KeyProbe] | None = None
        """``_keys`` and their filter probe, which the probes of the keys still voting are cut from."""
        self._owners: dict[str, tuple[np.ndarray, Sequence[SegmentShard]]] = {}
        """Per segment read: the positions whose postings counted, and the header's shards (once per
        settled state); ``_over_limit``: the keys and limit a :meth:`prefetch` passed."""
        self._over_limit: tuple[np.ndarray, int] | None = None
        self._directory: ShardDirectory | None = None
        self._parts_given: set[int] = set()
        """The parts the directory held when this reader took it (read by whoever read it)."""
        self._parts_read_before = 0
        """Parts this reader read into directories it has since replaced (the prefetch's counts)."""
        self.settle(read_directory(data_root, position) if state is None else state)

    def settle(self, state: Sequence[IndexedShard]) -> None:
        """Decide against the committed shards before the position in ``state`` from now on: a
        :class:`~.near_dup_order_directory.ShardDirectory` (what :func:`.wait_for_earlier` returns)
        or every row (:func:`.read_state`)."""
        self._take(state if isinstance(state, ShardDirectory) else ShardDirectory.of_rows(self.data_root, state))
        try:
            self._live = self._directory.segments(self.position)
        except _FoldedMeanwhile:  # its own part folded away since ``state`` was read: read it again
            self._take(read_directory(self.data_root, self.position))
            self._live = self._directory.segments(self.position)
        self._owners = {}

    def _take(self, directory: ShardDirectory) -> None:
        if directory is self._directory:
            return
        if self._directory is not None:
            self._parts_read_before += len(self._directory.loaded - self._parts_given)
        self._directory, self._parts_given = directory, set(directory.loaded)

    @property
    def utterances(self) -> int:
        return self._directory.utterances(self.position)

    @property
    def parts_read(self) -> int:
        """The parts of the shard list the directory decided against holds, and those this reader
        read into a directory it replaced since (the prefetch counts against the state it started
        from, a part it reads there is read again after :meth:`settle`)."""
        return len(self._directory.loaded) + self._parts_read_before

    def prefetch(self, keys: np.ndarray, audio_only: np.ndarray | None = None, limit: int | None = None) -> None:
        """Read the postings of ``keys`` in every live segment now (``audio_only``: as
        :meth:`postings` takes it); a later :meth:`postings` of the same keys reads only the
        segments that were not live then, and the keys it dropped from a segment that it needs there
        after all (the counts that dropped them are taken again against the settled state).
        ``limit``: once more than this many postings are read, they are dropped and reading stops;
        a later :meth:`postings` of the same keys with that limit then answers None at once
        (the caller looks them up in chunks)."""
        self._keys, self._read, self._over_limit = sorted_unique(keys.astype(np.uint64)), {}, None
        try:
            if self._counted(self._keys, audio_only, prefetching=True, limit=limit) is None:
                self._over_limit, self._read = (self._keys, limit), {}
        finally:
            self._owners = {}  # the state it counted against is not the one :meth:`settle` gives

    def postings(self, keys: np.ndarray, audio_only=None, limit: int | None = None) -> np.ndarray | None:
        """The postings of ``keys`` before the position, except a sampled audio key's in the
        segments left once more than ``MAX_KEY_OCCURRENCES`` of its postings were counted, when it
        is one of ``audio_only`` (sorted unique: keys the shard holds as sampled audio keys only,
        :func:`~.near_dup_postings.audio_only_keys`): such a key never votes, and the postings
        already counted say so (docs/near-duplicates.md, "A capped key read in one segment").
        ``limit``: None instead, once more than this many postings are read (reading stops then;
        the postings read for other keys before are dropped)."""
        wanted = sorted_unique(keys.astype(np.uint64))
        if self._keys is None or not np.array_equal(wanted, self._keys):
            self._keys, self._read = wanted, {}
        wanted = self._keys  # the array the filter probe was made for
        if self._over_limit is not None and self._over_limit[0] is wanted and limit == self._over_limit[1]:
            return None  # the prefetch held more than that already
        for attempt in range(READ_ATTEMPTS):
            try:
                return self._counted(wanted, audio_only, limit=limit)
            except _FoldedMeanwhile:  # a part read lazily was folded away: the state after the fold
                if attempt == READ_ATTEMPTS - 1:
                    raise IndexDamaged(f"the shard list moved on every one of {READ_ATTEMPTS} reads") from None
                self.settle(read_directory(self.data_root, self.position))
        raise AssertionError("unreachable")

    def _lookup_order(self) -> list[str]:
        """The live segments, those mapped the most shards before the position first (then by
        name): a key's postings before the position grow with the shards a segment holds, so the
        largest segment is the likeliest to show a common key past the cap, and once it does every
        smaller one is spared that key."""
        return sorted(self._live, key=lambda name: (-sum(self._live[name].values()), name))

    def _counted(
        self, wanted: np.ndarray, audio_only: np.ndarray | None, prefetching: bool = False, limit: int | None = None
    ) -> np.ndarray | None:
        found, uncertain = [], {}
        droppable = (
            sorted_contains(audio_only, wanted)
            if SKIP_CAPPED_KEYS and audio_only is not None and len(audio_only)
            else np.zeros(len(wanted), bool)
        )
        capped_counted = np.zeros(len(wanted), np.int64)
        looked_up, still_voting = wanted, np.ones(len(wanted), bool)
        for name in self._lookup_order():
            header, postings = self._looked_up_in(name, wanted, looked_up, still_voting)
            if limit is not None and sum(len(read[1]) for read in self._read.values()) > limit:
                self._read = {}
                return None
            if header is None or (prefetching and not droppable.any()):
                continue  # a prefetch counts only to drop keys: the settled read counts what is returned
            positions = position_of(postings["owner"])
            try:
                counted = np.isin(positions, self._owners_in(name, header))
            except _FoldedMeanwhile:
                if not prefetching:
                    raise
                droppable[:] = False  # counted again after :meth:`settle`; read every key meanwhile
                continue
            keys = uncertain_capped_keys(postings, ~counted & (positions < self.position), positions >= self.position)
            if len(keys):
                uncertain[name] = keys
            found.append(postings if counted.all() else postings[counted])
            if droppable.any():
                # Counted (live, before the position) audio postings: each one of a droppable key is
                # a posting the vote counts, so a key past the cap in them never votes.
                audio = postings["key"][counted & (postings["context"] != 0)]
                runs = np.flatnonzero(np.append(len(audio) > 0, audio[1:] != audio[:-1]))  # one search a run of a key
                np.add.at(capped_counted, np.searchsorted(wanted, audio[runs]), np.diff(np.append(runs, len(audio))))
                known_silent = droppable & (capped_counted >= key_posting_cap())
                if known_silent.any():
                    still_voting = still_voting & ~known_silent  # a new array: segments read keep theirs
                    droppable &= ~known_silent
                    looked_up = self._keys_still_voting(wanted, still_voting)
        # Earliest owners first: the merge with the shard's own postings then sorts runs (sort_postings).
        found.sort(key=lambda part: int(part["owner"].min()) if len(part) else -1)
        postings = np.concatenate(found) if found else np.empty(0, POSTING_DTYPE)
        # Checked against the settled state only: shards committed meanwhile may count what a
        # key's uncertain segment cannot.
        if uncertain and not prefetching:
            self._check_capped_counts(postings, uncertain)
        return postings

    def _keys_still_voting(self, wanted: np.ndarray, keep: np.ndarray) -> np.ndarray:
        """``wanted[keep]``, with its filter probe taken from ``wanted``'s (made once)."""
        self._full_probe = (wanted, self._probe_of(wanted))
        probe = self._full_probe[1].subset(keep)
        self._probe = (probe.keys, probe)
        return probe.keys

    def _probe_of(self, keys: np.ndarray) -> KeyProbe:
        for cached in (self._probe, self._full_probe):
            if cached is not None and cached[0] is keys:
                return cached[1]
        self._probe = (keys, KeyProbe(keys))
        return self._probe[1]

    def _looked_up_in(
        self, name: str, wanted: np.ndarray, keys: np.ndarray, keep: np.ndarray
    ) -> tuple[SegmentHeader | None, np.ndarray]:
        """The segment's header and postings of (at least) ``keys`` (``wanted[keep]``): those read
        before (by :meth:`prefetch`) and, for keys not looked up then, read now."""
        if name not in self._read:
            header, postings = self._segment_postings(name, keys)
            self._read[name] = (header, postings, keep)
            return header, postings
        header, postings, read = self._read[name]
        missing = keep & ~read
        if missing.any():
            probe = self._probe  # a lookup of a few keys: the probe of those still voting stays
            more_header, more = self._segment_postings(name, wanted[missing])
            self._probe = probe
            header = header if header is not None else more_header
            postings = np.concatenate([postings, more]) if len(more) else postings
            self._read[name] = (header, postings, read | missing)
        return header, postings

    def _check_capped_counts(self, postings: np.ndarray, uncertain: dict[str, np.ndarray]) -> None:
        """Raise :class:`IndexDamaged` (the stage repairs, which rebuilds the segment) where a
        segment's capped postings of a sampled audio key hold a stale shard's and the postings
        counted elsewhere do not already pass ``MAX_KEY_OCCURRENCES`` (the key never votes then,
        whatever that segment dropped): its count is not known, and it is never guessed."""
        capped = np.sort(postings["key"][capped_postings_mask(postings)])
        for name, keys in sorted(uncertain.items()):
            counts = np.searchsorted(capped, keys, "right") - np.searchsorted(capped, keys, "left")
            if (counts < key_posting_cap()).any():
                raise IndexDamaged(
                    f"segment {_segment_relative(name)} holds capped audio postings of a shard re-indexed since"
                )

    def _segment_postings(self, name: str, keys: np.ndarray) -> tuple[SegmentHeader | None, np.ndarray]:
        """The segment's header and its postings of ``keys`` (no header: its filter rules them all out)."""
        relative = _segment_relative(name)
        try:
            present, read = keys_maybe_in(self.data_root, _filter_relative(name), name, keys, self._probe_of(keys))
        except FileNotFoundError as exc:
            raise IndexDamaged(f"the filter of segment {relative} is missing") from exc
        except DamagedFilter as exc:
            raise IndexDamaged(str(exc)) from exc
        self.filter_bytes_read += read
        if len(present) == 0:
            if not self.data_root.exists(relative):
                raise IndexDamaged(f"segment {relative} is missing")
            return None, np.empty(0, POSTING_DTYPE)
        try:
            with self.data_root.fs.open(self.data_root.path(relative), "rb") as handle:
                counted = _CountingHandle(handle)
                header, postings = lookup_segment(counted, relative, present)
            self.segment_bytes_read += counted.bytes_read
            self._fences[name] = header.fences
            self._looked_up.append((name, present, sorted_unique(postings["key"])))
        except FileNotFoundError as exc:
            raise IndexDamaged(f"segment {relative} is missing") from exc
        except DamagedSegment as exc:
            raise IndexDamaged(str(exc)) from exc
        self.postings_read += len(postings)
        return header, postings

    @property
    def blocks_read(self) -> int:
        """Blocks read from the segments (counted when asked: a figure, not on a lookup's path)."""
        return sum(_blocks(self._fences[name], keys) for name, keys, _ in self._looked_up)

    @property
    def blocks_read_by_chance(self) -> int:
        """Of :attr:`blocks_read`, those read only for keys a filter let through that the segment
        does not hold (its false positives)."""
        return sum(
            _blocks(self._fences[name], keys) - _blocks(self._fences[name], found)
            for name, keys, found in self._looked_up
        )

    def _owners_in(self, name: str, header: SegmentHeader) -> np.ndarray:
        """The positions whose postings in segment ``name`` count: committed before the reader's
        position and mapped to this segment at the entries version it holds. A part whose count of
        rows mapped here equals the count of its shards the segment holds: every one it holds (a
        mapped row is always held); otherwise its rows, read, each checked against the header."""
        if name in self._owners:
            return self._owners[name][0]
        directory, relative = self._directory, _segment_relative(name)
        held = header.shards.positions
        held = held[held < self.position]
        held_parts, held_counts = np.unique(held // directory.part_rows, return_counts=True)
        held_count = dict(zip(held_parts.tolist(), held_counts.tolist(), strict=True))
        mapped = self._live[name]
        owners = []
        for part in sorted(set(held_count) | set(mapped)):
            if part not in directory.loaded and mapped.get(part, 0) == held_count.get(part, 0):
                first, end = np.searchsorted(held, [part * directory.part_rows, (part + 1) * directory.part_rows])
                owners.append(held[first:end])
                continue
            directory.load(part)
            chosen = []
            for row in directory.committed_in(part, self.position):
                if row.segment != name:
                    continue
                kept = header.shards.at(row.position)
                if kept is None or kept.entries_version != row.entries_version:
                    raise IndexDamaged(f"segment {relative} does not hold {row.shard_id}")
                chosen.append(row.position)
            owners.append(np.array(chosen, np.int64))
        valid = np.sort(np.concatenate(owners)) if owners else np.empty(0, np.int64)
        self._owners[name] = (valid, header.shards)
        return valid

    def _owner(self, position: int) -> tuple[str, str]:
        """(shard id, entries version) of a position some segment's postings counted for."""
        for valid, shards in self._owners.values():
            at = int(np.searchsorted(valid, position))
            if at < len(valid) and valid[at] == position:
                shard = shards.at(position)
                return shard.shard_id, shard.entries_version
        raise KeyError(position)

    def entries(self, owners: Sequence[int]) -> dict[int, IndexEntry]:
        by_position: dict[int, list[int]] = defaultdict(list)
        for owner in owners:
            by_position[int(position_of(owner))].append(owner)
        fetched: dict[int, IndexEntry] = {}
        self.entries_fetched += sum(len(wanted) for wanted in by_position.values())
        for position, wanted in sorted(by_position.items()):
            shard_id, version = self._owner(position)
            ranks = np.array([int(rank_of(owner)) for owner in wanted], np.int64)
            rows, read = read_entry_rows(self.data_root, shard_id, version, ranks)
            self.rows_read += read
            for owner, row in zip(wanted, rows, strict=True):
                fetched[owner] = _parse_entry(shard_id, row)
        return fetched


def _blocks(fences: np.ndarray, keys: np.ndarray) -> int:
    return sum(end - first for first, end in block_ranges(fences, keys))
