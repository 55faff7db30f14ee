"""Near duplicates of a whole corpus in one pass: every selected shard decided at once, in parallel.

The incremental stage (:mod:`speechdata.quality.near_duplicates`) checks one shard against everything
indexed before it. This pass decides a whole selection of shards together, for what must touch
everything anyway: the first import of a large corpus, and a re-run after a threshold change. It
follows the MinHash/LSH bucket joins of datatrove and NeMo Curator, in four stages of independent
tasks handed to an :class:`Engine` (:class:`LocalEngine` in this process; the Ray engine of
:mod:`speechdata.quality.near_dup_batch_ray` on a cluster, with the same code):

1. **signals**, one task per shard: the exact hash, audio fingerprint and transcript MinHash of every
   utterance (:func:`~speechdata.quality.near_duplicates.shard_signals`), or the stored ones of an
   indexed shard (shards outside the selection, and every indexed shard with ``signals_from="index"``).
2. **keys**, one task per shard: every exact hash, active sub-fingerprint and transcript LSH band key,
   with the utterance's place in the order, split into partitions by key.
3. **candidates**, one task per partition: each key's bucket joined with itself, every utterance
   paired only with those before it in the order, exactly as the incremental lookup pairs them (a
   sub-fingerprint counted over the shards up to the query's own, the 64 earliest transcripts per band).
4. **verify**, one task per group of shards: each utterance's candidates verified with the functions
   the incremental path uses (:func:`~speechdata.quality.near_dup_matching.near_audio_match`,
   :func:`~speechdata.quality.near_dup_matching.near_transcript_match`), strongest kind first.

The driver then resolves representatives in the order (a copy's representative is its match's, so a
copy of a copy names the original) and writes every shard's entries, the index order (the commit)
and every shard's ``near_duplicates.parquet``, in the incremental path's formats: its files equal,
byte for byte, those of the incremental stage run shard by shard in the same order, and incremental
shards landing afterwards continue from the index it leaves.

The order is the index's: indexed shards at their positions, then the selected shards not yet
indexed in the order given. Indexed shards outside the selection keep their decisions; the selected
shards after them are checked against their stored entries, as the incremental path would.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import posixpath
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np
import pyarrow.parquet as pq

from speechdata.io import layout
from speechdata.io.parquet_integrity import WRITE_OPTIONS
from speechdata.io.shard_lock import LockHolder
from speechdata.io.storage import DataRoot
from speechdata.quality.fingerprint_text import band_keys
from speechdata.quality.near_dup_index import (
    DEFAULT_LOCK_TIMEOUT_S,
    ENTRIES_VERSION_CHARS,
    ORDER_SCHEMA,
    IndexedShard,
    _parse_entries,
    corpus_index_lock,
    entries_table,
    read_order,
    remove_unlisted_entries,
)
from speechdata.quality.near_dup_matching import (
    KINDS,
    MAX_KEY_OCCURRENCES,
    MAX_TRANSCRIPT_CANDIDATES,
    Decision,
    NearDuplicateThresholds,
    UtteranceSignals,
    near_audio_match,
    near_transcript_match,
)
from speechdata.quality.near_duplicates import Unchecked, near_duplicates_table, shard_signals

DEFAULT_PARTITIONS = 16
"""Key partitions (candidate tasks); verify tasks are as many, or one per selected shard when fewer."""

SignalsFrom = Literal["audio", "index"]
Progress = Callable[[str, int, int], None]
"""``(stage, tasks done, tasks in the stage)``, called as tasks finish."""

_NO_MATCH, _EXACT, _AUDIO, _TEXT = 0, 1, 2, 3
_KIND_OF_CODE = {_EXACT: KINDS[0], _AUDIO: KINDS[1], _TEXT: KINDS[2]}


class Engine(Protocol):
    """Where the tasks run. ``submit`` returns a handle (``returns`` None) or ``returns`` handles (the
    task returns a tuple of that many values); handles given as ``args`` reach the task as their
    values, handles inside other arguments stay handles, read in the task with ``fetch``."""

    def submit(self, fn: Callable[..., Any], args: Sequence[Any], returns: int | None = None) -> Any: ...

    def fetch(self, handle: Any) -> Any: ...

    def completed(self, handles: Sequence[Any]) -> Iterator[int]:
        """Yield once per finished task of ``handles`` (for progress), until all have finished."""
        ...


class LocalEngine:
    """Every task in this process, when submitted: the reference the Ray engine is compared with,
    and enough for a corpus one machine holds."""

    def submit(self, fn: Callable[..., Any], args: Sequence[Any], returns: int | None = None) -> Any:
        result = fn(*args)
        return result if returns is None else list(result)

    def fetch(self, handle: Any) -> Any:
        return handle

    def completed(self, handles: Sequence[Any]) -> Iterator[int]:
        yield from range(len(handles))


# --- stage 1: signals


@dataclass(frozen=True)
class ShardSignals:
    """One shard's signals in ``utt_id`` order; ``representatives``: the stored ones of a shard that
    keeps its decisions (None for a shard this pass decides)."""

    shard_id: str
    signals: list[UtteranceSignals]
    representatives: list[tuple[str, str]] | None = None


@dataclass(frozen=True)
class ShardOutline:
    """What the driver keeps of a shard's signals: its utterances and what could not be checked."""

    shard_id: str
    utt_ids: list[str]
    representatives: list[tuple[str, str]] | None
    unchecked: list[Unchecked]
    audio_seconds: float


