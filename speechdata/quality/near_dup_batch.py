"""Near duplicates of a whole corpus in one pass: every selected shard decided at once, in parallel.

The incremental stage (:mod:`speechdata.quality.near_duplicates`) decides one shard against the
index of everything before it. This pass decides a whole selection of shards together, for what
must touch everything anyway: the first import of a large corpus, and a re-run after a threshold
change. It is a bucket join by key, as datatrove's and NeMo Curator's MinHash/LSH deduplication
are, in stages of independent tasks handed to an :class:`Engine` (:class:`LocalEngine` in this
process; the Ray engine of :mod:`speechdata.quality.near_dup_batch_ray` on a cluster, with the
same code):

1. **signals**, one task per shard: the exact hash, audio fingerprint and transcript MinHash of every
   utterance (:func:`~speechdata.quality.near_duplicates.shard_signals`), or the stored ones of an
   indexed shard (shards outside the selection, and every indexed shard with ``signals_from="index"``).
2. **postings**, one task per shard: the index's keys of every utterance
   (:func:`~speechdata.quality.near_dup_postings.index_keys`), split into partitions by key.
3. **join**, one task per partition: for each decided shard, the postings of its keys held by
   utterances before it in the order: what the index answers the incremental stage.
4. **decide**, one task per group of shards: each shard decided by
   :func:`~speechdata.quality.near_dup_matching.decide_shard`, the incremental stage's own decision
   procedure, against what the join gathered for it.

The driver then resolves representatives in the order (a copy's representative is its match's, so a
copy of a copy names the original), and each shard is committed at its reserved position with the
index's own :func:`~speechdata.quality.near_dup_index.commit_shard_entries` and its
``near_duplicates.parquet`` written after, as the incremental stage does: every shard's file, entries
and commit record equal, byte for byte, those of the incremental stage run shard by shard in the same
order (segments may be merged further, which changes no decision), and shards landing afterwards
continue from the index it leaves.

The order is the index's: every selected shard reserves its position first (an indexed shard keeps
its own; new ones take the next positions, in the order given). Indexed shards outside the
selection keep their decisions, and the selected shards after them are checked against their
stored entries, as the incremental stage would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import posixpath
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from speechdata.io import layout
from speechdata.io.shard_lock import LockHolder, ShardLocked
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_candidates import AudioKeyLoad
from speechdata.quality.near_dup_index import (
    COMMITTED,
    DEFAULT_LOCK_TIMEOUT_S,
    LOCK_POLL_S,
    RESERVED,
    CorpusIndexBusy,
    IndexedShard,
    Reservation,
    commit_shard_entries,
    compact_index,
    drop_reservation,
    position_lock,
    read_shard_entries,
    read_state,
    reserve_position,
)
from speechdata.quality.near_dup_matching import (
    FLAG_KINDS,
    KINDS,
    Decision,
    IndexEntry,
    NearDuplicateThresholds,
    UtteranceSignals,
    decide_shard,
    within,
)
from speechdata.quality.near_dup_postings import (
    POSTING_DTYPE,
    index_keys,
    owner_of,
    position_of,
    postings_for,
    rank_of,
    sort_postings,
)
from speechdata.quality.near_duplicates import Unchecked, shard_signals, write_near_duplicate_files

DEFAULT_PARTITIONS = 16
"""Key partitions (join tasks); decide tasks are as many, or one per selected shard when fewer."""
COMMIT_TASKS = 4
"""Tasks that share the commits (each holds the index lock for milliseconds per shard)."""

SignalsFrom = Literal["audio", "index"]
Progress = Callable[[str, int, int], None]
"""``(stage, tasks done, tasks in the stage)``, called as tasks finish."""


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
    try:
        signals, unchecked, audio_seconds = shard_signals(data_root, shard_id)
    except FileNotFoundError as missing:
        # The pass reads what normalized_audio wrote; a bare errno line left the user to guess that.
        raise FileNotFoundError(
            f"shard {shard_id!r} has no normalized audio ({missing.filename or missing} is missing): "
            f"materialize raw_shards and normalized_audio for it first (speechdata shard run --shards "
            f"{shard_id} --select raw_shards,normalized_audio --wait), or leave it out of the selection"
        ) from missing
    return ShardSignals(shard_id, signals), ShardOutline(
        shard_id, [s.utt_id for s in signals], None, unchecked, audio_seconds
    )


def signals_from_index(
    data_root: DataRoot, shard: IndexedShard, keep_decisions: bool
) -> tuple[ShardSignals, ShardOutline]:
    """An indexed shard's stored signals (and its stored representatives when it keeps its decisions)."""
    entries = read_shard_entries(data_root, shard)
    signals = [utterance for utterance, _ in entries]
    representatives = [representative for _, representative in entries] if keep_decisions else None
    return ShardSignals(shard.shard_id, signals, representatives), ShardOutline(
        shard.shard_id, [s.utt_id for s in signals], representatives, [], 0.0
    )


