"""The near-duplicate index's shard list, its rows: :class:`IndexedShard` (a row of the order),
:class:`Reservation`, the index's errors, and a change applied to rows. Stored and read by
:mod:`.near_dup_order_log`, written by :mod:`.near_dup_order_fold`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa

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


@dataclass(frozen=True)
class IndexedShard:
    """A row of the shard list."""

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


Change = tuple[list[IndexedShard], list[int]]
"""A record: (rows set, positions dropped)."""


def _shard_of(row: dict) -> IndexedShard:
    return IndexedShard(
        position=row["position"],
        shard_id=row["shard_id"],
        entries_version=row["entries_version"],
        utterances=row["utterances"],
        state=row.get("state") or COMMITTED,
        segment=row.get("segment"),
        reservation=row.get("reservation"),
    )


def _shards_of_table(table: pa.Table) -> list[IndexedShard]:
    """The table's rows, column by column (a tenth of the time of a dictionary per row); a table of
    the earlier layout may lack the state, segment and reservation columns."""
    names = table.column_names
    columns = [
        table.column(name).to_pylist() if name in names else [COMMITTED if name == "state" else None] * table.num_rows
        for name in ORDER_SCHEMA.names
    ]
    columns[2] = [state or COMMITTED for state in columns[2]]
    return [IndexedShard(p, i, v, u, st, sg, r) for p, i, st, v, u, sg, r in zip(*columns, strict=True)]


def _row_of(shard: IndexedShard) -> dict:
    return {field.name: getattr(shard, field.name) for field in ORDER_SCHEMA}


def _applied(
    shards: Sequence[IndexedShard], upserts: Sequence[IndexedShard], removed: Sequence[int]
) -> list[IndexedShard]:
    """``shards`` with each of ``upserts`` replacing its shard's row and the rows at ``removed`` gone."""
    return _all_applied(shards, [(list(upserts), list(removed))])


def _all_applied(shards: Sequence[IndexedShard], changes: Sequence[Change]) -> list[IndexedShard]:
    """``shards`` with every change applied in sequence (each row set replaces its shard's row, each
    position dropped loses its row), by position: one dictionary update per row a record names, not
    a pass over every row per record."""
    latest = {}
    for shard in sorted(shards, key=lambda shard: shard.position):
        # A shard listed twice (an index written before parts had membership filters): the later.
        latest[shard.shard_id] = shard
    by_position = {shard.position: shard for shard in latest.values()}
    position_of = {shard.shard_id: shard.position for shard in latest.values()}
    for upserts, removed in changes:
        for position in removed:
            gone = by_position.pop(position, None)
            if gone is not None:
                del position_of[gone.shard_id]
        for shard in upserts:
            earlier = position_of.pop(shard.shard_id, None)
            if earlier is not None:
                del by_position[earlier]
            by_position[shard.position] = shard
            position_of[shard.shard_id] = shard.position
    return [by_position[position] for position in sorted(by_position)]


NO_SEGMENT = ""
"""A part summary's name for committed rows mapped to no segment (damage: the reader reports it)."""


@dataclass(frozen=True)
class PartSummary:
    """What a reader needs of a part without its rows: the committed utterances it lists, and per
    segment its committed rows mapped there (how many, the lowest position)."""

    utterances: int
    segments: dict[str, tuple[int, int]]

    def body(self) -> dict:
        return {"utterances": self.utterances, "segments": {name: list(v) for name, v in sorted(self.segments.items())}}

    @classmethod
    def of_body(cls, body: dict) -> PartSummary:
        return cls(int(body["utterances"]), {name: (int(c), int(m)) for name, (c, m) in body["segments"].items()})


def summary_of(shards: Sequence[IndexedShard]) -> PartSummary:
    """The summary of a part holding ``shards``."""
    utterances, segments = 0, {}
    for shard in shards:
        if shard.state != COMMITTED:
            continue
        utterances += shard.utterances
        name = shard.segment or NO_SEGMENT
        count, lowest = segments.get(name, (0, shard.position))
        segments[name] = (count + 1, min(lowest, shard.position))
    return PartSummary(utterances, segments)


class _FoldedMeanwhile(Exception):
    """Something the head or the listing named was gone when read: a writer folded it meanwhile.
    ``args``: (what was missed, the damage it is when missed twice)."""