def signals_from_audio(data_root: DataRoot, shard_id: str) -> tuple[ShardSignals, ShardOutline]:
    signals, unchecked, audio_seconds = shard_signals(data_root, shard_id)
    return ShardSignals(shard_id, signals), ShardOutline(
        shard_id, [s.utt_id for s in signals], None, unchecked, audio_seconds
    )


def signals_from_index(
    data_root: DataRoot, shard: IndexedShard, keep_decisions: bool
) -> tuple[ShardSignals, ShardOutline]:
    """An indexed shard's stored signals (and its stored representatives when it keeps its decisions)."""
    entries = _indexed_entries(data_root, shard)
    signals = [utterance for utterance, _ in entries]
    representatives = [representative for _, representative in entries] if keep_decisions else None
    return ShardSignals(shard.shard_id, signals, representatives), ShardOutline(
        shard.shard_id, [s.utt_id for s in signals], representatives, [], 0.0
    )


# --- stage 2: keys


@dataclass
class KeyPartition:
    """One partition's keys from one shard (or, concatenated, from all). ``*_position``: the
    utterance's place in the order; ``*_query``: whether this pass decides the utterance."""

    exact_hash: list[str] = field(default_factory=list)
    exact_position: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    exact_query: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    audio_key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32))
    audio_position: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    audio_frame: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    audio_rank: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    audio_query: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    text_key: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    text_position: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    text_query: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))

    @classmethod
    def concatenate(cls, parts: Sequence[KeyPartition]) -> KeyPartition:
        if not parts:
            return cls()
        return cls(
            exact_hash=[h for part in parts for h in part.exact_hash],
            **{
                name: np.concatenate([getattr(part, name) for part in parts])
                for name in cls.__dataclass_fields__
                if name != "exact_hash"
            },
        )


def _partition_of_hash(exact_hash: str, partitions: int) -> int:
    return int(exact_hash[:15], 16) % partitions


