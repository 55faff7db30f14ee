"""The near-duplicate index's shard list as a new shard's run reads it: the head (with each part's
summary), the records after it and only the parts those records touch or the run asks for. What a
reader needs of every other part (its committed utterances, the segments its rows map to and how
many) is in the head's summary of it (docs/near-duplicates.md, "What a new shard reads of the shard
list"). A whole-corpus pass reads every row (:func:`.near_dup_order_log.read_state`).

A part no record touches is the same file the head names until a fold replaces it; read after such
a fold it is gone (:class:`._FoldedMeanwhile`): the caller reads the directory again."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_order_log import (
    _all_applied,
    _FoldedMeanwhile,
    _Log,
    _read_part,
    _retried,
    _snapshot_rows,
    read_state,
)
from speechdata.quality.near_dup_order_rows import (
    COMMITTED,
    NO_SEGMENT,
    IndexDamaged,
    IndexedShard,
    PartSummary,
    _shards_of_table,
    summary_of,
)

WHOLE = 1 << 62
"""The part size of a directory holding every row (read from rows, or from a head without summaries)."""


@dataclass
class ShardDirectory(Sequence[IndexedShard]):
    """The shard list with only some parts' rows: ``rows`` (by position) for the ``loaded`` parts,
    the head's ``summaries`` for the others. As a sequence it is every row (read then: the
    whole-corpus API, :func:`read_state`'s rows)."""

    data_root: DataRoot
    log: _Log | None
    part_rows: int
    summaries: dict[int, PartSummary]
    rows: dict[int, IndexedShard]
    loaded: set[int] = field(default_factory=set)
    _every_row: list[IndexedShard] | None = None
    _by_part: dict[int, list[IndexedShard]] | None = None

    @classmethod
    def of_rows(cls, data_root: DataRoot, shards: Sequence[IndexedShard]) -> ShardDirectory:
        return cls(data_root, None, WHOLE, {}, {s.position: s for s in shards}, {0}, list(shards))

    # What an order record needs of what it was read against (:func:`.near_dup_order_fold._append`).
    @property
    def through(self) -> int:
        return self.log.through

    @property
    def last(self) -> int:
        return self.log.last

    @property
    def legacy(self) -> bool:
        return self.log.head is None and self.log.legacy is not None

    def part_of(self, position: int) -> int:
        return position // self.part_rows

    def load(self, part: int) -> None:
        """Read ``part``'s rows (no record touches it: they are the part's file as the head names it).
        Raises :class:`._FoldedMeanwhile` when a fold replaced it since."""
        if part in self.loaded:
            return
        name = self.log.head.parts.get(part) if self.log is not None and self.log.head is not None else None
        if name is not None:
            for shard in _shards_of_table(_read_part(self.data_root, name, self.log.head)):
                self.rows[shard.position] = shard
        self.loaded.add(part)
        self.summaries.pop(part, None)
        self._by_part = None

    def committed_in(self, part: int, before: int) -> list[IndexedShard]:
        """The committed rows of loaded ``part`` before ``before``, by position."""
        if self._by_part is None:
            self._by_part = {}
            for shard in self.committed():
                self._by_part.setdefault(self.part_of(shard.position), []).append(shard)
        return [shard for shard in self._by_part.get(part, []) if shard.position < before]

    def committed(self, before: int | None = None) -> Iterator[IndexedShard]:
        """The loaded committed rows (before ``before``), by position."""
        for position in sorted(self.rows):
            shard = self.rows[position]
            if shard.state == COMMITTED and (before is None or position < before):
                yield shard

    def segments(self, before: int | None = None) -> dict[str, dict[int, int]]:
        """Segment -> part -> committed rows before ``before`` mapped to it (the part of ``before``
        is loaded first). A committed row mapped to no segment is damage (:class:`IndexDamaged`)."""
        if before is not None:
            self.load(self.part_of(before))
        found: dict[str, dict[int, int]] = {}
        for part, summary in sorted(self.summaries.items()):
            if before is not None and part > self.part_of(before):
                continue
            if NO_SEGMENT in summary.segments:
                self.load(part)
                continue
            for name, (count, _) in summary.segments.items():
                found.setdefault(name, {})[part] = count
        for shard in self.committed(before):
            if shard.segment is None:
                raise IndexDamaged(f"{shard.shard_id} (position {shard.position}) is mapped to no segment")
            by_part = found.setdefault(shard.segment, {})
            by_part[self.part_of(shard.position)] = by_part.get(self.part_of(shard.position), 0) + 1
        return found

    def lowest_positions(self) -> dict[str, int]:
        """Segment -> the lowest position of a committed row mapped to it (every segment listed)."""
        lowest: dict[str, int] = {}
        for summary in self.summaries.values():
            for name, (_, position) in summary.segments.items():
                lowest[name] = min(lowest.get(name, position), position)
        for shard in self.committed():
            if shard.segment:
                lowest[shard.segment] = min(lowest.get(shard.segment, shard.position), shard.position)
        lowest.pop(NO_SEGMENT, None)
        return lowest

    def load_parts_of(self, segments: set[str]) -> None:
        """Read every part whose summary names one of ``segments``."""
        for part, summary in sorted(self.summaries.items()):
            if segments & set(summary.segments):
                self.load(part)

    def utterances(self, before: int) -> int:
        """The committed utterances before position ``before``."""
        self.load(self.part_of(before))
        summarized = sum(s.utterances for part, s in self.summaries.items() if part < self.part_of(before))
        return summarized + sum(shard.utterances for shard in self.committed(before))

    # The whole-corpus API: every row, as :func:`read_state` gives them.
    def _all(self) -> list[IndexedShard]:
        if self._every_row is None:
            try:
                self._every_row = _all_applied(_snapshot_rows(self.data_root, self.log), self.log.changes)
            except _FoldedMeanwhile:
                self._every_row = read_state(self.data_root)
        return self._every_row

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, index):
        return self._all()[index]

    def __iter__(self) -> Iterator[IndexedShard]:
        return iter(self._all())


def _directory_of(data_root: DataRoot, log: _Log, position: int | None) -> ShardDirectory:
    head = log.head
    if head is None or head.summary is None:
        shards = _all_applied(_snapshot_rows(data_root, log), log.changes)
        directory = ShardDirectory.of_rows(data_root, shards)
        directory.log = log
        return directory
    touched = {shard.position // head.part_rows for upserts, _ in log.changes for shard in upserts}
    touched |= {position // head.part_rows for _, removed in log.changes for position in removed}
    if position is not None:
        touched.add(position // head.part_rows)
    rows = [
        shard
        for part in sorted(touched)
        if part in head.parts
        for shard in _shards_of_table(_read_part(data_root, head.parts[part], head))
    ]
    # Every change names only rows of the touched parts (a shard taking a new position drops its
    # earlier row in the same record: :func:`.near_dup_index_order.reserve_position`).
    applied = _all_applied(rows, log.changes)
    summaries = {part: summary for part, summary in head.summary.items() if part not in touched}
    return ShardDirectory(data_root, log, head.part_rows, summaries, {s.position: s for s in applied}, touched)


def read_directory(data_root: DataRoot, position: int | None = None) -> ShardDirectory:
    """The shard list's head and records, the parts the records touch and, given ``position``, the
    part holding it; every other part as the head summarizes it."""
    return _retried(data_root, lambda log: _directory_of(data_root, log, position))


__all__ = ["ShardDirectory", "read_directory", "summary_of"]
