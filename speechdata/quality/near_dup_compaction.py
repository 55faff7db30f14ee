"""Where the near-duplicate index's merges run: small ones in the run of the shard that makes them
due, large ones in a compaction job of their own.

A shard's run merges only what creates a level up to :func:`inline_merge_level` (default 2: up to
``FANOUT``\\ :sup:`2` = 64 shards' postings), so its time and bytes written stay bounded by its own
size whatever the corpus. A merge creating a higher level (at 1 000 h the L3 merge rewrites about
6 GB, at 100 000 h an L5 merge about 400 GB) waits for :func:`compact_pending`, which the
``speechdata near-duplicates compact`` command and the Dagster ``near_duplicates_compaction_job``
run; the job's sensor launches it when :func:`merges_due` finds such a merge, reading only the
shard list's head and records (no segment). Merges never change a decision, so the schedule is
free: docs/near-duplicates.md, "Merges: in the shard's run and in the compaction job".
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from speechdata.io.shard_lock import EXCLUSIVE_CREATE_PROTOCOLS
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_merge
from speechdata.quality.near_dup_index_commit import _filter_relative, _segment_relative
from speechdata.quality.near_dup_index_merge import _level, compact_index
from speechdata.quality.near_dup_index_order import DEFAULT_LOCK_TIMEOUT_S, CorpusIndexBusy, IndexDamaged
from speechdata.quality.near_dup_order_directory import read_directory

INLINE_MERGE_LEVEL_ENV = "SPEECHDATA_NEAR_DUP_INLINE_MERGE_LEVEL"
DEFAULT_INLINE_MERGE_LEVEL = 2
"""The highest level a shard's own run creates: L2 holds 64 shards' postings (about 0.83 GB for shards
of 1 000 utterances), written once per 64 shards, so the demo and corpora up to 511 shards (about
750 h of 1.5 h shards) stay fully compacted with no job at all, and no shard's run ever rewrites more."""


def inline_merge_level() -> int:
    """``SPEECHDATA_NEAR_DUP_INLINE_MERGE_LEVEL``, else :data:`DEFAULT_INLINE_MERGE_LEVEL`: read at each
    call, the same value for every process sharing a data root (0: a shard's run merges nothing; any
    other value but ASCII digits: a ValueError naming the variable)."""
    value = os.environ.get(INLINE_MERGE_LEVEL_ENV, "").strip()
    if not value:
        return DEFAULT_INLINE_MERGE_LEVEL
    if not (value.isascii() and value.isdigit()):  # "²".isdigit() too, which int() refuses
        raise ValueError(f"{INLINE_MERGE_LEVEL_ENV}={value!r}: expected a whole level, 0 or more (default 2)")
    return int(value)


@dataclass(frozen=True)
class DueMerge:
    """A merge that is due: the ``FANOUT`` earliest of the ``waiting`` live segments of ``level``."""

    level: int
    inputs: tuple[str, ...]
    waiting: int

    @property
    def creates(self) -> int:
        return self.level + 1

    @property
    def key(self) -> str:
        """Names this merge (its inputs): the same merge due again has the same key."""
        return f"L{self.level}-{hashlib.sha256(' '.join(self.inputs).encode()).hexdigest()[:16]}"


def merges_due(data_root: DataRoot) -> list[DueMerge]:
    """Every level with at least ``FANOUT`` live segments, lowest first, each with the merge it is
    due. Reads the shard list's head, its records and the parts they touch (the head summarizes
    every other part's segments): no segment, nothing that grows with the shards listed. An index
    that reads as damaged has nothing due (the next shard's run repairs it)."""
    try:
        return _merges_due(data_root)
    except IndexDamaged:
        return []


def merges_due_above_or_damage(data_root: DataRoot, level: int | None = None) -> tuple[list[DueMerge], str | None]:
    """:func:`merges_due_above`, and why the shard list cannot be read (then nothing is due) or None,
    from the same reads: for the sensor's skip reason."""
    try:
        return _above(_merges_due(data_root), level), None
    except IndexDamaged as damaged:
        return [], str(damaged)


def _merges_due(data_root: DataRoot) -> list[DueMerge]:
    lowest = read_directory(data_root).lowest_positions()
    by_level: dict[int, list[str]] = {}
    for name in lowest:
        by_level.setdefault(_level(name), []).append(name)
    fanout = near_dup_index_merge.FANOUT
    return [
        DueMerge(level, tuple(sorted(names, key=lambda name: lowest[name])[:fanout]), len(names))
        for level, names in sorted(by_level.items())
        if len(names) >= fanout
    ]


def merges_due_above(data_root: DataRoot, level: int | None = None) -> list[DueMerge]:
    """The due merges creating a level above ``level`` (default :func:`inline_merge_level`): those no
    shard's run does, the compaction job's; and any due merge whose level has twice ``FANOUT`` live
    segments. A shard's run does one due merge of its levels per commit, so a level never gets there
    unless the shards' runs read a lower inline level than this process (the variable set
    differently for the sensor's daemon and the run workers): those merges are then the job's too."""
    return _above(merges_due(data_root), level)


