"""Where the loader cuts fixed-length chunks out of a file's speech segments.

A chunk of ``chunk_s`` seconds must lie inside one speech segment, so only segments at least
``chunk_s`` long are candidates, and a chunk may start anywhere in ``[seg_start, seg_end -
chunk_s]``. The original loader drew ``num_chunks`` starts with replacement from a file with any
candidate, so a file with one 10.5 s segment gave 16 near-copies of the same audio. Here the count
is capped by how many chunks the speech holds without overlap (``sum(floor(segment / chunk_s))``):
"up to ``num_chunks``". Draws are still uniform (chunks may overlap in part); the generator is
seeded from the ``seed`` argument, the epoch, the tar and the key, so the same file gets the same
chunks whichever worker reads it.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence

DEFAULT_CHUNK_S = 10.0
DEFAULT_NUM_CHUNKS = 16


def candidate_windows(start_s: Sequence[float], end_s: Sequence[float], chunk_s: float) -> list[tuple[float, float]]:
    """``(first_start_s, last_start_s)`` of every segment at least ``chunk_s`` long."""
    return [(s, e - chunk_s) for s, e in zip(start_s, end_s, strict=True) if e - s >= chunk_s]


def chunk_capacity(start_s: Sequence[float], end_s: Sequence[float], chunk_s: float) -> int:
    """How many non-overlapping ``chunk_s`` chunks the segments hold."""
    # The epsilon keeps a segment of exactly k * chunk_s (up to float error) at k chunks.
    return sum(int(math.floor((e - s) / chunk_s + 1e-9)) for s, e in zip(start_s, end_s, strict=True) if e > s)


def chunk_count(start_s: Sequence[float], end_s: Sequence[float], chunk_s: float, num_chunks: int) -> int:
    """How many chunks the loader takes from a file: ``min(num_chunks, capacity)``."""
    return min(num_chunks, chunk_capacity(start_s, end_s, chunk_s))


def usable_chunk_seconds(
    start_s: Sequence[float],
    end_s: Sequence[float],
    chunk_s: float = DEFAULT_CHUNK_S,
    num_chunks: int = DEFAULT_NUM_CHUNKS,
) -> float:
    """Seconds of audio the loader yields from a file per epoch."""
    return chunk_count(start_s, end_s, chunk_s, num_chunks) * chunk_s


def chunk_rng(seed: int, epoch: int, tar_name: str, key: str) -> random.Random:
    """A generator that depends only on (seed, epoch, tar, key), never on worker or read order."""
    digest = hashlib.blake2b(f"{seed}\0{epoch}\0{tar_name}\0{key}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


def draw_chunk_starts(
    start_s: Sequence[float], end_s: Sequence[float], chunk_s: float, num_chunks: int, rng: random.Random
) -> list[float]:
    """Start times (seconds) of the file's chunks: a uniform candidate segment, then a uniform start."""
    windows = candidate_windows(start_s, end_s, chunk_s)
    count = chunk_count(start_s, end_s, chunk_s, num_chunks)
    starts = []
    for _ in range(count if windows else 0):
        first, last = rng.choice(windows)
        starts.append(rng.uniform(first, last))
    return starts
