"""The index reader of a new shard reads the shard list's head, its records and the parts they touch
or that hold its position, never the others (``IndexReader.parts_read``), and decides exactly as a
reader given every row: a shard re-indexed after its segment was merged leaves stale postings in
that segment, found by the counts (its part is read) and left out."""

from dataclasses import replace

import numpy as np
import pytest

from speechdata.quality import near_dup_order_fold as order_fold
from speechdata.quality.near_dup_index import (
    IndexReader,
    commit_shard_entries,
    index_keys,
    read_state,
    reserve_position,
    wait_for_earlier,
    write_index,
)
from speechdata.quality.near_dup_matching import Decision, NearDuplicateThresholds, decide_shard
from tests.unit.test_near_dup_filter import signals_of


@pytest.fixture(autouse=True)
def small_parts(monkeypatch):
    monkeypatch.setattr(order_fold, "FOLD_EVERY", 4)
    monkeypatch.setattr(order_fold, "PART_ROWS", 4)


def own(signals) -> list[Decision]:
    return [Decision(s.utt_id, s.shard_id, s.utt_id, None, 1.0) for s in signals]


def test_a_new_shard_reads_only_the_parts_it_needs_and_decides_as_with_every_row(data_root):
    rng = np.random.default_rng(7)
    corpus = [(f"s{n:03d}", signals_of(f"s{n:03d}", 3, rng)) for n in range(12)]
    write_index(data_root, [(shard_id, signals, own(signals)) for shard_id, signals in corpus])
    assert len({s.segment for s in read_state(data_root)}) == 5  # s000-s007 merged, then one each
    replaced = signals_of("s001", 3, rng)  # s001 re-indexed: its old postings stay in the merged segment
    with reserve_position(data_root, "s001") as reservation:
        commit_shard_entries(data_root, reservation, replaced, own(replaced))
    copies = signals_of("new", 2, rng, copies_of=corpus[1][1]) + signals_of("new", 2, rng, copies_of=corpus[5][1])
    new = [replace(s, utt_id=f"new-{n:03d}") for n, s in enumerate(copies)]
    with reserve_position(data_root, "new") as reservation:
        reader = IndexReader(data_root, reservation.position)
        reader.prefetch(index_keys(new, reservation.position)["key"])
        reader.settle(wait_for_earlier(data_root, reservation))
        decided = decide_shard(reservation.position, new, reader, NearDuplicateThresholds())
        every_row = IndexReader(data_root, reservation.position, read_state(data_root))
        assert decided == decide_shard(reservation.position, new, every_row, NearDuplicateThresholds())
        assert reader.utterances == every_row.utterances == 36
        assert reader.parts_read < 4  # of parts 0-3 (position 12: part 3)
    by_utt = {d.utt_id: d for d in decided}
    assert by_utt["new-000"].representative_shard == "new"  # a copy of s001's replaced utterance: stale
    assert by_utt["new-002"].representative_shard == "s005"
