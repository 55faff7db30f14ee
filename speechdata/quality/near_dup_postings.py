"""Index keys of utterances and the immutable posting segments that map a key to the utterances holding it.

A near-duplicate check looks up only the keys of the new shard, never the whole corpus. Each
indexed utterance contributes *keys*, every one a uint64:

- its exact audio hash (the first 8 bytes of the SHA-256, salted): one key, frame 0;
- its transcript's 32 LSH band keys (:func:`speechdata.quality.fingerprint_text.band_keys`; the band
  number is mixed in), frame = the transcript's word count (so a lookup leaves out transcripts too
  short to compare before fetching them), when its transcript has a signature;
- its loudness envelope's 276 band-pair keys (:func:`~.fingerprint_envelope.envelope_band_pair_keys`:
  a shifted copy shares 3 or more, a chance hit must share two bands), frame 0, when it has an envelope;
- its *sampled* audio keys: the active sub-fingerprints whose mixed value falls in one of
  :data:`AUDIO_KEY_SAMPLING` classes, salted, frame = the frame it occurs at. The choice depends on
  the sub-fingerprint's value alone, so a copy keeps the same frames where its bits survived: on the
  planted set the audio-alone recall is what looking up every frame gave (docs/near-duplicates.md),
  with half the lookups.

A *posting* is ``(key, owner, frame)``; ``owner`` (:func:`owner_of`) orders every indexed utterance
by its shard's index position, then by its rank (``utt_id`` order) in the shard, so "earlier in the
index" is ``owner <`` and ties are broken the same way everywhere.

A *segment* (``index/near_duplicates/segments/L<level>-<digest>.seg``) holds postings sorted by key
in blocks of :data:`BLOCK_RECORDS` (:data:`POSTING_DTYPE`), with a fence (each block's first key) and a CRC-32 per block in a
header whose SHA-256 the file carries: a reader reads the header and then only the blocks that can
hold a queried key, and a torn or altered header or block is detected (:class:`DamagedSegment`).
The header lists the shards (position, shard id, entries version) whose postings the segment
holds, so the index can be rebuilt from whatever segments survive plus the shards' entries files.

A segment keeps, for each sampled audio key, only its earliest :func:`key_posting_cap` postings
(``MAX_KEY_OCCURRENCES + 1``, by owner then frame; :func:`cap_postings`): a key with more earlier
postings never votes, so a reader at any owner bound P either finds every posting before P in
the segment or learns there are more than ``MAX_KEY_OCCURRENCES`` (docs/near-duplicates.md,
"Capped audio keys"). Other keys are never capped. The format is unchanged: a capped segment is
a segment holding fewer postings.

Nothing here touches the order of the index or decides anything: :mod:`.near_dup_index` does.
"""

from __future__ import annotations

import hashlib
import json
import struct
import tempfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from speechdata.quality.fingerprint_envelope import LSH_BAND_PAIRS, envelope_band_pair_keys
from speechdata.quality.fingerprint_text import band_keys
from speechdata.quality.near_dup_held_shards import HeldShards

if TYPE_CHECKING:
    from speechdata.quality.near_dup_matching import UtteranceSignals

OWNER_RANK_BITS = 24
"""An owner is ``position << 24 | rank``: a shard holds at most 16 777 216 utterances."""
AUDIO_KEY_SAMPLING = 2
"""One sub-fingerprint value in two is a lookup key (chosen by value, so copies choose alike)."""
BLOCK_RECORDS = 256
"""Postings per block: the unit a lookup reads (7 KiB)."""
LOOKUP_BATCH_BYTES = 8 << 20
"""Block bytes a lookup gathers before searching them for its keys."""

_EXACT_SALT = np.uint64(0x243F6A8885A308D3)
_AUDIO_SALT = np.uint64(0x13198A2E03707344)
_ENVELOPE_SALT = np.uint64(0xA4093822299F31D0)
SEGMENT_FORMAT = 3
"""The keys a segment holds: 3 since envelope band pairs replaced single bands. A segment (and key
filter) of an earlier format is :class:`OutdatedSegment`: the next run rebuilds it from the entries."""
_MAGIC = b"NDSEG%02d\n" % SEGMENT_FORMAT
_PREAMBLE = struct.Struct("<8sQ32s")
"""magic, header length, SHA-256 of the header, fences and block CRCs."""