def shard_keys(
    shard: ShardSignals, offset: int, rank: int, decided: bool, partitions: int, thresholds: NearDuplicateThresholds
) -> tuple[KeyPartition, ...]:
    """The shard's keys, split into ``partitions`` by key (the shard's utterances start at ``offset``
    in the order; ``rank``: the shard's place among the shards)."""
    signals = shard.signals
    positions = offset + np.arange(len(signals), dtype=np.int64)
    out = [KeyPartition() for _ in range(partitions)]

    exact = [(s.exact_hash, int(p)) for s, p in zip(signals, positions, strict=True) if s.exact_hash is not None]
    by_partition: dict[int, list[tuple[str, int]]] = {}
    for exact_hash, position in exact:
        by_partition.setdefault(_partition_of_hash(exact_hash, partitions), []).append((exact_hash, position))
    for part, rows in by_partition.items():
        out[part].exact_hash = [h for h, _ in rows]
        out[part].exact_position = np.asarray([p for _, p in rows], np.int64)
        out[part].exact_query = np.full(len(rows), decided)

    keys, owners, frames = [], [], []
    for position, utterance in zip(positions, signals, strict=True):
        active = np.flatnonzero(utterance.fingerprint.active)
        keys.append(utterance.fingerprint.sub_fingerprints[active].astype(np.uint32))
        owners.append(np.full(len(active), position, np.int64))
        frames.append(active.astype(np.int64))
    if keys:
        audio_key, audio_position, audio_frame = np.concatenate(keys), np.concatenate(owners), np.concatenate(frames)
        audio_part = (audio_key % np.uint32(partitions)).astype(np.int64)
        for part in range(partitions):
            chosen = audio_part == part
            out[part].audio_key = audio_key[chosen]
            out[part].audio_position = audio_position[chosen]
            out[part].audio_frame = audio_frame[chosen]
            out[part].audio_rank = np.full(int(chosen.sum()), rank, np.int64)
            out[part].audio_query = np.full(int(chosen.sum()), decided)

    comparable = [
        (int(position), utterance.transcript_signature)
        for position, utterance in zip(positions, signals, strict=True)
        if thresholds.check_transcripts
        and utterance.transcript_signature is not None
        and utterance.transcript_words >= thresholds.min_transcript_words
    ]
    if comparable:
        bands = band_keys(np.stack([signature for _, signature in comparable]))
        text_key = bands.reshape(-1)
        text_position = np.repeat(np.asarray([p for p, _ in comparable], np.int64), bands.shape[1])
        text_part = (text_key % np.uint64(partitions)).astype(np.int64)
        for part in range(partitions):
            chosen = text_part == part
            out[part].text_key = text_key[chosen]
            out[part].text_position = text_position[chosen]
            out[part].text_query = np.full(int(chosen.sum()), decided)
    return tuple(out)


# --- stage 3: candidates


@dataclass
class Candidates:
    """Candidate pairs for the queries of one verify group: ``*_query`` before ``*_owner`` in the order."""

    exact_query: np.ndarray
    exact_owner: np.ndarray
    audio_query: np.ndarray
    audio_owner: np.ndarray
    audio_offset: np.ndarray
    text_query: np.ndarray
    text_owner: np.ndarray


def _run_starts(*columns: np.ndarray) -> np.ndarray:
    """For each row of columns sorted together, the index of the first row of its run of equal values."""
    count = len(columns[0])
    if count == 0:
        return np.zeros(0, np.int64)
    change = np.zeros(count, bool)
    change[0] = True
    for column in columns:
        change[1:] |= column[1:] != column[:-1]
    return np.maximum.accumulate(np.where(change, np.arange(count), 0))


def _run_ends(*columns: np.ndarray) -> np.ndarray:
    """For each row of columns sorted together, one past the index of the last row of its run."""
    count = len(columns[0])
    if count == 0:
        return np.zeros(0, np.int64)
    change = np.zeros(count, bool)
    change[-1] = True
    for column in columns:
        change[:-1] |= column[:-1] != column[1:]
    return np.minimum.accumulate(np.where(change, np.arange(count) + 1, count)[::-1])[::-1]


