"""Key filters beside the posting segments: a key a segment does not hold costs no block read.

Why: a new shard looks up about 200 000 keys. Without a filter each key reads the block that could
hold it in every live segment, although most keys are in none (at 1 000 hours that was about 2 GB
read per new shard, so the cost per shard grew with the corpus). A filter answers "not here" for
almost every absent key from one 64-byte line; only the keys that pass read a block.

A filter (``index/near_duplicates/segments/<segment>.filter``) is a blocked Bloom filter: a 64-byte
header, then lines of 64 bytes, each seven words of bits (448) and one check word. A key sets
``hashes`` bits in the one line its hash picks; the header holds the line count and ``hashes``, so
filters of every sizing are read alike. New filters: :data:`HASHES` bits per key, and
:func:`bits_per_key` bits of lines per posting of the segment, 20 in a small segment (about 0.05 %
false positives) and 12 in a large one (about 0.55 %): see :func:`bits_per_key` for why. Filters
written before (12 bits, 6 hashes: about 0.6 %) are read as they are. The check word of line ``i`` is a hash of ``i`` and its
bits, so a torn, truncated, shifted or altered line is caught when it is read
(:class:`DamagedFilter`), and the header names the segment the filter was built from. A present key
is always found: a filter only ever sets bits.

A lookup reads only the lines of the queried keys: on a local data root the lines' own pages, read
in line order (no memory map: a mapped page counts in the process's resident memory, and a new
shard's keys touch most pages of a large filter), the whole file on an object store
(:func:`keys_maybe_in`). Nothing is cached between lookups.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Iterator

import numpy as np

LINE_WORDS = 8
"""uint64 words per line: :data:`BIT_WORDS` of bits, then the line's check word."""
BIT_WORDS = 7
LINE_BITS = BIT_WORDS * 64
LINE_BYTES = LINE_WORDS * 8
HASHES = 7
"""Bits a new filter sets per key: seven 9-bit bit numbers of one 64-bit hash (the most it holds).
Measured on 2 M random keys, 7 against 6 hashes: 0.55 % false positives against 0.59 % at 12 bits per
key, 0.047 % against 0.068 % at 20 (docs/performance.md)."""
MAX_HASHES = 7
"""The most bits a filter's header may name (:data:`HASHES` of filters written before: 6)."""
BITS_PER_KEY = 12
"""Filter bits per posting in a large segment (distinct keys are fewer: the rate only falls)."""
SMALL_SEGMENT_BITS_PER_KEY = 20
"""Filter bits per posting in a segment of at most :data:`SMALL_SEGMENT_RECORDS` postings."""
SMALL_SEGMENT_RECORDS = 1 << 23
"""About 19 shards of 1 000 utterances (434 000 postings each): levels 0 and 1 of the index."""
ADD_CHUNK = 1 << 20
"""Keys set at once while a filter is built (bounds the memory of a merge's filter)."""
LOOKUP_CHUNK = 1 << 16
"""Keys tested at once by a lookup (bounds its memory whatever the shard's size)."""

_MAGIC = b"NDFLT02\n"
"""02: the filter of a segment of ``near_dup_postings.SEGMENT_FORMAT`` 3 (envelope band pairs). A
lookup tests a filter before it reads its segment's header, so the filter says the format too."""
_HEADER = struct.Struct("<8sQI4x24sQQ")
"""magic, lines, hashes, the segment's name (padded), reserved, the header's check word: 64 bytes."""
_FILTER_SALT = np.uint64(0x3C6EF372FE94F82B)
_CHECK_SALT = np.uint64(0x510E527FADE682D1)


