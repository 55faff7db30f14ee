"""The near-duplicate index's order as a snapshot (``shards.parquet``) and the records after it: one
record per reservation and commit, the snapshot rewritten every ``FOLD_EVERY`` records, a torn or
missing record detected and rebuilt by a repair, a fold killed halfway read as before, a reader
racing a fold reading the state after it. No audio: the order alone, through its own functions."""

import pyarrow.parquet as pq
import pytest

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_order as order
from speechdata.quality import near_dup_order_log as order_log
from speechdata.quality.near_dup_index import IndexDamaged, IndexedShard, read_state, reserve_position


def commit(root, reservation, version: str) -> IndexedShard:
    """A commit of the order alone (what :func:`commit_shard_entries` records, minus entries and segment)."""
    with order.corpus_index_lock(root):
        view = order._read_view(root)
        shard = IndexedShard(reservation.position, reservation.shard_id, version, 3, order.COMMITTED)
        if shard in view.shards:  # unchanged: nothing written
            return shard
        order._append(root, view, [shard])
        order._write_commit_record(root, shard)
    return shard


def index(root, shard_ids) -> None:
    for shard_id in shard_ids:
        with reserve_position(root, shard_id) as reservation:
            commit(root, reservation, f"v-{shard_id}")


def records(root) -> list[str]:
    return [path.rsplit("/", 1)[-1] for path in sorted(root.glob(f"{order.ORDER_LOG}/*.json"))]


def positions(root) -> list[tuple[int, str, str]]:
    return [(s.position, s.shard_id, s.state) for s in read_state(root)]


@pytest.fixture
def fold_every_4(monkeypatch):
    monkeypatch.setattr(order_log, "FOLD_EVERY", 4)


def test_each_reservation_and_commit_is_one_record_and_every_fourth_folds_the_snapshot(data_root, fold_every_4):
    index(data_root, ["a"])
    assert records(data_root) == ["000000000000.json", "000000000001.json"]
    assert not data_root.exists(layout.near_duplicates_index_order())
    with reserve_position(data_root, "b") as reservation:
        assert positions(data_root) == [(0, "a", "committed"), (1, "b", "reserved")]
        commit(data_root, reservation, "v-b")  # record 3: folded
    assert records(data_root) == []
    snapshot = pq.read_table(data_root.path(layout.near_duplicates_index_order()))
    assert snapshot.schema.metadata[order.THROUGH_KEY] == b"3"
    assert snapshot.column("shard_id").to_pylist() == ["a", "b"]
    index(data_root, ["c", "a"])  # a re-run keeps its position and writes nothing
    assert records(data_root) == ["000000000004.json", "000000000005.json"]
    assert positions(data_root) == [(0, "a", "committed"), (1, "b", "committed"), (2, "c", "committed")]


def test_the_folded_snapshot_is_byte_identical_in_a_second_root(tmp_path, fold_every_4):
    roots = [DataRoot(str(tmp_path / name)) for name in ("one", "two")]
    for root in roots:
        index(root, ["a", "b"])
    one, two = (root.fs.cat_file(root.path(layout.near_duplicates_index_order())) for root in roots)
    assert one == two


def test_a_dropped_reservation_is_withdrawn_when_last_and_recorded_otherwise(data_root):
    index(data_root, ["a"])
    with reserve_position(data_root, "ghost"):
        [ghost] = [s for s in read_state(data_root) if s.shard_id == "ghost"]
    order.drop_reservation(data_root, ghost)
    assert positions(data_root) == [(0, "a", "committed")]
    index(data_root, ["b"])
    assert positions(data_root) == [(0, "a", "committed"), (1, "b", "committed")]
    assert len(records(data_root)) == 4  # a: 2, b: 2; ghost's reservation was the last record: withdrawn
    with reserve_position(data_root, "ghost"):
        [ghost] = [s for s in read_state(data_root) if s.shard_id == "ghost"]
    with reserve_position(data_root, "c"):
        order.drop_reservation(data_root, ghost)  # not the last record: a record of its own
    assert len(records(data_root)) == 7
    assert positions(data_root) == [(0, "a", "committed"), (1, "b", "committed"), (3, "c", "reserved")]