def _spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices ``starts[i] .. starts[i] + counts[i]`` of every ``i``, concatenated."""
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())


def bucket_candidates(
    group_of_rank: np.ndarray, offsets: np.ndarray, groups: int, *pieces: KeyPartition
) -> tuple[Candidates, ...]:
    """Join one key partition's buckets (``pieces``: its keys from every shard), split by the verify
    group of each query's shard (``group_of_rank``; ``offsets``: each shard's first place)."""
    keys = KeyPartition.concatenate(pieces)

    # Exact: the first utterance in the order with the hash.
    first_with_hash: dict[str, int] = {}
    for exact_hash, position in sorted(zip(keys.exact_hash, keys.exact_position.tolist(), strict=True)):
        first_with_hash.setdefault(exact_hash, position)
    exact_q, exact_o = [], []
    for exact_hash, position, decided in zip(
        keys.exact_hash, keys.exact_position.tolist(), keys.exact_query.tolist(), strict=True
    ):
        if decided and first_with_hash[exact_hash] < position:
            exact_q.append(position)
            exact_o.append(first_with_hash[exact_hash])

    # Audio: the incremental lookup of a shard holds every shard up to it (the shard itself whole), so
    # a query frame's key counts the occurrences in the shards up to the query's; it hits every
    # occurrence of an utterance before it.
    order = np.lexsort((keys.audio_frame, keys.audio_position, keys.audio_key))
    key, position = keys.audio_key[order], keys.audio_position[order]
    frame, rank, decided = keys.audio_frame[order], keys.audio_rank[order], keys.audio_query[order]
    bucket_start = _run_starts(key)
    occurrences_up_to_rank = _run_ends(key, rank) - bucket_start
    earlier = _run_starts(key, position) - bucket_start
    asking = decided & (occurrences_up_to_rank <= MAX_KEY_OCCURRENCES) & (earlier > 0)
    asking_index = np.flatnonzero(asking)
    counts = earlier[asking_index]
    hits = _spans(bucket_start[asking_index], counts)
    audio_q = np.repeat(position[asking_index], counts)
    audio_o = position[hits]
    audio_offset = frame[hits] - np.repeat(frame[asking_index], counts)

    # Transcripts: the earliest MAX_TRANSCRIPT_CANDIDATES before the query in each band's bucket (the
    # earliest of the union are among them).
    pairs = np.unique(np.stack([keys.text_key, keys.text_position.astype(np.uint64)], axis=1), axis=0)
    text_key, text_position = pairs[:, 0], pairs[:, 1].astype(np.int64)
    text_decided = np.isin(text_position, keys.text_position[keys.text_query])
    text_start = _run_starts(text_key)
    text_earlier = np.minimum(np.arange(len(text_key)) - text_start, MAX_TRANSCRIPT_CANDIDATES)
    text_asking = np.flatnonzero(text_decided & (text_earlier > 0))
    text_counts = text_earlier[text_asking]
    text_q = np.repeat(text_position[text_asking], text_counts)
    text_o = text_position[_spans(text_start[text_asking], text_counts)]

    def group_of(queries: np.ndarray) -> np.ndarray:
        return group_of_rank[np.searchsorted(offsets, queries, side="right") - 1]

    exact_q_array, exact_o_array = np.asarray(exact_q, np.int64), np.asarray(exact_o, np.int64)
    exact_group, audio_group, text_group = group_of(exact_q_array), group_of(audio_q), group_of(text_q)
    return tuple(
        Candidates(
            exact_query=exact_q_array[exact_group == g],
            exact_owner=exact_o_array[exact_group == g],
            audio_query=audio_q[audio_group == g],
            audio_owner=audio_o[audio_group == g],
            audio_offset=audio_offset[audio_group == g],
            text_query=text_q[text_group == g],
            text_owner=text_o[text_group == g],
        )
        for g in range(groups)
    )


# --- stage 4: verify


@dataclass(frozen=True)
class Matches:
    """Each query's match: ``kind`` a code (0: none), ``owner`` its place in the order (-1: none)."""

    query: np.ndarray
    kind: np.ndarray
    owner: np.ndarray
    similarity: np.ndarray