POSTING_DTYPE = np.dtype([("key", "<u8"), ("owner", "<i8"), ("frame", "<i4"), ("context", "<u8")])
"""One posting: 28 bytes on disk, little-endian. ``context``: for an audio key, the sub-fingerprints of
the two frames after it (:func:`neighbour_contexts`), which let a lookup tell a copy's hit from a
chance one without fetching the utterance; for an envelope band-pair key, the utterance's speech span
(:func:`span_context`: the float64's bits), which lets a lookup leave out a candidate the tempo
rule rules out before fetching it; 0 for other keys, and for envelope keys indexed before spans were
(read as "unknown": fetched)."""


class DamagedSegment(RuntimeError):
    """A segment whose header, length or a block's CRC does not match: torn, truncated or altered."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"near-duplicate index segment {path} is damaged ({detail}); the next run rebuilds it")
        self.path = path


class OutdatedSegment(DamagedSegment):
    """A segment written by an earlier :data:`SEGMENT_FORMAT` (other keys): repaired like a damaged one."""


def owner_of(position: int, rank: int) -> int:
    """The owner id of the utterance of rank ``rank`` (``utt_id`` order) in the shard at index ``position``."""
    return (position << OWNER_RANK_BITS) | rank


def position_of(owners: np.ndarray | int):
    """The index position of the shard holding each owner."""
    return owners >> OWNER_RANK_BITS


def rank_of(owners: np.ndarray | int):
    """The rank of each owner in its shard."""
    return owners & ((1 << OWNER_RANK_BITS) - 1)


_MIX_FIRST, _MIX_SECOND = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_UNMIX_FIRST, _UNMIX_SECOND = (np.uint64(pow(factor, -1, 1 << 64)) for factor in (_MIX_FIRST, _MIX_SECOND))


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fixed, well-spread uint64 of each value."""
    z = values.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX_FIRST)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX_SECOND)
        return z ^ (z >> np.uint64(31))


def _unmix(mixed: np.ndarray) -> np.ndarray:
    """The inverse of :func:`_mix` (each step of splitmix64's finaliser is a bijection of uint64)."""
    z = mixed.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = z ^ (z >> np.uint64(31)) ^ (z >> np.uint64(62))
        z = z * _UNMIX_SECOND
        z = z ^ (z >> np.uint64(27)) ^ (z >> np.uint64(54))
        z = z * _UNMIX_FIRST
        return z ^ (z >> np.uint64(30)) ^ (z >> np.uint64(60))


def exact_key(exact_hash: str) -> np.uint64:
    return np.uint64(int(exact_hash[:16], 16)) ^ _EXACT_SALT


