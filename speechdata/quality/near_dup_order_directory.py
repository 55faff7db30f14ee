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

import pyarrow as pa
import pyarrow.compute as pc

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
    ORDER_SCHEMA,
    IndexDamaged,
    IndexedShard,
    PartSummary,
    _row_of,
    _shards_of_table,
    summary_of,
)

WHOLE = 1 << 62
"""The part size of a directory holding every row (read from rows, or from a head without summaries)."""


@dataclass
class ShardDirectory(Sequence[IndexedShard]):
    """The shard list with only some parts' rows: those of the ``loaded`` parts (as Arrow
    ``tables``, the rows no record names, and ``rows``, the rows the records set, by position), the
    head's ``summaries`` for the others. As a sequence it is every row (read then: the whole-corpus
    API, :func:`read_state`'s rows)."""

    data_root: DataRoot
    log: _Log | None
    part_rows: int
    summaries: dict[int, PartSummary]
    rows: dict[int, IndexedShard]
    loaded: set[int] = field(default_factory=set)
    tables: list[pa.Table] = field(default_factory=list)
    _every_row: list[IndexedShard] | None = None
    _by_part: dict[int, list[IndexedShard]] | None = None

    @classmethod
    def of_rows(cls, data_root: DataRoot, shards: Sequence[IndexedShard], log: _Log | None = None) -> ShardDirectory:
        return cls(data_root, log, WHOLE, {}, {s.position: s for s in shards}, {0}, [], list(shards))

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
            self.tables.append(_read_part(self.data_root, name, self.log.head).select(ORDER_SCHEMA.names))
        self.loaded.add(part)
        self.summaries.pop(part, None)
        self._by_part = None

    def _committed_table(self, before: int | None) -> pa.Table:
        """The loaded parts' committed rows no record names (before ``before``), as Arrow columns."""
        table = pa.concat_tables(self.tables) if self.tables else ORDER_SCHEMA.empty_table()
        keep = pc.equal(table.column("state"), COMMITTED)
        if before is not None:
            keep = pc.and_(keep, pc.less(table.column("position"), before))
        return table.filter(keep)

    def _named(self, before: int | None) -> list[IndexedShard]:
        """The committed rows the records set (before ``before``)."""
        return [s for s in self.rows.values() if s.state == COMMITTED and (before is None or s.position < before)]

    def committed(self, before: int | None = None) -> list[IndexedShard]:
        """The loaded committed rows (before ``before``), by position (a row object each)."""
        shards = _shards_of_table(self._committed_table(before)) + self._named(before)
        return sorted(shards, key=lambda shard: shard.position)

    def committed_in(self, part: int, before: int) -> list[IndexedShard]:
        """The committed rows of loaded ``part`` before ``before``, by position."""
        if self._by_part is None:
            self._by_part = {}
            for shard in self.committed():
                self._by_part.setdefault(self.part_of(shard.position), []).append(shard)
        return [shard for shard in self._by_part.get(part, []) if shard.position < before]

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
        table = self._committed_table(before)
        unmapped = table.filter(pc.is_null(table.column("segment"))).to_pylist()
        unmapped += [_row_of(s) for s in self._named(before) if s.segment is None]
        if unmapped:
            raise IndexDamaged(
                f"{unmapped[0]['shard_id']} (position {unmapped[0]['position']}) is mapped to no segment"
            )
        parts = pc.divide(table.column("position"), self.part_rows)
        grouped = pa.table({"segment": table.column("segment"), "part": parts}).group_by(["segment", "part"])
        counted = grouped.aggregate([("part", "count")]).to_pydict()
        named = [(s.segment, self.part_of(s.position)) for s in self._named(before)]
        for name, part, count in [
            *zip(counted["segment"], counted["part"], counted["part_count"], strict=True),
            *((n, p, 1) for n, p in named),
        ]:
            found.setdefault(name, {})[part] = found.get(name, {}).get(part, 0) + count
        return found

    def lowest_positions(self) -> dict[str, int]:
        """Segment -> the lowest position of a committed row mapped to it (every segment listed)."""
        lowest: dict[str, int] = {}
        table = self._committed_table(None)
        table = table.filter(pc.is_valid(table.column("segment")))
        low = table.group_by("segment").aggregate([("position", "min")]).to_pydict()
        pairs = [
            *(
                (name, position)
                for summary in self.summaries.values()
                for name, (_, position) in summary.segments.items()
            ),
            *zip(low["segment"], low["position_min"], strict=True),
            *((s.segment, s.position) for s in self._named(None) if s.segment),
        ]
        for name, position in pairs:
            lowest[name] = min(lowest.get(name, position), position)
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
        listed = pc.sum(self._committed_table(before).column("utterances")).as_py() or 0
        return summarized + listed + sum(shard.utterances for shard in self._named(before))

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
        return ShardDirectory.of_rows(data_root, _all_applied(_snapshot_rows(data_root, log), log.changes), log)
    touched = {shard.position // head.part_rows for upserts, _ in log.changes for shard in upserts}
    touched |= {position // head.part_rows for _, removed in log.changes for position in removed}
    if position is not None:
        touched.add(position // head.part_rows)
    # Every change names only rows of the touched parts (a shard takes a new position only when no
    # part lists it: the parts' membership filters, :func:`.near_dup_order_log._row_in_snapshot`).
    # The rows the records name are replayed as objects; the others stay Arrow columns (as a fold does).
    named = pa.array(sorted({shard.shard_id for upserts, _ in log.changes for shard in upserts}), pa.string())
    dropped = pa.array(sorted({position for _, removed in log.changes for position in removed}), pa.int64())
    tables, replayed = [], []
    for part in sorted(touched):
        if part not in head.parts:
            continue
        table = _read_part(data_root, head.parts[part], head).select(ORDER_SCHEMA.names)
        is_named = pc.is_in(table.column("shard_id"), named)
        replayed += _shards_of_table(table.filter(is_named))
        tables.append(table.filter(pc.invert(pc.or_(is_named, pc.is_in(table.column("position"), dropped)))))
    rows = {shard.position: shard for shard in _all_applied(replayed, log.changes)}
    summaries = {part: summary for part, summary in head.summary.items() if part not in touched}
    return ShardDirectory(data_root, log, head.part_rows, summaries, rows, touched, tables)


def read_directory(data_root: DataRoot, position: int | None = None) -> ShardDirectory:
    """The shard list's head and records, the parts the records touch and, given ``position``, the
    part holding it; every other part as the head summarizes it."""
    return _retried(data_root, lambda log: _directory_of(data_root, log, position))


__all__ = ["ShardDirectory", "read_directory", "summary_of"]