def verify_group(
    engine: Engine,
    shard_handles: Sequence[Any],
    offsets: np.ndarray,
    ranks: Sequence[int],
    thresholds: NearDuplicateThresholds,
    *pieces: Candidates,
) -> Matches:
    """The match of every utterance of the shards ``ranks``, from its candidates in every partition."""
    fetched: dict[int, ShardSignals] = {}

    def utterance(position: int) -> UtteranceSignals:
        shard_rank = int(np.searchsorted(offsets, position, side="right") - 1)
        if shard_rank not in fetched:
            fetched[shard_rank] = engine.fetch(shard_handles[shard_rank])
        return fetched[shard_rank].signals[position - int(offsets[shard_rank])]

    def by_query(query: np.ndarray, *columns: np.ndarray) -> dict[int, tuple[np.ndarray, ...]]:
        if len(query) == 0:
            return {}
        order = np.argsort(query, kind="stable")
        query = query[order]
        columns = tuple(column[order] for column in columns)
        bounds = np.flatnonzero(np.r_[True, query[1:] != query[:-1], True])
        return {
            int(query[start]): tuple(column[start:end] for column in columns)
            for start, end in zip(bounds[:-1], bounds[1:], strict=True)
        }

    exact = by_query(np.concatenate([p.exact_query for p in pieces]), np.concatenate([p.exact_owner for p in pieces]))
    audio = by_query(
        np.concatenate([p.audio_query for p in pieces]),
        np.concatenate([p.audio_owner for p in pieces]),
        np.concatenate([p.audio_offset for p in pieces]),
    )
    text = by_query(np.concatenate([p.text_query for p in pieces]), np.concatenate([p.text_owner for p in pieces]))

    queries = np.concatenate(
        [np.arange(offsets[rank], offsets[rank + 1], dtype=np.int64) for rank in ranks] or [np.zeros(0, np.int64)]
    )
    kinds = np.zeros(len(queries), np.int64)
    owners = np.full(len(queries), -1, np.int64)
    similarities = np.ones(len(queries), np.float64)
    for index, query in enumerate(queries.tolist()):
        match = None
        if query in exact:
            match = (_EXACT, int(exact[query][0].min()), 1.0)
        if match is None and query in audio:
            found = near_audio_match(
                utterance(query).fingerprint,
                *audio[query],
                lambda owner: utterance(owner).fingerprint,
                thresholds,
            )
            match = None if found is None else (_AUDIO, found[1], found[2])
        if match is None and query in text:
            found = near_transcript_match(
                utterance(query).transcript_signature,
                text[query][0].tolist(),
                lambda owner: utterance(owner).transcript_signature,
                thresholds,
            )
            match = None if found is None else (_TEXT, found[1], found[2])
        if match is not None:
            kinds[index], owners[index], similarities[index] = match
    return Matches(queries, kinds, owners, similarities)


# --- writing: the incremental path's index format


def write_shard_entries(data_root: DataRoot, shard: ShardSignals, decisions: list[Decision]) -> tuple[str, str, int]:
    """Write the shard's entries file (named by its content's digest, as the incremental path names
    it); ``(shard_id, version, utterances)``. Listed in the index only by :func:`commit_index`."""
    buffer = io.BytesIO()
    pq.write_table(entries_table(shard.signals, decisions), buffer, compression="zstd", **WRITE_OPTIONS)
    content = buffer.getvalue()
    version = hashlib.sha256(content).hexdigest()[:ENTRIES_VERSION_CHARS]
    data_root.write_bytes(layout.near_duplicates_index_entries(shard.shard_id, version), content)
    return shard.shard_id, version, len(shard.signals)


def commit_index(
    data_root: DataRoot, order: list[IndexedShard], written: Sequence[tuple[str, str, int]]
) -> list[IndexedShard]:
    """The commit: the order file naming the entries just written, indexed shards at their
    positions and new ones after the last, in ``written`` order. Call with the index lock held."""
    import pyarrow as pa

    by_shard = {shard.shard_id: shard for shard in order}
    next_position = max((shard.position for shard in order), default=-1) + 1
    for shard_id, version, utterances in written:
        previous = by_shard.get(shard_id)
        if previous is None:
            position, next_position = next_position, next_position + 1
        else:
            position = previous.position
        by_shard[shard_id] = IndexedShard(position, shard_id, version, utterances)
    updated = sorted(by_shard.values(), key=lambda shard: shard.position)
    data_root.write_parquet(
        layout.near_duplicates_index_order(),
        pa.Table.from_pylist([vars(shard) for shard in updated], schema=ORDER_SCHEMA),
    )
    return updated


def write_shard_file(data_root: DataRoot, shard_id: str, version: str, decisions: list[Decision]) -> str:
    """After the commit: the shard's ``near_duplicates.parquet``, and its superseded entries removed."""
    data_root.write_parquet(layout.near_duplicates(shard_id), near_duplicates_table(decisions))
    remove_unlisted_entries(data_root, shard_id, version)
    return shard_id


