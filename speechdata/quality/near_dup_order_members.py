"""Which shards each part of the near-duplicate shard list lists: a Bloom filter of its shard ids
(every state) per part, all of a snapshot's filters in one file beside its parts
(``shard_list/members/<sha256>.bin``, named by its content and by the head; written with the parts,
before the head, so a filter never misses a shard its part lists). Read only by a shard that has no
commit record (a new shard, or one whose record was lost or torn) to find its row without reading
every part: a "no" is exact, a "maybe" reads that part (docs/near-duplicates.md, "Re-listing")."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_order_rows import IndexDamaged, _FoldedMeanwhile

MEMBERS = f"{layout.NEAR_DUPLICATES_INDEX}/shard_list/members"
MEMBER_BITS_PER_ROW = 16
"""A part's filter: 16 bits per row it may hold (4 KiB a part of 2 048) and :data:`MEMBER_HASHES`
probes: about one false "maybe" in 2 000 full parts asked."""
MEMBER_HASHES = 11


def filter_size(part_rows: int) -> int:
    """Bytes of each part's filter (every part the same: the file is the filters in part order)."""
    return max(64, MEMBER_BITS_PER_ROW * part_rows // 8)


def _probes(shard_ids: Sequence[str], bits: int) -> np.ndarray:
    """Each shard's filter bits (a row each): double hashing of its id's 128-bit BLAKE2b digest."""
    digests = b"".join(hashlib.blake2b(shard_id.encode(), digest_size=16).digest() for shard_id in shard_ids)
    pairs = np.frombuffer(digests, dtype="<u8").reshape(-1, 2)
    steps = np.arange(MEMBER_HASHES, dtype=np.uint64)
    return ((pairs[:, :1] + steps * (pairs[:, 1:] | np.uint64(1))) % np.uint64(bits)).astype(np.int64)


def members_filter(shard_ids: Sequence[str], part_rows: int) -> bytes:
    """The filter of a part listing ``shard_ids``."""
    flags = np.zeros(filter_size(part_rows) * 8, dtype=bool)
    if len(shard_ids):
        flags[_probes(shard_ids, len(flags)).ravel()] = True
    return np.packbits(flags, bitorder="little").tobytes()


def write_members(data_root: DataRoot, filters: Mapping[int, bytes]) -> str | None:
    """Write the filters of a snapshot's parts (by part number) as one file; its name (None: no part)."""
    if not filters:
        return None
    content = b"".join(filters[part] for part in sorted(filters))
    name = f"{hashlib.sha256(content).hexdigest()[:16]}.bin"
    data_root.write_bytes(f"{MEMBERS}/{name}", content)  # again when present: it may be a damaged one
    return name


def read_members(data_root: DataRoot, name: str, parts: Iterable[int], part_rows: int) -> dict[int, bytes]:
    """The filters of ``parts`` (the head's, in order) from the file the head names. Gone: a fold
    replaced it since the head was read (:class:`_FoldedMeanwhile`); torn: :class:`IndexDamaged`."""
    relative = f"{MEMBERS}/{name}"
    try:
        content = data_root.fs.cat_file(data_root.path(relative))
    except FileNotFoundError:
        raise _FoldedMeanwhile((name,), f"the shard list's membership filters {relative} are missing") from None
    parts, size = sorted(parts), filter_size(part_rows)
    if hashlib.sha256(content).hexdigest()[:16] != name.removesuffix(".bin") or len(content) != size * len(parts):
        raise IndexDamaged(f"the shard list's membership filters {relative} fail their checksum (torn or damaged)")
    return {part: content[n * size : (n + 1) * size] for n, part in enumerate(parts)}


_ANSWERS: dict[tuple[str, str], list[int]] = {}
"""(filters file, shard id) -> the filters (by their order in the file: the n-th is the head's n-th
part) that may list the shard. A filters file is named by its
content, so an answer stays true for as long as a head names that file: a reservation looks its
shard up before taking the index lock (:func:`.near_dup_index_order.reserve_position`) and, the head
unchanged, reads no filter under it."""
_ANSWERS_KEPT = 256


def parts_may_list(data_root: DataRoot, head, shard_id: str) -> list[str]:
    """The files of the head's parts that may list ``shard_id`` (every part when the head names no
    filters: one written before them, read whole until its first fold)."""
    if head.members is None:
        return list(head.parts.values())
    key = (head.members, shard_id)
    if key not in _ANSWERS:
        filters = read_members(data_root, head.members, head.parts, head.part_rows)
        bits = _probes([shard_id], filter_size(head.part_rows) * 8)[0].tolist()
        if len(_ANSWERS) >= _ANSWERS_KEPT:
            _ANSWERS.clear()
        _ANSWERS[key] = [
            n
            for n, members in enumerate(filters[part] for part in sorted(filters))
            if all(members[bit >> 3] >> (bit & 7) & 1 for bit in bits)
        ]
    parts = sorted(head.parts)
    return [head.parts[parts[n]] for n in _ANSWERS[key]]


def remove_unnamed_members(data_root: DataRoot, named: str | None) -> None:
    """Delete the filter files a committed head no longer names (a fold's or a killed fold's)."""
    for path in data_root.glob(f"{MEMBERS}/*.bin"):
        if path.rsplit("/", 1)[-1] != named:
            with contextlib.suppress(FileNotFoundError):
                data_root.fs.rm_file(path)
