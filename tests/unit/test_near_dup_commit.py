"""Committing a shard to the near-duplicate index (speechdata.quality.near_dup_index_commit): its
level-0 segment and key filter are written before the index lock, so the lock is held for the
records only; a run killed between the two re-runs to the clean index, and a segment no commit
ever names is removed once old. Its postings are built once and give the same decisions as the
ones the decision and the commit built for themselves."""

import contextlib
import os
import shutil
import time

import numpy as np
import pytest

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_commit, near_dup_index_merge
from speechdata.quality.near_dup_index import (
    IndexReader,
    commit_shard_entries,
    compact_index,
    read_order,
    reserve_position,
    wait_for_earlier,
)
from speechdata.quality.near_dup_index_order import _commit_record_relative
from speechdata.quality.near_dup_matching import NearDuplicateThresholds, decide_shard
from speechdata.quality.near_dup_postings import index_keys
from tests.index_journal import without_order_records
from tests.unit.test_near_dup_filter import index_of, signals_of


class Killed(BaseException):
    """A run killed at that point."""


def index_shard(data_root, signals, *, own_postings: bool = True):
    """Reserve, decide and commit one shard as the stage does (its postings built once, or, with
    ``own_postings`` False, by the decision and the commit themselves); its decisions."""
    with reserve_position(data_root, signals[0].shard_id) as reservation:
        reader = IndexReader(data_root, reservation.position, wait_for_earlier(data_root, reservation))
        if not own_postings:
            decisions = decide_shard(reservation.position, signals, reader, NearDuplicateThresholds())
            commit_shard_entries(data_root, reservation, signals, decisions)
            return decisions
        own = index_keys(signals, reservation.position)
        decisions = decide_shard(reservation.position, signals, reader, NearDuplicateThresholds(), own_postings=own)
        commit_shard_entries(data_root, reservation, signals, decisions, postings=own)
        return decisions