def _indexed_entries(data_root: DataRoot, shard: IndexedShard) -> list[tuple[UtteranceSignals, tuple[str, str]]]:
    path = layout.near_duplicates_index_entries(shard.shard_id, shard.entries_version)
    return _parse_entries(shard.shard_id, data_root.read_parquet(path))


# --- the driver


@dataclass(frozen=True)
class BatchShardResult:
    shard_id: str
    index_position: int
    utterances: int
    duplicates: list[Decision]
    unchecked: list[Unchecked]
    audio_seconds: float

    @property
    def by_kind(self) -> dict[str, int]:
        counts = dict.fromkeys(KINDS, 0)
        for decision in self.duplicates:
            counts[decision.kind] += 1
        return counts


@dataclass(frozen=True)
class BatchSummary:
    """``shards``: the decided shards in the order; ``kept``: indexed shards that kept their decisions
    and that decided shards were checked against; ``stage_seconds``: wall time of each stage."""

    shards: list[BatchShardResult]
    kept: list[str]
    stage_seconds: dict[str, float]
    index_locked: bool

    @property
    def by_kind(self) -> dict[str, int]:
        counts = dict.fromkeys(KINDS, 0)
        for shard in self.shards:
            for kind, count in shard.by_kind.items():
                counts[kind] += count
        return counts


def shards_with_audio(data_root: DataRoot) -> list[str]:
    """Every shard with normalized audio on the data root, by shard id."""
    suffix = layout.normalized_audio("SHARD").removeprefix(f"{layout.SHARDS}/SHARD")
    found = {posixpath.basename(posixpath.dirname(path)) for path in data_root.glob(f"{layout.SHARDS}/*{suffix}")}
    return sorted(shard_id for shard_id in found if layout.is_valid_shard_id(shard_id))


def select_shards(
    data_root: DataRoot,
    shard_ids: Sequence[str] | None = None,
    matching: str | None = None,
    available: Sequence[str] | None = None,
) -> list[str]:
    """The shards a pass decides: ``shard_ids`` as given, else every ``available`` shard (default: every
    shard with normalized audio, by id) whose id matches the glob ``matching``. A shard id that is no
    valid shard id raises ValueError naming it."""
    if shard_ids:
        chosen = list(dict.fromkeys(shard_ids))
    else:
        pool = shards_with_audio(data_root) if available is None else list(available)
        chosen = [shard_id for shard_id in pool if matching is None or fnmatch.fnmatchcase(shard_id, matching)]
    invalid = [shard_id for shard_id in chosen if not layout.is_valid_shard_id(shard_id)]
    if invalid:
        raise ValueError(f"not shard ids: {', '.join(map(repr, invalid[:5]))}")
    if not chosen:
        raise ValueError(
            "near-duplicates batch: no shards selected"
            + (f" (none matches {matching!r})" if matching else " (no shard has normalized audio)")
        )
    return chosen


def _plan(order: list[IndexedShard], selected: Sequence[str]) -> tuple[list[str], set[str]]:
    """Every shard the pass reads, in the order, and which of them it decides: the indexed shards by
    position (up to the last selected one when every selected shard is indexed), then the selected
    shards not indexed yet, in the order given."""
    chosen = list(dict.fromkeys(selected))
    if not chosen:
        raise ValueError("near-duplicates batch: no shards selected")
    decided = set(chosen)
    indexed = [shard.shard_id for shard in order]
    new = [shard_id for shard_id in chosen if shard_id not in set(indexed)]
    if new:
        return indexed + new, decided
    last = max(i for i, shard_id in enumerate(indexed) if shard_id in decided)
    return indexed[: last + 1], decided