# --- stage 2: postings


def shard_postings(shard: ShardSignals, position: int, partitions: int) -> tuple[np.ndarray, ...]:
    """The shard's postings (:func:`~speechdata.quality.near_dup_postings.index_keys`: exact hash,
    transcript band, envelope band-pair and sampled audio keys, owned by the shard at index
    ``position``: the keys the index holds), split into ``partitions`` by key."""
    postings = index_keys(shard.signals, position)
    part = (postings["key"] % np.uint64(partitions)).astype(np.int64)
    return tuple(postings[part == p] for p in range(partitions))


# --- stage 3: the join


_KEY_OWNER = np.dtype([("key", "<u8"), ("owner", "<i8")])


def _spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The indices ``starts[i] .. starts[i] + counts[i]`` of every ``i``, concatenated."""
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(counts.sum(), dtype=np.int64)


def join_partition(
    positions: np.ndarray, group_of_rank: np.ndarray, groups: int, *pieces: np.ndarray
) -> tuple[dict[int, np.ndarray], ...]:
    """One key partition joined with itself: for each decided shard (``group_of_rank`` >= 0), the
    postings of its own keys held by utterances before it in the order, which is what the index
    answers the incremental path (``pieces``: the partition's postings of every shard, by rank;
    ``positions``: each shard's index position). Split by the decided shard's verify group."""
    everything = sort_postings(np.concatenate(pieces)) if pieces else np.empty(0, POSTING_DTYPE)
    by_key_owner = np.empty(len(everything), _KEY_OWNER)
    by_key_owner["key"], by_key_owner["owner"] = everything["key"], everything["owner"]
    out: list[dict[int, np.ndarray]] = [{} for _ in range(groups)]
    for rank, piece in enumerate(pieces):
        if group_of_rank[rank] < 0 or len(piece) == 0:
            continue
        keys = np.unique(piece["key"])
        bound = np.empty(len(keys), _KEY_OWNER)
        bound["key"], bound["owner"] = keys, owner_of(int(positions[rank]), 0)
        starts = np.searchsorted(everything["key"], keys, side="left")
        counts = np.searchsorted(by_key_owner, bound, side="left") - starts
        out[int(group_of_rank[rank])][rank] = everything[_spans(starts, counts)]
    return tuple(out)


# --- stage 4: decide


class GatheredSource:
    """What the index holds before one shard, gathered by the join: a
    :class:`~speechdata.quality.near_dup_matching.CandidateSource` for
    :func:`~speechdata.quality.near_dup_matching.decide_shard`. Entries come from the shards'
    signals; their representatives are not resolved yet (each names itself), which changes no match:
    the driver resolves representatives from the matches, in the order."""

    def __init__(self, postings: np.ndarray, utterance: Callable[[int], tuple[UtteranceSignals, tuple[str, str]]]):
        self._postings = sort_postings(postings)
        self._utterance = utterance

    def postings(
        self, keys: np.ndarray, audio_only: np.ndarray | None = None, limit: int | None = None
    ) -> np.ndarray | None:
        return within(postings_for(self._postings, keys), limit)

    def entries(self, owners: Sequence[int]) -> dict[int, IndexEntry]:
        return {int(owner): self._utterance(int(owner)) for owner in owners}


def decide_group(
    engine: Engine,
    shard_handles: Sequence[Any],
    positions: np.ndarray,
    ranks: Sequence[int],
    thresholds: NearDuplicateThresholds,
    *pieces: dict[int, np.ndarray],
) -> dict[int, tuple[list[Decision], AudioKeyLoad]]:
    """The decisions of the shards ``ranks`` (:func:`decide_shard`, each against the postings the
    join gathered for it), by rank, representatives still unresolved, and what the per-key cap kept
    out of each shard's audio vote."""
    rank_of_position = {int(position): rank for rank, position in enumerate(positions)}
    fetched: dict[int, ShardSignals] = {}

    def shard(rank: int) -> ShardSignals:
        if rank not in fetched:
            fetched[rank] = engine.fetch(shard_handles[rank])
        return fetched[rank]

    def utterance(owner: int) -> IndexEntry:
        holder = shard(rank_of_position[int(position_of(owner))])
        signals = holder.signals[int(rank_of(owner))]
        if holder.representatives is not None:
            return signals, holder.representatives[int(rank_of(owner))]
        return signals, (signals.shard_id, signals.utt_id)

    decided = {}
    for rank in ranks:
        gathered = [piece[rank] for piece in pieces if rank in piece]
        postings = np.concatenate(gathered) if gathered else np.empty(0, POSTING_DTYPE)
        source = GatheredSource(postings, utterance)
        load = AudioKeyLoad()
        decided[rank] = (
            decide_shard(int(positions[rank]), shard(rank).signals, source, thresholds, key_load=load),
            load,
        )
    return decided


# --- stage 5: commit


def commit_shards(
    engine: Engine,
    data_root: DataRoot,
    shards: Sequence[tuple[Reservation, Any, list[Decision]]],
    lock_timeout_s: float,
    run_id: str | None,
) -> list[IndexedShard]:
    """Commit decided shards one after the other, each at its reserved position, then write its
    ``near_duplicates.parquet`` (the incremental path's order: a pass killed in between writes the
    same file when run again). ``shards``: ``(reservation, signals handle, decisions)``. A few
    such tasks share the commits: each commit takes the index lock for milliseconds, and many
    tasks waiting for it would only poll."""
    committed = []
    for reservation, handle, decisions in shards:
        shard: ShardSignals = engine.fetch(handle)
        committed.append(
            commit_shard_entries(
                data_root, reservation, shard.signals, decisions, timeout_s=lock_timeout_s, run_id=run_id
            )
        )
        write_near_duplicate_files(data_root, shard.shard_id, decisions)
    return committed


def _wait_for_others(
    data_root: DataRoot, ours: set[int], last: int, timeout_s: float, **lock_options
) -> list[IndexedShard]:
    """Wait until no other run holds a reservation before ``last`` (:func:`wait_for_earlier`'s rule
    for a run that holds several positions, ``ours``): each commits, or its run is found gone and
    its reservation is dropped. Returns the state then."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = read_state(data_root)
        pending = [s for s in state if s.state == RESERVED and s.position < last and s.position not in ours]
        if not pending:
            return state
        for other in pending:
            try:
                with position_lock(data_root, other.position, **lock_options):
                    drop_reservation(data_root, other, **lock_options)
            except ShardLocked:
                continue
        if time.monotonic() >= deadline:
            raise CorpusIndexBusy(
                f"shards reserved by other runs did not commit in {timeout_s:.0f} s: "
                + ", ".join(f"{s.shard_id} at {s.position}" for s in pending)
            )
        time.sleep(LOCK_POLL_S)


# --- the driver


@dataclass(frozen=True)
class BatchShardResult:
    shard_id: str
    index_position: int
    utterances: int
    duplicates: list[Decision]
    unchecked: list[Unchecked]
    audio_seconds: float
    audio_key_load: AudioKeyLoad = field(default_factory=AudioKeyLoad)
    """What the per-key cap kept out of the shard's audio vote, as the incremental stage reports it."""

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

    def describe(self) -> str:
        """One line: what was decided, the duplicates found, each stage's time."""
        positions = [shard.index_position for shard in self.shards]
        utterances = sum(shard.utterances for shard in self.shards)
        unchecked = sum(len(shard.unchecked) for shard in self.shards)
        seconds = ", ".join(f"{stage} {value:.1f} s" for stage, value in self.stage_seconds.items())
        keys = sum(shard.audio_key_load.keys for shard in self.shards)
        past_cap = sum(shard.audio_key_load.keys_past_cap for shard in self.shards)
        return (
            f"{len(self.shards)} shards decided (index positions {min(positions)}-{max(positions)}), "
            f"{utterances} utterances, duplicates {self.by_kind}"
            + (f", {unchecked} not checked" if unchecked else "")
            + (f", {past_cap / keys:.1%} of the audio keys past the cap" if keys else "")
            + (f", checked against {len(self.kept)} shards that kept their decisions" if self.kept else "")
            + f"; {seconds}"
        )

    @property
    def by_kind(self) -> dict[str, int]:
        counts = dict.fromkeys(KINDS, 0)
        for shard in self.shards:
            for kind, count in shard.by_kind.items():
                counts[kind] += count
        return counts


def shards_with_audio(data_root: DataRoot) -> list[str]:
    """Every shard with normalized audio on the data root, by shard id."""
    found = {
        posixpath.basename(posixpath.dirname(path)) for path in data_root.glob(layout.normalized_audio(layout.ANY_KEY))
    }
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

    Every selected shard reserves its place in the index order first, as the incremental stage does
    (indexed shards keep theirs; new ones take the next, in the order given), so shards landing
    during the pass are ordered after it and wait for it. ``signals_from="index"``: indexed shards
    reuse their stored signals instead of decoding their audio again (a threshold change: signals
    do not depend on thresholds; only when their audio has not changed since).
    """
    thresholds = thresholds or NearDuplicateThresholds()
    engine = engine or LocalEngine()
    partitions = max(1, partitions)
    chosen = list(dict.fromkeys(shard_ids))
    if not chosen:
        raise ValueError("near-duplicates batch: no shards selected")
    lock_options = {"run_id": run_id, "holder_finished": holder_finished}
    seconds: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        committed_before = {s.shard_id: s for s in read_state(data_root) if s.state == COMMITTED}
        in_order = sorted(
            chosen,
            key=lambda shard_id: (shard_id not in committed_before, _position_or_zero(committed_before, shard_id)),
        )
        reservations: dict[str, Reservation] = {}
        try:
            for shard_id in in_order:
                reservations[shard_id] = stack.enter_context(
                    reserve_position(data_root, shard_id, timeout_s=lock_timeout_s, **lock_options)
                )
            ours = {reservation.position for reservation in reservations.values()}
            state = _wait_for_others(data_root, ours, max(ours), lock_timeout_s, **lock_options)
            indexed = {s.shard_id: s for s in state if s.state == COMMITTED}
            kept = [
                s for s in state if s.state == COMMITTED and s.shard_id not in reservations and s.position < max(ours)
            ]
            plan = sorted(
                [(s.position, s.shard_id, False) for s in kept]
                + [(r.position, shard_id, True) for shard_id, r in reservations.items()]
            )
            shards = [shard_id for _, shard_id, _ in plan]
            positions = np.asarray([position for position, _, _ in plan], np.int64)
            decided = {shard_id for _, shard_id, is_decided in plan if is_decided}

            started = time.perf_counter()
            signal_tasks = []
            for shard_id in shards:
                if shard_id not in decided:
                    task = engine.submit(signals_from_index, (data_root, indexed[shard_id], True), returns=2)
                elif signals_from == "index" and shard_id in indexed:
                    task = engine.submit(signals_from_index, (data_root, indexed[shard_id], False), returns=2)
                else:
                    task = engine.submit(signals_from_audio, (data_root, shard_id), returns=2)
                signal_tasks.append(task)
            shard_handles = [handles[0] for handles in signal_tasks]
            _track(engine, "signals", [handles[1] for handles in signal_tasks], on_progress)
            outlines: list[ShardOutline] = [engine.fetch(handles[1]) for handles in signal_tasks]
            seconds["signals"] = time.perf_counter() - started

            key_loads: dict[str, AudioKeyLoad] = {}
            decisions = decide_in_order(
                engine,
                shards,
                positions,
                decided,
                shard_handles,
                outlines,
                thresholds,
                partitions,
                on_progress,
                seconds,
                key_loads,
            )

            started = time.perf_counter()
            decided_ranks = [rank for rank, shard_id in enumerate(shards) if shard_id in decided]
            commit_groups = _groups(decided_ranks, [len(o.utt_ids) for o in outlines], COMMIT_TASKS)
            commit_tasks = [
                engine.submit(
                    commit_shards,
                    (
                        engine,
                        data_root,
                        [(reservations[shards[r]], shard_handles[r], decisions[shards[r]]) for r in ranks],
                        lock_timeout_s,
                        run_id,
                    ),
                )
                for ranks in commit_groups
            ]
            _track(engine, "commit", commit_tasks, on_progress)
            committed = [shard for handle in commit_tasks for shard in engine.fetch(handle)]
        except BaseException:
            _drop_new_reservations(data_root, reservations.values(), **lock_options)
            raise
    while compact_index(data_root, timeout_s=lock_timeout_s, **lock_options):
        pass
    seconds["commit"] = time.perf_counter() - started
    results = [
        BatchShardResult(
            shard_id=shards[rank],
            index_position=indexed_shard.position,
            utterances=len(outlines[rank].utt_ids),
            duplicates=[d for d in decisions[shards[rank]] if d.kind in KINDS],
            unchecked=outlines[rank].unchecked,
            audio_seconds=outlines[rank].audio_seconds,
            audio_key_load=key_loads[shards[rank]],
        )
        for rank, indexed_shard in zip(decided_ranks, committed, strict=True)
    ]
    return BatchSummary(results, [s.shard_id for s in kept], seconds)


def _position_or_zero(committed: dict[str, IndexedShard], shard_id: str) -> int:
    return committed[shard_id].position if shard_id in committed else 0


def _drop_new_reservations(data_root: DataRoot, reservations, **lock_options) -> None:
    """A pass that fails before committing gives back the positions it reserved for new shards
    (it still holds their locks), so shards landing after it need not wait to find it gone."""
    for reservation in reversed(reservations):  # the last reserved first: each withdraws its record
        if not reservation.recommit:
            # The pass is failing with its own error, which this must not hide; a position not given
            # back is dropped by the next shard that finds its lock free.
            with contextlib.suppress(Exception):
                drop_reservation(
                    data_root,
                    IndexedShard(
                        reservation.position, reservation.shard_id, None, 0, RESERVED, None, reservation.token
                    ),
                    **lock_options,
                )


def decide_in_order(
    engine: Engine,
    shards: list[str],
    positions: np.ndarray,
    decided: set[str],
    shard_handles: Sequence[Any],
    outlines: list[ShardOutline],
    thresholds: NearDuplicateThresholds,
    partitions: int = DEFAULT_PARTITIONS,
    on_progress: Progress | None = None,
    seconds: dict[str, float] | None = None,
    key_loads: dict[str, AudioKeyLoad] | None = None,
) -> dict[str, list[Decision]]:
    """Stages 2 to 4 and the representatives: the decisions of every shard of ``decided``, in
    ``utt_id`` order (``shards`` in the order, at index ``positions``, their signals behind ``shard_handles``).
    ``key_loads``: filled with each decided shard's :class:`~.near_dup_candidates.AudioKeyLoad`, when given."""
    seconds = {} if seconds is None else seconds
    sizes = [len(outline.utt_ids) for outline in outlines]
    decided_ranks = [rank for rank, shard_id in enumerate(shards) if shard_id in decided]
    groups = _groups(decided_ranks, sizes, partitions)
    group_of_rank = np.full(len(shards), -1, np.int64)
    for g, ranks in enumerate(groups):
        group_of_rank[ranks] = g

    started = time.perf_counter()
    posting_tasks = [
        engine.submit(shard_postings, (shard_handles[rank], int(positions[rank]), partitions), returns=partitions)
        for rank in range(len(shards))
    ]
    _track(engine, "postings", [handles[0] for handles in posting_tasks], on_progress)
    seconds["postings"] = time.perf_counter() - started

    started = time.perf_counter()
    join_tasks = [
        engine.submit(
            join_partition,
            (positions, group_of_rank, len(groups), *[handles[part] for handles in posting_tasks]),
            returns=len(groups),
        )
        for part in range(partitions)
    ]
    _track(engine, "join", [handles[0] for handles in join_tasks], on_progress)
    seconds["join"] = time.perf_counter() - started

    started = time.perf_counter()
    decide_tasks = [
        engine.submit(
            decide_group,
            (engine, shard_handles, positions, ranks, thresholds, *[handles[g] for handles in join_tasks]),
        )
        for g, ranks in enumerate(groups)
    ]
    _track(engine, "decide", decide_tasks, on_progress)
    unresolved: dict[int, list[Decision]] = {}
    for handle in decide_tasks:
        for rank, (decisions, load) in engine.fetch(handle).items():
            unresolved[rank] = decisions
            if key_loads is not None:
                key_loads[shards[rank]] = load
    seconds["decide"] = time.perf_counter() - started
    return _resolve(shards, outlines, unresolved)


def _resolve(
    shards: list[str], outlines: list[ShardOutline], unresolved: dict[int, list[Decision]]
) -> dict[str, list[Decision]]:
    """Every decided shard's decisions with their representatives: a match's representative,
    resolved in the order (what an utterance matched comes before it, so one pass settles it)."""
    representative: dict[tuple[str, str], tuple[str, str]] = {}
    resolved: dict[str, list[Decision]] = {}
    for rank, outline in enumerate(outlines):
        if outline.representatives is not None:
            for utt_id, stored in zip(outline.utt_ids, outline.representatives, strict=True):
                representative[(outline.shard_id, utt_id)] = stored
            continue
        rows = []
        for decision in unresolved[rank]:
            if decision.kind is None or decision.kind in FLAG_KINDS:
                mine = (shards[rank], decision.utt_id)
            else:
                mine = representative[(decision.matched_shard, decision.matched_utt)]
            representative[(shards[rank], decision.utt_id)] = mine
            rows.append(dataclasses.replace(decision, representative_shard=mine[0], representative_utt=mine[1]))
        resolved[shards[rank]] = rows
    return resolved
