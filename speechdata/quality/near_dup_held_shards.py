"""The shards a posting segment's header lists, read lazily: a merged segment of the upper levels
lists tens of thousands (32 768 at level 5), and one Python object per shard cost about 1 s per
such header on this machine. A lookup needs their positions (one array, parsed from the header's
canonical JSON with NumPy) and the shard id and entries version of the few shards its postings
name; repair and compaction iterate them all (parsed whole then, once).

The header is written as canonical JSON (sorted keys, no spaces), so its ``shards`` list is its
last member, ``[[position,"shard_id","entries_version"],...]``, positions ascending; shard ids and
versions are keys (no quote, bracket or comma: :mod:`speechdata.io.keys`). Anything else is parsed
as JSON whole."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from speechdata.quality.near_dup_postings import SegmentShard

SHARDS_MEMBER = b',"shards":'


class HeldShards(Sequence["SegmentShard"]):
    """A segment header's shards (ascending positions): ``positions`` without a row each,
    :meth:`at` one shard, iteration every one."""

    def __init__(self, raw: bytes, make: type):
        self._raw = raw
        self._make = make

    @classmethod
    def of_header(cls, header: bytes, make: type) -> tuple[dict, HeldShards]:
        """The header's other members and its shards; ``make``: :class:`SegmentShard`."""
        at = header.rfind(SHARDS_MEMBER)
        if at < 0 or not header.endswith(b"]}"):
            body = json.loads(header)
            return body, cls(json.dumps(body.get("shards", []), separators=(",", ":")).encode(), make)
        return json.loads(header[:at] + b"}"), cls(header[at + len(SHARDS_MEMBER) : -1], make)

    @cached_property
    def _starts(self) -> np.ndarray:
        """Offset of each shard's ``[`` in the list."""
        text = np.frombuffer(self._raw, np.uint8)
        if len(text) < 2:
            return np.empty(0, np.int64)
        opening = np.flatnonzero(text == ord("["))
        return opening[1:] if len(opening) and opening[0] == 0 else opening

    @cached_property
    def positions(self) -> np.ndarray:
        """Each shard's position (int64, ascending)."""
        text = np.frombuffer(self._raw, np.uint8)
        starts = self._starts + 1
        commas = np.flatnonzero(text == ord(","))
        if len(commas) != max(3 * len(starts) - 1, 0):
            return np.array([shard.position for shard in self._every], np.int64)
        ends = commas[np.searchsorted(commas, starts)] if len(starts) else starts
        lengths = ends - starts
        positions = np.zeros(len(starts), np.int64)
        for digit in range(int(lengths.max()) if len(lengths) else 0):
            more = lengths > digit
            values = text[starts[more] + digit].astype(np.int64) - ord("0")
            if ((values < 0) | (values > 9)).any():
                return np.array([shard.position for shard in self._every], np.int64)
            positions[more] = positions[more] * 10 + values
        if len(positions) > 1 and not (np.diff(positions) > 0).all():
            return np.array([shard.position for shard in self._every], np.int64)
        return positions

    def at(self, position: int) -> SegmentShard | None:
        """The shard the header lists at ``position``, or None."""
        index = int(np.searchsorted(self.positions, position))
        if index == len(self.positions) or self.positions[index] != position:
            return None
        if "_every" in self.__dict__:
            return self._every[index]
        start = int(self._starts[index])
        end = self._raw.index(b"]", start)
        p, shard_id, version = json.loads(self._raw[start : end + 1])
        return self._make(int(p), str(shard_id), str(version))

    @cached_property
    def _every(self) -> tuple[SegmentShard, ...]:
        return tuple(self._make(int(p), str(s), str(v)) for p, s, v in json.loads(self._raw))

    def __len__(self) -> int:
        return len(self._every)

    def __getitem__(self, index):
        return self._every[index]

    def __iter__(self) -> Iterator[SegmentShard]:
        return iter(self._every)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    __hash__ = None  # compared by content, like the tuple it stands for

    def __repr__(self) -> str:
        return f"HeldShards({len(self._starts)} shards)"