class DamagedFilter(RuntimeError):
    """A filter whose header, length or a line's check word does not match: torn, truncated or altered."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"near-duplicate index filter {path} is damaged ({detail}); the next run rebuilds it")
        self.path = path


def filter_name(segment: str) -> str:
    return f"{segment}.filter"


def _mix(values: np.ndarray) -> np.ndarray:
    z = values.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def bits_per_key(records: int) -> int:
    """Filter bits per posting for a segment of ``records`` postings. A new shard's lookup tests
    its ~434 000 keys against every live segment; each key a filter lets through by chance costs a
    7 KiB block read (and its search), each filter line a key picks a 64-byte line, read in pages.
    A small segment's filter is read whole, and a few MB: 20 bits per key instead of 12 add
    0.43 MB per 1 000-utterance shard it holds and save ~2 400 block reads (17 MB) per lookup,
    the largest block term at 1 000 h (levels 0 and 1: 11 of its 15 live segments). A large
    segment's filter is read page by page where the keys land, at least the ~434 000 keys' pages
    (1.7 GB), so more bits per key make it larger and its pages more than the blocks they save
    (computed per level: docs/performance.md)."""
    return SMALL_SEGMENT_BITS_PER_KEY if records <= SMALL_SEGMENT_RECORDS else BITS_PER_KEY


def line_count(records: int) -> int:
    return max(1, -(-records * bits_per_key(records) // LINE_BITS))


def _line_of_hashed(hashed: np.ndarray, lines: int) -> np.ndarray:
    return (((hashed >> np.uint64(32)) * np.uint64(lines)) >> np.uint64(32)).astype(np.int64)


def _lines_and_bits(keys: np.ndarray, lines: int, hashes: int) -> tuple[np.ndarray, np.ndarray]:
    """Each key's line, and its ``hashes`` bit numbers within the line (shape ``(len, hashes)``, uint16)."""
    hashed = _mix(keys.astype(np.uint64) ^ _FILTER_SALT)
    return _line_of_hashed(hashed, lines), _bits_of_hashed(hashed, hashes)


def _bits_of_hashed(hashed: np.ndarray, hashes: int) -> np.ndarray:
    """A key's first ``hashes`` bit numbers: the j-th is the same whatever ``hashes`` is, so a filter
    set with fewer bits is tested with the first of them."""
    spread = _mix(hashed)
    bits = np.empty((len(hashed), hashes), np.uint16)  # filled a column at a time: no (keys, hashes) uint64
    for j in range(hashes):
        bits[:, j] = ((spread >> np.uint64(9 * j)) & np.uint64(511)) % np.uint64(LINE_BITS)
    return bits


class KeyProbe:
    """A shard's keys prepared once for every live segment's filter: their hash, their bit numbers,
    and the order of the lines they pick. A key's line is its hash's high half scaled to the
    filter's line count, so that order is the same in every filter, whatever its size: a lookup
    sorts and hashes the keys once, not once per segment (a new shard tests ~434 000 keys against
    each of the few live segments per level)."""

    def __init__(self, keys: np.ndarray):
        """``keys``: sorted, unique uint64."""
        hashed = _mix(keys.astype(np.uint64) ^ _FILTER_SALT)
        self.keys = keys
        self.order = np.argsort(hashed >> np.uint64(32), kind="stable")
        self.high = (hashed >> np.uint64(32))[self.order]
        self.bits = _bits_of_hashed(hashed[self.order], MAX_HASHES)

    def subset(self, keep: np.ndarray) -> KeyProbe:
        """The probe of ``keys[keep]`` (``keep``: bool per key), taken from this one: a lookup that
        stops reading some keys part way through the segments probes the rest without hashing and
        sorting them again."""
        kept = keep[self.order]
        probe = object.__new__(KeyProbe)
        probe.keys = self.keys[keep]
        probe.order = (np.cumsum(keep) - 1)[self.order[kept]]
        probe.high, probe.bits = self.high[kept], self.bits[kept]
        return probe

    def lines(self, lines: int) -> np.ndarray:
        """Each key's line in a filter of ``lines`` lines, in :attr:`order` (non-decreasing)."""
        return ((self.high * np.uint64(lines)) >> np.uint64(32)).astype(np.int64)


def _check_words(lines: np.ndarray, line_numbers: np.ndarray) -> np.ndarray:
    """The check word of each line (``lines``: shape ``(n, LINE_WORDS)``) at its number."""
    check = _mix(line_numbers.astype(np.uint64) ^ _CHECK_SALT)
    for word in range(BIT_WORDS):
        check = _mix(check ^ lines[:, word])
    return check


def _header(lines: int, segment: str, hashes: int) -> bytes:
    body = _HEADER.pack(_MAGIC, lines, hashes, segment.encode()[:24], 0, 0)
    check = int(_mix(np.frombuffer(body[:-8], "<u8")).sum(dtype=np.uint64))
    return body[:-8] + struct.pack("<Q", check)


def _read_header(header: bytes, path: str, segment: str) -> tuple[int, int]:
    """The filter's line count and bits per key, once its header checks out and names ``segment``."""
    if len(header) != _HEADER.size:
        raise DamagedFilter(path, "shorter than its header")
    magic, lines, hashes, named, _, _ = _HEADER.unpack(header)
    if magic[:5] == _MAGIC[:5] and magic != _MAGIC:
        raise DamagedFilter(path, f"written for an earlier index format ({magic[:7].decode(errors='replace')})")
    if (
        magic != _MAGIC
        or not 1 <= hashes <= MAX_HASHES
        or header != _header(lines, named.rstrip(b"\0").decode(errors="replace"), hashes)
    ):
        raise DamagedFilter(path, "header checksum mismatch")
    named = named.rstrip(b"\0")
    if named != segment.encode()[:24]:
        raise DamagedFilter(path, f"built for another segment ({named.decode(errors='replace')})")
    return lines, hashes