def sampled_audio_keys(sub_fingerprints: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(keys, frames)`` of the active sub-fingerprints sampled as lookup keys, in frame order."""
    frames = np.flatnonzero(active)
    values = sub_fingerprints[frames].astype(np.uint64)
    sampled = _mix(values) % np.uint64(AUDIO_KEY_SAMPLING) == 0
    return _mix(values[sampled] ^ _AUDIO_SALT), frames[sampled].astype(np.int32)


def capped_postings_mask(postings: np.ndarray) -> np.ndarray:
    """Which postings are sampled audio postings, the only ones a segment caps: the key is a
    :func:`sampled_audio_keys` value (``_mix(v ^ salt)`` of a 32-bit sub-fingerprint ``v`` that the
    sampling chooses: ``_mix`` is inverted, so this is exact for every key) and the context is not 0.
    An envelope key is never such a value (its salt differs in the bits above its 38), and an exact
    or transcript posting has context 0, so no posting of another kind is ever capped; an audio
    posting whose two following frames are both 0 (context 0) is simply not capped."""
    values = _unmix(postings["key"]) ^ _AUDIO_SALT
    capped = (values >> np.uint64(32) == 0) & (postings["context"] != 0)
    capped[capped] = _mix(values[capped]) % np.uint64(AUDIO_KEY_SAMPLING) == 0
    return capped


def key_posting_cap() -> int:
    """The sampled audio postings a segment keeps per key: ``MAX_KEY_OCCURRENCES + 1`` (read when
    called, so the vote and the segments always agree)."""
    from speechdata.quality import near_dup_matching

    return near_dup_matching.MAX_KEY_OCCURRENCES + 1


def audio_only_keys(own: np.ndarray) -> np.ndarray:
    """The keys a shard's postings (:func:`index_keys`) hold as sampled audio keys only: every
    posting of the key is one :func:`capped_postings_mask` tells (a sampled audio value, context not
    0). Such a key is used only in the audio vote, which leaves it out once it has more than
    ``MAX_KEY_OCCURRENCES`` earlier postings, so a lookup may stop reading it then
    (:class:`~.near_dup_index_reader.IndexReader`). A key the shard also holds as another kind (a
    64-bit collision of a transcript or exact key with an audio value), or as an audio posting of
    context 0, is not one: its every posting is read. Sorted unique."""
    audio = capped_postings_mask(own)
    keys, others = sorted_unique(own["key"][audio]), sorted_unique(own["key"][~audio])
    return keys[~sorted_contains(others, keys)]


def sorted_contains(sorted_values: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Bool per element of ``values``: whether it is in ``sorted_values`` (sorted)."""
    if len(sorted_values) == 0:
        return np.zeros(len(values), bool)
    at = np.minimum(np.searchsorted(sorted_values, values), len(sorted_values) - 1)
    return sorted_values[at] == values


def _ranks_in_key(keys: np.ndarray) -> np.ndarray:
    """Each element's rank among the equal keys before it (``keys`` sorted)."""
    return np.arange(len(keys)) - np.searchsorted(keys, keys, side="left")


def cap_postings(postings: np.ndarray) -> np.ndarray:
    """``postings`` (sorted by key, owner, frame) with each sampled audio key's postings beyond its
    earliest :func:`key_posting_cap` left out; every other posting kept, in order."""
    capped = np.flatnonzero(capped_postings_mask(postings))
    beyond = capped[_ranks_in_key(postings["key"][capped]) >= key_posting_cap()]
    if len(beyond) == 0:
        return postings
    keep = np.ones(len(postings), bool)
    keep[beyond] = False
    return postings[keep]


def uncertain_capped_keys(postings: np.ndarray, stale: np.ndarray, after: np.ndarray | None = None) -> np.ndarray:
    """The sampled audio keys whose count before a bound one segment cannot give: ``postings`` (the
    segment's postings of some keys, sorted by key, owner, frame) hold exactly the cap of them, none
    at or after the bound (``after``, bool per posting; None: no bound), and some of those are
    ``stale`` (bool per posting: a shard the segment no longer counts for). Left out, the stale ones
    leave fewer than the cap, and the postings the cap dropped may have counted. (More than the cap:
    a segment written before the cap, which holds them all.) Sorted unique."""
    if not stale.any():  # the common case: nothing to tell, no key inverted
        return np.empty(0, np.uint64)
    capped = capped_postings_mask(postings)
    keys = postings["key"][capped]
    if len(keys) == 0 or not stale[capped].any():
        return np.empty(0, np.uint64)
    values, counts = np.unique(keys, return_counts=True)
    uncertain = np.intersect1d(values[counts == key_posting_cap()], keys[stale[capped]])
    if after is not None:
        uncertain = np.setdiff1d(uncertain, keys[after[capped]])
    return uncertain


def span_context(span_s: float) -> np.uint64:
    """The context of an envelope band-pair posting: the speech span's float64 bits (0: unknown)."""
    return np.array([span_s], "<f8").view("<u8")[0]


def span_of_context(context: int) -> float | None:
    """The speech span an envelope posting's context holds; None when unknown (0)."""
    return None if context == 0 else float(np.array([context], "<u8").view("<f8")[0])


def envelope_keys(envelope: np.ndarray) -> np.ndarray:
    """The envelope's band-pair keys (:func:`~.fingerprint_envelope.envelope_band_pair_keys`), salted."""
    return _mix(envelope_band_pair_keys(envelope) ^ _ENVELOPE_SALT)


def transcript_keys(signature: np.ndarray) -> np.ndarray:
    return band_keys(signature[None, :])[0].astype(np.uint64)


def neighbour_contexts(sub_fingerprints: np.ndarray, frames: np.ndarray) -> np.ndarray:
    """uint64 per frame: the sub-fingerprints of frames n+1 (low half) and n+2 (high half); where the
    utterance ends before n+2, the frame's own value stands in (such hits are rarely filtered right)."""
    values = sub_fingerprints.astype(np.uint64)
    last = len(values) - 1
    after = np.where(frames + 1 <= last, values[np.minimum(frames + 1, last)], values[frames])
    second = np.where(frames + 2 <= last, values[np.minimum(frames + 2, last)], values[frames])
    return after | (second << np.uint64(32))


def context_bit_errors(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Differing bits of two arrays of contexts (0-64 each). One popcount per element where NumPy has
    it (2.0+): unpacking every bit and summing them cost about 0.2 us a posting read."""
    differing = np.bitwise_xor(first.astype(np.uint64), second.astype(np.uint64))
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(differing)
    return np.unpackbits(differing.view(np.uint8).reshape(-1, 8), axis=1).sum(axis=1)


def utterance_keys(signals: UtteranceSignals) -> tuple[np.ndarray, np.ndarray, int]:
    """``(keys, frames, where the audio keys start)`` of one utterance: exact hash, transcript band
    keys, envelope band-pair keys, then sampled audio keys."""
    keys, frames = [], []
    if signals.exact_hash is not None:
        keys.append(np.array([exact_key(signals.exact_hash)], np.uint64))
        frames.append(np.zeros(1, np.int32))
    if signals.transcript_signature is not None:
        bands = transcript_keys(signals.transcript_signature)
        keys.append(bands)
        frames.append(np.full(len(bands), min(signals.transcript_words, 2**31 - 1), np.int32))
    if signals.shift is not None:
        envelope = envelope_keys(signals.shift.envelope)
        keys.append(envelope)
        frames.append(np.zeros(len(envelope), np.int32))
    audio_keys, audio_frames = sampled_audio_keys(signals.fingerprint.sub_fingerprints, signals.fingerprint.active)
    keys.append(audio_keys)
    frames.append(audio_frames)
    return np.concatenate(keys), np.concatenate(frames), sum(len(part) for part in keys[:-1])


def index_keys(signals: Sequence[UtteranceSignals], position: int) -> np.ndarray:
    """Every posting of one shard's utterances (``signals`` in ``utt_id`` order: rank = list
    index) at index ``position``, sorted by (key, owner, frame): the shard's level-0 segment."""
    parts = []
    for rank, utterance in enumerate(signals):
        keys, frames, audio = utterance_keys(utterance)
        part = np.zeros(len(keys), POSTING_DTYPE)
        part["key"], part["owner"], part["frame"] = keys, owner_of(position, rank), frames
        if audio < len(keys):
            part["context"][audio:] = neighbour_contexts(utterance.fingerprint.sub_fingerprints, frames[audio:])
        if utterance.shift is not None:  # its envelope keys come right before the audio keys
            part["context"][audio - LSH_BAND_PAIRS : audio] = span_context(utterance.shift.span_s)
        parts.append(part)
    return sort_postings(np.concatenate(parts) if parts else np.empty(0, POSTING_DTYPE))


def sort_postings(postings: np.ndarray) -> np.ndarray:
    """``postings`` sorted by (key, owner, frame), ties in their given order (a stable sort). Most
    arrays sorted come as runs already in (owner, frame) order within each key (a shard's postings
    built utterance by utterance; the postings a lookup found, segment by segment, earliest first):
    a stable sort by key alone is then the same order, and a contiguous key column sorts about 10x
    faster than the three-key ``np.lexsort`` (which stays for every other input)."""
    return postings[posting_order(postings)]


def posting_order(postings: np.ndarray) -> np.ndarray:
    """The permutation :func:`sort_postings` applies."""
    keys = np.ascontiguousarray(postings["key"])
    order = np.argsort(keys, kind="stable")
    owners, frames = postings["owner"][order], postings["frame"][order]
    same_key = keys[order[1:]] == keys[order[:-1]]
    earlier_owner = owners[1:] < owners[:-1]
    earlier_frame = (owners[1:] == owners[:-1]) & (frames[1:] < frames[:-1])
    if (same_key & (earlier_owner | earlier_frame)).any():
        order = np.lexsort((postings["frame"], postings["owner"], postings["key"]))
    return order


def merge_earlier_postings(earlier: np.ndarray, own: np.ndarray) -> np.ndarray:
    """``sort_postings(concatenate([earlier, own]))`` where ``own`` is sorted already (a shard's
    :func:`index_keys`) and every owner of ``earlier`` comes before every owner of ``own``: only
    ``earlier`` (the postings a lookup found, a few percent of ``own``) is sorted, and merged in by
    key, ahead of ``own``'s postings of the same key."""
    earlier = sort_postings(earlier)
    if len(earlier) == 0:
        return own
    at = np.searchsorted(np.ascontiguousarray(own["key"]), earlier["key"], side="left") + np.arange(len(earlier))
    merged = np.empty(len(earlier) + len(own), POSTING_DTYPE)
    from_own = np.ones(len(merged), bool)
    from_own[at] = False
    merged[at] = earlier
    merged[from_own] = own
    return merged


def merged_fields(earlier: np.ndarray, own: np.ndarray) -> dict[str, np.ndarray]:
    """Each field of :func:`merge_earlier_postings` as a contiguous array, placed field by field: no
    merged copy of the records is made, and each field is gathered and placed once."""
    order = posting_order(earlier)
    own_keys = np.ascontiguousarray(own["key"])
    earlier_keys = np.ascontiguousarray(earlier["key"])[order]
    # Each earlier posting goes before own's postings of its key; each of own's after those earlier.
    earlier_at = np.searchsorted(own_keys, earlier_keys, side="left") + np.arange(len(earlier))
    own_at = np.searchsorted(earlier_keys, own_keys, side="right") + np.arange(len(own))
    fields = {}
    for name in POSTING_DTYPE.names:
        field = np.empty(len(earlier) + len(own), POSTING_DTYPE[name])
        field[earlier_at] = earlier_keys if name == "key" else earlier[name][order]
        field[own_at] = own_keys if name == "key" else own[name]
        fields[name] = field
    return fields


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)`` of a 1-d integer array, by a sort. NumPy 2.3+ finds the unique values of
    an array through a hash table first: on a shard's 434 000 uint64 keys that took 0.27 s where a
    sort takes 3 ms (measured), and each new shard took it several times."""
    ordered = np.sort(values, kind="stable")
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def postings_for(postings: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The postings (sorted by key) whose key is one of ``keys``."""
    return _postings_for_unique(postings, sorted_unique(keys.astype(np.uint64)))