def _above(due: list[DueMerge], level: int | None) -> list[DueMerge]:
    bound = inline_merge_level() if level is None else level
    overdue = 2 * near_dup_index_merge.FANOUT
    return [merge for merge in due if merge.creates > bound or merge.waiting >= overdue]


@dataclass(frozen=True)
class Merge:
    """One merge the job ran: the segment it wrote (with its key filter) from ``inputs`` of ``level``."""

    level: int
    segment: str
    bytes_read: int
    bytes_written: int
    seconds: float


@dataclass
class CompactionSummary:
    merges: list[Merge] = field(default_factory=list)
    still_due: list[DueMerge] = field(default_factory=list)
    seconds: float = 0.0

    def describe(self) -> str:
        levels = Counter(f"L{merge.level}->L{merge.level + 1}" for merge in self.merges)
        written = sum(merge.bytes_written for merge in self.merges) / 1e6
        done = ", ".join(f"{count} {what}" for what, count in sorted(levels.items())) or "no merge"
        due = (
            "; still due: " + ", ".join(f"L{d.level} ({d.waiting} segments)" for d in self.still_due)
            if self.still_due
            else "; nothing more is due"
        )
        return f"near-duplicates compact: {done}, {written:.1f} MB written in {self.seconds:.1f} s{due}"


def compact_pending(
    data_root: DataRoot,
    *,
    max_merges: int | None = None,
    on_progress: Callable[[str], None] | None = None,
    timeout_s: float = DEFAULT_LOCK_TIMEOUT_S,
    **lock_options,
) -> CompactionSummary:
    """Run every due merge, lowest level first, whatever its size (at most ``max_merges``; None: until
    none is due). Each merge streams outside the index lock and takes it only for its switch, so
    shards keep committing meanwhile; a shard committed during a merge keeps its own segment. A job
    killed anywhere leaves the index as it was or with one more merge switched in; the segments it
    wrote and never switched in, or switched out and never removed, are removed once an hour old by
    the next compaction or shard, under the index lock (:func:`~.near_dup_index_merge.compact_index`).
    A merge another compaction switched in first is not counted; one left due is said why.
    ``on_progress`` gets a line before and after each merge. Raises :class:`CorpusIndexBusy` naming
    what to do when the lock stayed taken."""
    report = on_progress or (lambda line: None)
    summary = CompactionSummary()
    started = time.perf_counter()
    if not (data_root.is_local or data_root.protocol in EXCLUSIVE_CREATE_PROTOCOLS):
        report(
            f"warning: the data root's store ({data_root.protocol}) has no exclusive create: each merge's switch "
            "runs without the index lock, so run this only while no near_duplicates step runs"
        )
    while max_merges is None or len(summary.merges) < max_merges:
        due = merges_due(data_root)
        read = _bytes_of(data_root, due[0].inputs) if due else 0
        if due:
            report(
                f"merging {len(due[0].inputs)} L{due[0].level} segments ({read / 1e6:.1f} MB) into one of "
                f"L{due[0].creates}"
            )
        merge_started = time.perf_counter()
        # Called even when nothing is due: it also removes the segments nobody names.
        try:
            merged = compact_index(data_root, timeout_s=timeout_s, **lock_options)
        except CorpusIndexBusy as busy:
            raise CorpusIndexBusy(
                f"{busy}; nothing was switched in: run the compaction again once that holder is done, or with a "
                "longer lock timeout (the merge is written again, the same segment)"
            ) from busy
        if merged is None:
            if due and due[0].key not in {other.key for other in merges_due(data_root)}:
                report(
                    f"those L{due[0].level} segments were merged or repaired meanwhile (another compaction, a repair)"
                )
                continue  # go on with what is due now
            if due:
                report(
                    f"left the L{due[0].level} merge due: an input or the order was unreadable or folded "
                    "meanwhile (the next shard's run repairs it), or its segment was swept before its switch"
                )
            break
        seconds = time.perf_counter() - merge_started
        written = _bytes_of(data_root, [merged])
        summary.merges.append(Merge(_level(merged) - 1, merged, read, written, seconds))
        report(f"merged into {merged}: {written / 1e6:.1f} MB written in {seconds:.1f} s")
    summary.still_due = merges_due(data_root)
    summary.seconds = time.perf_counter() - started
    return summary


def _bytes_of(data_root: DataRoot, segments) -> int:
    """The segments' and their key filters' bytes (a stat each; a segment gone meanwhile counts 0)."""
    total = 0
    for name in segments:
        for relative in (_segment_relative(name), _filter_relative(name)):
            with contextlib.suppress(FileNotFoundError):
                total += data_root.fs.size(data_root.path(relative))
    return total


__all__ = [
    "DEFAULT_INLINE_MERGE_LEVEL",
    "INLINE_MERGE_LEVEL_ENV",
    "CompactionSummary",
    "DueMerge",
    "Merge",
    "compact_pending",
    "inline_merge_level",
    "merges_due",
    "merges_due_above",
    "merges_due_above_or_damage",
]