class FilterBuilder:
    """A filter built from keys added a chunk at a time, sized for ``records`` postings; the bits live
    in a temporary file (a merged segment's filter can be larger than the memory a step should hold)."""

    def __init__(self, records: int):
        self.lines = line_count(records)
        self.hashes = HASHES
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by finish()
        self._file.truncate(self.lines * LINE_BYTES)
        # A plain array over the mapped file: ``np.bitwise_or.at`` on the ``np.memmap`` subclass took
        # about 4x as long (0.29 s against 0.06 s for a new shard's 3 M bits, measured).
        self._bits = np.asarray(np.memmap(self._file, np.uint64, "r+", shape=(self.lines, LINE_WORDS)))

    def add(self, keys: np.ndarray) -> None:
        for start in range(0, len(keys), ADD_CHUNK):
            line, bits = _lines_and_bits(keys[start : start + ADD_CHUNK], self.lines, self.hashes)
            first_word = line * LINE_WORDS
            # One bit number at a time: the arrays of every key's words and masks at once took about
            # 100 MB for a new shard's 434 000 keys, the peak of its commit (measured).
            for j in range(self.hashes):
                word = first_word + bits[:, j] // 64
                mask = np.left_shift(np.uint64(1), (bits[:, j] % 64).astype(np.uint64))
                np.bitwise_or.at(self._bits.reshape(-1), word, mask)

    def finish(self, segment: str) -> Iterator[bytes]:
        """The filter's bytes for ``segment``, in pieces (the temporary file is closed after the last)."""
        try:
            yield _header(self.lines, segment, self.hashes)
            step = max(1, (4 << 20) // LINE_BYTES)
            for start in range(0, self.lines, step):
                lines = np.array(self._bits[start : start + step])
                lines[:, BIT_WORDS] = _check_words(lines, np.arange(start, start + len(lines)))
                yield lines.astype("<u8").tobytes()
        finally:
            del self._bits
            self._file.close()


def filter_bytes(keys: np.ndarray, segment: str) -> bytes:
    """The whole filter of ``segment``, whose postings have ``keys`` (one per posting)."""
    builder = FilterBuilder(len(keys))
    builder.add(keys)
    return b"".join(builder.finish(segment))


def _check_lines(lines: np.ndarray, numbers: np.ndarray, path: str) -> None:
    bad = np.flatnonzero(_check_words(lines, numbers) != lines[:, BIT_WORDS])
    if len(bad):
        raise DamagedFilter(path, f"line {int(numbers[bad[0]])} checksum mismatch")


def _present(lines_read: np.ndarray, at: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Whether every bit of each key is set (``at``: each key's row in ``lines_read``). One bit
    number at a time, for the keys whose earlier bits were all set: most absent keys fail at the
    first or second, so about 1.7 bits are looked at per key instead of :data:`HASHES`."""
    alive = np.arange(len(at))
    for j in range(bits.shape[1]):
        bit = bits[alive, j]
        words = lines_read[at[alive], bit // 64]
        alive = alive[(words >> (bit % 64).astype(np.uint64)) & np.uint64(1) == 1]
    present = np.zeros(len(at), bool)
    present[alive] = True
    return present


RUN_GAP_LINES = 64
"""Lines a local lookup reads through rather than starting another read: at most a page (4 KiB), so
what it reads stays within about twice the pages its lines lie on, and a filter far larger than the
keys' lines is never read whole."""
RUN_LINES = 1 << 14
"""Most lines one local read brings in (1 MiB)."""


def _pread_lines(descriptor: int, wanted: np.ndarray) -> np.ndarray:
    """The lines ``wanted`` (sorted, unique line numbers) of the filter open as ``descriptor``, read
    in runs of nearby lines (``os.pread``): only the lines' own pages are read, into memory the
    lookup owns, so a large filter's pages are neither mapped into the process (where each would
    count in its resident memory) nor read for lines no key needs."""
    out = np.empty((len(wanted), LINE_WORDS), "<u8")
    breaks = np.flatnonzero(np.diff(wanted) > RUN_GAP_LINES) + 1
    starts = np.concatenate([[0], breaks]).tolist()
    ends = np.concatenate([breaks, [len(wanted)]]).tolist()
    for first, end in zip(starts, ends, strict=True):
        while first < end:
            # A run wider than RUN_LINES is read in pieces, each starting at a wanted line.
            last = first + int(np.searchsorted(wanted[first:end], wanted[first] + RUN_LINES, "left"))
            low, high = int(wanted[first]), int(wanted[last - 1]) + 1
            data = os.pread(descriptor, (high - low) * LINE_BYTES, _HEADER.size + low * LINE_BYTES)
            if len(data) != (high - low) * LINE_BYTES:
                raise EOFError
            out[first:last] = np.frombuffer(data, "<u8").reshape(-1, LINE_WORDS)[wanted[first:last] - low]
            first = last
    return out


def keys_maybe_in(
    data_root, relative: str, segment: str, keys: np.ndarray, probe: KeyProbe | None = None
) -> tuple[np.ndarray, int]:
    """The keys of ``keys`` (sorted, unique uint64) that the segment may hold (every key it holds is
    among them), and how many filter bytes were read. ``probe``: the keys' :class:`KeyProbe`, made
    once for every segment a lookup tests them against. Raises :class:`DamagedFilter` or
    ``FileNotFoundError``.

    On a local root the keys are tested in the order of the lines they pick, a chunk at a time, and
    each chunk's lines are read with :func:`_pread_lines`: the filter is read at most once, its
    pages never mapped. On an object store the whole file is read once."""
    if len(keys) == 0:
        return keys, 0
    probe = KeyProbe(keys) if probe is None else probe
    path = data_root.path(relative)
    if data_root.is_local:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            lines, hashes = _read_header(handle.read(_HEADER.size), relative, segment)
            if size != _HEADER.size + lines * LINE_BYTES:
                raise DamagedFilter(relative, f"{size} bytes, {_HEADER.size + lines * LINE_BYTES} expected")
            descriptor = handle.fileno()
            try:
                return _tested(probe, lines, hashes, relative, lambda wanted: _pread_lines(descriptor, wanted))
            except EOFError:
                raise DamagedFilter(relative, "truncated while read") from None
    content = data_root.fs.cat_file(path)
    lines, hashes = _read_header(content[: _HEADER.size], relative, segment)
    if len(content) != _HEADER.size + lines * LINE_BYTES:
        raise DamagedFilter(relative, f"{len(content)} bytes, {_HEADER.size + lines * LINE_BYTES} expected")
    table = np.frombuffer(content, "<u8", offset=_HEADER.size).reshape(lines, LINE_WORDS)
    return _tested(probe, lines, hashes, relative, lambda wanted: table[wanted])


def _tested(probe: KeyProbe, lines: int, hashes: int, relative: str, read_lines) -> tuple[np.ndarray, int]:
    """:func:`keys_maybe_in` over a filter of ``lines`` lines whose lines ``read_lines`` returns."""
    present, read = np.zeros(len(probe.keys), bool), _HEADER.size
    # In line order, so that the chunks read disjoint stretches of the filter; a chunk of keys at a
    # time, so that the per-key arrays stay small whatever the shard's size.
    line_of = probe.lines(lines)
    for start in range(0, len(line_of), LOOKUP_CHUNK):
        line = line_of[start : start + LOOKUP_CHUNK]
        starts_line = np.empty(len(line), bool)
        starts_line[0] = True
        np.not_equal(line[1:], line[:-1], out=starts_line[1:])
        wanted, at = line[starts_line], np.cumsum(starts_line) - 1
        lines_read = read_lines(wanted)
        _check_lines(lines_read, wanted, relative)
        bits = probe.bits[start : start + LOOKUP_CHUNK, :hashes].astype(np.int64)
        present[start : start + len(line)] = _present(lines_read, at, bits)
        read += len(wanted) * LINE_BYTES
    return probe.keys[np.sort(probe.order[present])], read


def verify_filter(handle, path: str, segment: str) -> None:
    """Raise :class:`DamagedFilter` unless every line of the filter open as ``handle`` checks out
    (read a few MB at a time)."""
    lines, _ = _read_header(handle.read(_HEADER.size), path, segment)
    step = max(1, (4 << 20) // LINE_BYTES)
    for start in range(0, lines, step):
        count = min(step, lines - start)
        piece = handle.read(count * LINE_BYTES)
        if len(piece) != count * LINE_BYTES:
            raise DamagedFilter(path, "truncated")
        _check_lines(np.frombuffer(piece, "<u8").reshape(count, LINE_WORDS), np.arange(start, start + count), path)
    if handle.read(1):
        raise DamagedFilter(path, "longer than its lines")