def _postings_for_unique(postings: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """:func:`postings_for` with ``wanted`` sorted, unique uint64."""
    if len(postings) == 0 or len(wanted) == 0:
        return postings[:0]
    at = np.searchsorted(wanted, postings["key"])
    at[at == len(wanted)] = 0
    return postings[wanted[at] == postings["key"]]


@dataclass(frozen=True)
class SegmentShard:
    """A shard whose postings a segment holds, at the entries version they were computed from."""

    position: int
    shard_id: str
    entries_version: str


@dataclass(frozen=True)
class SegmentHeader:
    level: int
    records: int
    shards: Sequence[SegmentShard]
    """Read lazily (:class:`~.near_dup_held_shards.HeldShards`): ``shards.positions`` costs no row each."""
    fences: np.ndarray
    block_crcs: np.ndarray
    body_offset: int


def segment_bytes(postings: np.ndarray, level: int, shards: Sequence[SegmentShard]) -> bytes:
    """The file of a segment holding ``postings`` (sorted by key, owner, frame), capped (:func:`cap_postings`)."""
    postings = cap_postings(postings)
    body = np.ascontiguousarray(postings, POSTING_DTYPE).tobytes()
    size = POSTING_DTYPE.itemsize
    blocks = [body[start : start + BLOCK_RECORDS * size] for start in range(0, len(body), BLOCK_RECORDS * size)]
    fences = np.ascontiguousarray(postings["key"][::BLOCK_RECORDS], "<u8").tobytes()
    crcs = np.array([zlib.crc32(block) for block in blocks], "<u4").tobytes()
    header = _header_bytes(level, len(postings), shards)
    described = header + fences + crcs
    return _PREAMBLE.pack(_MAGIC, len(header), hashlib.sha256(described).digest()) + described + body


def _header_bytes(level: int, records: int, shards: Sequence[SegmentShard]) -> bytes:
    return json.dumps(
        {
            "level": level,
            "records": records,
            "block_records": BLOCK_RECORDS,
            "shards": [[s.position, s.shard_id, s.entries_version] for s in shards],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


def segment_name(content: bytes, level: int) -> str:
    return f"L{level}-{hashlib.sha256(content).hexdigest()[:16]}.seg"


def read_segment_header(handle, path: str) -> SegmentHeader:
    """The header of the segment open as ``handle`` (a binary file), checked against its SHA-256."""
    preamble = handle.read(_PREAMBLE.size)
    if len(preamble) != _PREAMBLE.size:
        raise DamagedSegment(path, "shorter than its preamble")
    magic, header_length, digest = _PREAMBLE.unpack(preamble)
    if magic[:5] == _MAGIC[:5] and magic != _MAGIC:
        raise OutdatedSegment(path, f"format {magic[5:7].decode(errors='replace')}, not {SEGMENT_FORMAT:02d}")
    if magic != _MAGIC or header_length > 1 << 30:
        raise DamagedSegment(path, "not a segment file")
    header_bytes = handle.read(header_length)
    try:
        header, shards = HeldShards.of_header(header_bytes, SegmentShard)
        blocks = -(-int(header["records"]) // int(header["block_records"]))
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedSegment(path, f"header unreadable: {exc}") from None
    fences_crcs = handle.read(blocks * 12)
    if hashlib.sha256(header_bytes + fences_crcs).digest() != digest or int(header["block_records"]) != BLOCK_RECORDS:
        raise DamagedSegment(path, "header checksum mismatch")
    return SegmentHeader(
        level=int(header["level"]),
        records=int(header["records"]),
        shards=shards,
        fences=np.frombuffer(fences_crcs[: blocks * 8], "<u8"),
        block_crcs=np.frombuffer(fences_crcs[blocks * 8 :], "<u4"),
        body_offset=_PREAMBLE.size + header_length + blocks * 12,
    )


def read_blocks(handle, path: str, header: SegmentHeader, first: int, end: int) -> np.ndarray:
    return np.frombuffer(_checked_blocks(handle, path, header, first, end), POSTING_DTYPE)


def _checked_blocks(handle, path: str, header: SegmentHeader, first: int, end: int) -> bytes:
    """The bytes of blocks ``[first, end)``, each checked against its CRC."""
    size = POSTING_DTYPE.itemsize
    handle.seek(header.body_offset + first * BLOCK_RECORDS * size)
    last_records = min(end * BLOCK_RECORDS, header.records) - first * BLOCK_RECORDS
    data = handle.read(last_records * size)
    if len(data) != last_records * size:
        raise DamagedSegment(path, "truncated")
    for block in range(first, end):
        start = (block - first) * BLOCK_RECORDS * size
        if zlib.crc32(data[start : start + BLOCK_RECORDS * size]) != int(header.block_crcs[block]):
            raise DamagedSegment(path, f"block {block} checksum mismatch")
    return data


def block_ranges(fences: np.ndarray, keys: np.ndarray) -> list[tuple[int, int]]:
    """Merged ``[first, end)`` block ranges that can hold any of the sorted unique ``keys``."""
    if len(fences) == 0 or len(keys) == 0:
        return []
    # A key's postings start in the last block whose fence is <= key (or the block before, when
    # the key also begins that block's predecessor) and end in the last block whose fence is <= key.
    first = np.maximum(np.searchsorted(fences, keys, side="left") - 1, 0)
    end = np.searchsorted(fences, keys, side="right")
    present = end > first
    first, end = first[present], end[present]  # both ascending: keys are sorted
    if len(first) == 0:
        return []
    reach = np.maximum.accumulate(end)
    starts_new = np.ones(len(first), bool)
    starts_new[1:] = first[1:] > reach[:-1]
    group_starts = np.flatnonzero(starts_new)
    group_ends = np.append(group_starts[1:], len(first)) - 1
    return list(zip(first[group_starts].tolist(), reach[group_ends].tolist(), strict=True))


def lookup_segment(handle, path: str, keys: np.ndarray) -> tuple[SegmentHeader, np.ndarray]:
    """The segment's header and its postings whose key is in ``keys``, reading only the blocks
    that can hold them."""
    header = read_segment_header(handle, path)
    wanted = sorted_unique(keys.astype(np.uint64))
    found, pending, pending_bytes = [], [], 0
    # The blocks' bytes searched together, a few MB at a time: a key a filter let through by chance
    # reads a block of its own, and searching each block apart cost more than reading it.
    for first, end in block_ranges(header.fences, wanted):
        pending.append(_checked_blocks(handle, path, header, first, end))
        pending_bytes += len(pending[-1])
        if pending_bytes >= LOOKUP_BATCH_BYTES:
            found.append(_postings_for_unique(np.frombuffer(b"".join(pending), POSTING_DTYPE), wanted))
            pending, pending_bytes = [], 0
    if pending:
        found.append(_postings_for_unique(np.frombuffer(b"".join(pending), POSTING_DTYPE), wanted))
    return header, (np.concatenate(found) if found else np.empty(0, POSTING_DTYPE))


def read_all_postings(handle, path: str) -> tuple[SegmentHeader, np.ndarray]:
    """Every posting of a segment (for merging segments), every block checked."""
    header = read_segment_header(handle, path)
    blocks = len(header.fences)
    postings = read_blocks(handle, path, header, 0, blocks) if blocks else np.empty(0, POSTING_DTYPE)
    return header, postings


def verify_segment(handle, path: str, blocks_at_once: int = 4_096) -> SegmentHeader:
    """The header of a segment whose every block checks out (read a few MB at a time)."""
    header = read_segment_header(handle, path)
    for first in range(0, len(header.fences), blocks_at_once):
        read_blocks(handle, path, header, first, min(first + blocks_at_once, len(header.fences)))
    return header


class SegmentWriter:
    """A segment built from postings added in order, a few MB at a time: the body goes to a local
    temporary file block by block, the header is written once every block is known. The file is the
    one :func:`segment_bytes` gives for all the postings at once, byte for byte (capped as it caps:
    a key's postings may come in several pieces)."""

    def __init__(self, key_filter=None) -> None:
        """``key_filter``: a :class:`~.near_dup_filter.FilterBuilder` given every key written."""
        self.key_filter = key_filter
        # Closed by the last piece :meth:`finish` yields (or the garbage collector, if never read).
        self._body = tempfile.TemporaryFile()  # noqa: SIM115
        self._pending = np.empty(0, POSTING_DTYPE)
        self._fences: list[np.ndarray] = []
        self._crcs: list[int] = []
        self.records = 0
        self._last_key: int | None = None
        self._last_key_capped = 0
        """The last key added and how many of its sampled audio postings came so far."""

    def add(self, postings: np.ndarray) -> None:
        """Append ``postings`` (sorted by key, owner, frame, and after every posting added before)."""
        postings = self._capped(postings)
        combined = np.concatenate([self._pending, postings]) if len(self._pending) else postings
        full = len(combined) // BLOCK_RECORDS * BLOCK_RECORDS
        self._write(combined[:full])
        self._pending = combined[full:].copy()

    def _capped(self, postings: np.ndarray) -> np.ndarray:
        """:func:`cap_postings` of ``postings``, counting the postings of their first key added before."""
        capped = np.flatnonzero(capped_postings_mask(postings))
        if len(capped) == 0:
            return postings
        keys = postings["key"][capped]
        ranks = _ranks_in_key(keys)
        if self._last_key is not None:
            ranks[keys == np.uint64(self._last_key)] += self._last_key_capped
        self._last_key, self._last_key_capped = int(keys[-1]), int(ranks[-1]) + 1
        beyond = capped[ranks >= key_posting_cap()]
        if len(beyond) == 0:
            return postings
        keep = np.ones(len(postings), bool)
        keep[beyond] = False
        return postings[keep]

    def _write(self, postings: np.ndarray) -> None:
        if len(postings) == 0:
            return
        body = np.ascontiguousarray(postings, POSTING_DTYPE).tobytes()
        size = BLOCK_RECORDS * POSTING_DTYPE.itemsize
        self._crcs += [zlib.crc32(body[start : start + size]) for start in range(0, len(body), size)]
        self._fences.append(np.ascontiguousarray(postings["key"][::BLOCK_RECORDS], "<u8"))
        self._body.write(body)
        self.records += len(postings)
        if self.key_filter is not None:
            self.key_filter.add(postings["key"])

    def finish(self, level: int, shards: Sequence[SegmentShard]) -> tuple[str, Iterator[bytes]]:
        """The segment's name and its bytes, in pieces (the temporary file is closed after the last)."""
        self._write(self._pending)
        self._pending = np.empty(0, POSTING_DTYPE)
        fences = np.concatenate(self._fences).tobytes() if self._fences else b""
        crcs = np.array(self._crcs, "<u4").tobytes()
        header = _header_bytes(level, self.records, shards)
        described = header + fences + crcs
        head = _PREAMBLE.pack(_MAGIC, len(header), hashlib.sha256(described).digest()) + described
        digest = hashlib.sha256(head)
        for piece in self._body_pieces():
            digest.update(piece)
        return f"L{level}-{digest.hexdigest()[:16]}.seg", self._pieces(head)

    def _body_pieces(self) -> Iterator[bytes]:
        self._body.seek(0)
        while piece := self._body.read(1 << 22):
            yield piece

    def _pieces(self, head: bytes) -> Iterator[bytes]:
        try:
            yield head
            yield from self._body_pieces()
        finally:
            self._body.close()


class UncertainCappedSegment(DamagedSegment):
    """A segment holding the cap of a sampled audio key's postings, some of a shard it no longer
    counts for (re-indexed since it was written): the live postings the cap dropped are not in it,
    so it is rebuilt from its members' entries files like a damaged segment."""


def merge_segments(
    handles: Sequence[tuple[object, str, SegmentHeader, np.ndarray]], writer: SegmentWriter, chunk: int
) -> None:
    """Add to ``writer``, in key order, the postings of each segment (open ``handle``, its path, its
    checked header, the positions to keep from it) about ``chunk`` postings at a time: the key space
    is cut at the segments' fences, so no more is held at once (and a key's postings are in one
    chunk). Raises :class:`UncertainCappedSegment` where an input's capped postings of a key hold
    a position not kept: the merged segment could not keep that key's earliest postings."""
    fences = sorted_unique(np.concatenate([header.fences for _, _, header, _ in handles]))
    stride = max(chunk // BLOCK_RECORDS, 1)
    bounds = [None, *fences[stride::stride].tolist(), None]
    for low, high in zip(bounds[:-1], bounds[1:], strict=True):
        parts = []
        for handle, path, header, positions in handles:
            if len(header.fences) == 0:
                continue
            first = 0 if low is None else max(int(np.searchsorted(header.fences, np.uint64(low), "left")) - 1, 0)
            end = len(header.fences) if high is None else int(np.searchsorted(header.fences, np.uint64(high), "left"))
            if end <= first:
                continue
            postings = read_blocks(handle, path, header, first, end)
            inside = np.ones(len(postings), bool)
            if low is not None:
                inside &= postings["key"] >= np.uint64(low)
            if high is not None:
                inside &= postings["key"] < np.uint64(high)
            postings = postings[inside]
            kept = np.isin(position_of(postings["owner"]), positions)
            if len(uncertain_capped_keys(postings, ~kept)):
                raise UncertainCappedSegment(path, "a capped audio key holds postings of a shard re-indexed since")
            parts.append(postings[kept])
        if parts:
            writer.add(sort_postings(np.concatenate(parts)))