def index_files(data_root) -> dict[str, bytes]:
    """Every file of the index but its lock files, by path relative to the root; the shard list's
    journal compared by what it folds to (tests/index_journal.py)."""
    base = data_root.path("").rstrip("/") + "/"
    files = {
        path.removeprefix(base): data_root.fs.cat_file(path)
        for path in data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/**")
        if data_root.fs.isfile(path)
    }
    return without_order_records(files)


def segment_files(data_root) -> list[str]:
    return sorted(path.rsplit("/", 1)[-1] for path in data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*"))


@pytest.fixture
def corpus(tmp_path):
    """Two identical indexes of three shards, and a new shard copying one of their utterances."""
    rng = np.random.default_rng(11)
    roots = [DataRoot(str(tmp_path / "clean")), DataRoot(str(tmp_path / "killed"))]
    indexed = index_of(roots[0], 3, rng)
    shutil.copytree(tmp_path / "clean", tmp_path / "killed")
    return roots, signals_of("new", 4, rng, copies_of=indexed[1][1])


def test_the_level0_segment_and_its_filter_are_written_before_the_index_lock(corpus, monkeypatch):
    (root, _), new = corpus
    held, written_while_held = [], []
    lock = near_dup_index_commit.corpus_index_lock

    @contextlib.contextmanager
    def noted(*args, **kwargs):
        with lock(*args, **kwargs) as holder:
            held.append(True)
            try:
                yield holder
            finally:
                held.pop()

    write_level0 = near_dup_index_commit._write_level0
    monkeypatch.setattr(near_dup_index_commit, "corpus_index_lock", noted)
    monkeypatch.setattr(
        near_dup_index_commit,
        "_write_level0",
        lambda *args, **kwargs: written_while_held.append(bool(held)) or write_level0(*args, **kwargs),
    )
    index_shard(root, new)
    assert written_while_held == [False]
    [shard] = [s for s in read_order(root) if s.shard_id == "new"]
    assert {shard.segment, f"{shard.segment}.filter"} <= set(segment_files(root))


def test_a_run_killed_between_its_level0_segment_and_its_commit_reruns_to_the_clean_index(corpus, monkeypatch):
    (clean, killed), new = corpus
    expected = index_shard(clean, new)
    before = set(segment_files(killed))

    @contextlib.contextmanager
    def killed_at_the_lock(*args, **kwargs):
        raise Killed("after its level-0 segment, before its commit")
        yield

    with monkeypatch.context() as kill, pytest.raises(Killed):
        kill.setattr(near_dup_index_commit, "corpus_index_lock", killed_at_the_lock)
        index_shard(killed, new)
    left = set(segment_files(killed)) - before
    assert len(left) == 2 and "new" not in {s.shard_id for s in read_order(killed)}  # a segment no row names
    assert index_shard(killed, new) == expected
    assert index_files(killed) == index_files(clean)


def test_a_killed_runs_level0_segment_an_hour_old_is_not_removed_between_the_reruns_write_and_commit(
    corpus, monkeypatch
):
    (clean, killed), new = corpus
    index_shard(clean, new)

    def killed_at_the_commit(*args, **kwargs):
        raise Killed("after its level-0 segment, before its commit")

    with monkeypatch.context() as kill, pytest.raises(Killed):
        kill.setattr(near_dup_index_commit, "_write_commit_record", killed_at_the_commit)
        index_shard(killed, new)
    for path in killed.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*"):
        os.utime(path, (time.time() - 2 * near_dup_index_merge.ORPHAN_GRACE_S,) * 2)
    lock = near_dup_index_commit.corpus_index_lock

    @contextlib.contextmanager
    def merge_checks_first(*args, **kwargs):  # another shard's merge, between the write and the commit
        compact_index(killed)
        with lock(*args, **kwargs) as holder:
            yield holder

    monkeypatch.setattr(near_dup_index_commit, "corpus_index_lock", merge_checks_first)
    index_shard(killed, new)
    assert index_files(killed) == index_files(clean)


def test_a_level0_segment_no_commit_names_is_removed_once_old(corpus, monkeypatch):
    (root, _), new = corpus
    before = set(segment_files(root))

    def killed_at_the_commit(*args, **kwargs):
        raise Killed("after its level-0 segment, before its commit")

    with monkeypatch.context() as kill, pytest.raises(Killed):
        kill.setattr(near_dup_index_commit, "_write_commit_record", killed_at_the_commit)
        index_shard(root, new)
    assert len(set(segment_files(root)) - before) == 2
    compact_index(root)
    assert len(set(segment_files(root)) - before) == 2  # young: it may be a commit on its way
    monkeypatch.setattr(near_dup_index_merge, "ORPHAN_GRACE_S", 0.0)
    compact_index(root)
    assert set(segment_files(root)) == before


def test_a_rerun_that_changes_nothing_writes_no_level0_segment(corpus, monkeypatch):
    (root, _), new = corpus
    monkeypatch.setattr(near_dup_index_merge, "FANOUT", 2)
    decisions = index_shard(root, new)
    while compact_index(root):
        pass
    [shard] = [s for s in read_order(root) if s.shard_id == "new"]
    assert not shard.segment.startswith("L0-")  # merged: its level-0 segment is gone
    files = index_files(root)
    assert index_shard(root, new) == decisions
    assert index_files(root) == files
    # Its commit record lost: the re-run cannot tell before the lock, writes a level-0 segment,
    # finds under the lock that nothing changed, and removes it.
    root.fs.rm_file(root.path(_commit_record_relative("new")))
    assert index_shard(root, new) == decisions
    assert index_files(root) == files


def test_postings_built_once_decide_and_commit_as_those_built_by_each(corpus):
    (with_own, built_by_each), new = corpus
    assert index_shard(with_own, new) == index_shard(built_by_each, new, own_postings=False)
    assert index_files(with_own) == index_files(built_by_each)