@pytest.mark.parametrize("damage", ["torn", "missing"])
def test_a_torn_or_missing_record_is_detected_and_rebuilt_from_the_commit_records(data_root, damage):
    index(data_root, ["a", "b"])
    middle = data_root.path(f"{order.ORDER_LOG}/000000000001.json")
    if damage == "torn":
        data_root.fs.pipe_file(middle, data_root.fs.cat_file(middle)[:30])
    else:
        data_root.fs.rm_file(middle)
    with pytest.raises(IndexDamaged, match="order record"):
        read_state(data_root)
    # What repair_index does with the order (it also re-maps each shard to its segment).
    order._write_state(data_root, order._state_from_commit_records(data_root))
    assert [(s.position, s.shard_id) for s in read_state(data_root)] == [(0, "a"), (1, "b")]
    assert records(data_root) == []


def test_a_fold_killed_before_removing_its_records_reads_the_same_and_the_next_fold_removes_them(
    data_root, fold_every_4, monkeypatch
):
    rm_file = data_root.fs.rm_file

    def killed(path):
        if order.ORDER_LOG in path:
            raise KeyboardInterrupt("killed")
        return rm_file(path)

    monkeypatch.setattr(data_root.fs, "rm_file", killed)
    with pytest.raises(KeyboardInterrupt):
        index(data_root, ["a", "b"])
    monkeypatch.setattr(data_root.fs, "rm_file", rm_file)
    assert len(records(data_root)) == 4  # all folded into the snapshot, none removed
    assert positions(data_root) == [(0, "a", "committed"), (1, "b", "committed")]
    index(data_root, ["c", "d"])
    assert records(data_root) == []
    assert [s.shard_id for s in read_state(data_root)] == ["a", "b", "c", "d"]


def test_a_reader_racing_a_fold_reads_the_state_after_it(data_root, fold_every_4, monkeypatch):
    index(data_root, ["a"])
    stale = order._read_snapshot(data_root)  # before any fold: no snapshot
    index(data_root, ["b", "c"])  # folds through record 3, removes records 0-3, writes 4 and 5
    read_snapshot = order._read_snapshot
    reads = iter([stale])
    monkeypatch.setattr(order_log, "_read_snapshot", lambda root: next(reads, None) or read_snapshot(root))
    assert [s.shard_id for s in read_state(data_root)] == ["a", "b", "c"]


def test_the_head_a_writer_reads_agrees_with_the_whole_order(data_root, monkeypatch):
    monkeypatch.setattr(order_log, "FOLD_EVERY", 3)  # snapshots at varying points among the records
    for shard_id in ["a", "b", "c", "d", "e"]:
        with reserve_position(data_root, shard_id) as reservation:
            # b and d stay reserved (their runs gone) until the next shard has reserved after them.
            for gone in [s for s in read_state(data_root) if s.state == order.RESERVED and s.shard_id != shard_id]:
                order.drop_reservation(data_root, gone)
            if shard_id not in "bd":
                commit(data_root, reservation, f"v-{shard_id}")
        view = order._read_view(data_root)
        for asked in ["a", "b", "c", "d", "e", "never"]:
            head = order._read_head(data_root, asked)
            assert head.mine == next((s for s in view.shards if s.shard_id == asked), None)
            assert head.next_position == max(s.position for s in view.shards) + 1
            assert (head.through, head.last) == (view.through, view.last)
    assert positions(data_root) == [(0, "a", "committed"), (2, "c", "committed"), (4, "e", "committed")]
    assert data_root.exists(layout.near_duplicates_index_order())
    assert data_root.exists(layout.near_duplicates_index_order())