def _groups(decided_ranks: list[int], sizes: list[int], count: int) -> list[list[int]]:
    """``decided_ranks`` cut into at most ``count`` runs of about equal utterances."""
    count = max(1, min(count, len(decided_ranks)))
    total = sum(sizes[rank] for rank in decided_ranks) or 1
    groups: list[list[int]] = [[] for _ in range(count)]
    running = 0
    for rank in decided_ranks:
        groups[min(count - 1, running * count // total)].append(rank)
        running += sizes[rank]
    return [group for group in groups if group]


def _track(engine: Engine, stage: str, handles: Sequence[Any], on_progress: Progress | None) -> None:
    total = len(handles)
    if on_progress is not None:
        on_progress(stage, 0, total)
    for done, _ in enumerate(engine.completed(handles), 1):
        if on_progress is not None:
            on_progress(stage, done, total)


def run_near_duplicates_batch(
    data_root: DataRoot,
    shard_ids: Sequence[str],
    thresholds: NearDuplicateThresholds | None = None,
    *,
    engine: Engine | None = None,
    signals_from: SignalsFrom = "audio",
    partitions: int = DEFAULT_PARTITIONS,
    on_progress: Progress | None = None,
    lock_timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    run_id: str | None = None,
    holder_finished: Callable[[LockHolder], bool] | None = None,
) -> BatchSummary:
    """Decide ``shard_ids`` in one pass and write their files and the index (module docstring).

    ``signals_from="index"``: shards already indexed reuse their stored signals instead of decoding
    their audio again (a threshold change: signals do not depend on thresholds; only when their audio
    has not changed since). The index lock is held for the whole pass: incremental runs wait for it.
    """
    thresholds = thresholds or NearDuplicateThresholds()
    engine = engine or LocalEngine()
    partitions = max(1, partitions)
    seconds: dict[str, float] = {}
    with corpus_index_lock(data_root, timeout_s=lock_timeout_s, run_id=run_id, holder_finished=holder_finished) as held:
        order = read_order(data_root)
        indexed = {shard.shard_id: shard for shard in order}
        shards, decided = _plan(order, shard_ids)

        started = time.perf_counter()
        signal_tasks = []
        for shard_id in shards:
            if shard_id not in decided:
                signal_tasks.append(engine.submit(signals_from_index, (data_root, indexed[shard_id], True), returns=2))
            elif signals_from == "index" and shard_id in indexed:
                signal_tasks.append(engine.submit(signals_from_index, (data_root, indexed[shard_id], False), returns=2))
            else:
                signal_tasks.append(engine.submit(signals_from_audio, (data_root, shard_id), returns=2))
        shard_handles = [handles[0] for handles in signal_tasks]
        _track(engine, "signals", [handles[1] for handles in signal_tasks], on_progress)
        outlines: list[ShardOutline] = [engine.fetch(handles[1]) for handles in signal_tasks]
        seconds["signals"] = time.perf_counter() - started

        decisions = decide_in_order(
            engine, shards, decided, shard_handles, outlines, thresholds, partitions, on_progress, seconds
        )
        sizes = [len(outline.utt_ids) for outline in outlines]
        decided_ranks = [rank for rank, shard_id in enumerate(shards) if shard_id in decided]

        started = time.perf_counter()
        entry_tasks = [
            engine.submit(write_shard_entries, (data_root, shard_handles[rank], decisions[shards[rank]]))
            for rank in decided_ranks
        ]
        _track(engine, "entries", entry_tasks, on_progress)
        written = [engine.fetch(handle) for handle in entry_tasks]
        committed = {shard.shard_id: shard for shard in commit_index(data_root, order, written)}
        file_tasks = [
            engine.submit(
                write_shard_file,
                (data_root, shard_id, committed[shard_id].entries_version, decisions[shard_id]),
            )
            for shard_id, _, _ in written
        ]
        _track(engine, "files", file_tasks, on_progress)
        for handle in file_tasks:
            engine.fetch(handle)
        seconds["write"] = time.perf_counter() - started

    results = [
        BatchShardResult(
            shard_id=shards[rank],
            index_position=committed[shards[rank]].position,
            utterances=sizes[rank],
            duplicates=[d for d in decisions[shards[rank]] if d.kind is not None],
            unchecked=outlines[rank].unchecked,
            audio_seconds=outlines[rank].audio_seconds,
        )
        for rank in decided_ranks
    ]
    kept = [shard_id for shard_id in shards if shard_id not in decided]
    return BatchSummary(results, kept, seconds, index_locked=held is not None)


def decide_in_order(
    engine: Engine,
    shards: list[str],
    decided: set[str],
    shard_handles: Sequence[Any],
    outlines: list[ShardOutline],
    thresholds: NearDuplicateThresholds,
    partitions: int = DEFAULT_PARTITIONS,
    on_progress: Progress | None = None,
    seconds: dict[str, float] | None = None,
) -> dict[str, list[Decision]]:
    """Stages 2 to 4 and the representatives: the decisions of every shard of ``decided``, in
    ``utt_id`` order, with ``shards`` in the order (their signals behind ``shard_handles``)."""
    seconds = {} if seconds is None else seconds
    sizes = [len(outline.utt_ids) for outline in outlines]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    decided_ranks = [rank for rank, shard_id in enumerate(shards) if shard_id in decided]
    groups = _groups(decided_ranks, sizes, partitions)
    group_of_rank = np.full(len(shards), -1, np.int64)
    for g, ranks in enumerate(groups):
        group_of_rank[ranks] = g

    started = time.perf_counter()
    key_tasks = [
        engine.submit(
            shard_keys,
            (shard_handles[rank], int(offsets[rank]), rank, shards[rank] in decided, partitions, thresholds),
            returns=partitions,
        )
        for rank in range(len(shards))
    ]
    _track(engine, "keys", [handles[0] for handles in key_tasks], on_progress)
    seconds["keys"] = time.perf_counter() - started

    started = time.perf_counter()
    candidate_tasks = [
        engine.submit(
            bucket_candidates,
            (group_of_rank, offsets, len(groups), *[handles[part] for handles in key_tasks]),
            returns=len(groups),
        )
        for part in range(partitions)
    ]
    _track(engine, "candidates", [handles[0] for handles in candidate_tasks], on_progress)
    seconds["candidates"] = time.perf_counter() - started

    started = time.perf_counter()
    verify_tasks = [
        engine.submit(
            verify_group,
            (engine, shard_handles, offsets, ranks, thresholds, *[handles[g] for handles in candidate_tasks]),
        )
        for g, ranks in enumerate(groups)
    ]
    _track(engine, "verify", verify_tasks, on_progress)
    matches = [engine.fetch(handle) for handle in verify_tasks]
    seconds["verify"] = time.perf_counter() - started

    return _resolve(shards, outlines, offsets, matches)


def _resolve(
    shards: list[str], outlines: list[ShardOutline], offsets: np.ndarray, matches: list[Matches]
) -> dict[str, list[Decision]]:
    """Every decided shard's decisions, in ``utt_id`` order: a match's representative, resolved in
    the order (everything a query matched comes before it, so one pass from the start settles it)."""
    total = int(offsets[-1])
    kind = np.zeros(total, np.int64)
    owner = np.full(total, -1, np.int64)
    similarity = np.ones(total, np.float64)
    for found in matches:
        kind[found.query], owner[found.query], similarity[found.query] = found.kind, found.owner, found.similarity
    shard_of = np.repeat(np.arange(len(shards)), np.diff(offsets))
    utt_of = [utt_id for outline in outlines for utt_id in outline.utt_ids]
    representative: list[tuple[str, str]] = []
    for rank, outline in enumerate(outlines):
        if outline.representatives is not None:
            representative.extend(outline.representatives)
            continue
        for position in range(int(offsets[rank]), int(offsets[rank + 1])):
            matched = int(owner[position])
            representative.append(
                (shards[rank], utt_of[position]) if kind[position] == _NO_MATCH else representative[matched]
            )
    decisions: dict[str, list[Decision]] = {}
    for rank, outline in enumerate(outlines):
        if outline.representatives is not None:
            continue
        rows = []
        for position in range(int(offsets[rank]), int(offsets[rank + 1])):
            code, matched = int(kind[position]), int(owner[position])
            if code == _NO_MATCH:
                rows.append(Decision(utt_of[position], shards[rank], utt_of[position], None, 1.0))
            else:
                rows.append(
                    Decision(
                        utt_of[position],
                        *representative[position],
                        _KIND_OF_CODE[code],
                        round(float(similarity[position]), 4),
                        shards[int(shard_of[matched])],
                        utt_of[matched],
                    )
                )
        decisions[shards[rank]] = rows
    return decisions
