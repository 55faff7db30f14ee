"""The near-duplicate index's order as a partitioned snapshot (``shard_list/``: a head and parts by a
hash of the shard id) and the records after it: one record per reservation and commit, the parts the
records touch rewritten every ``FOLD_EVERY`` records, a reservation reading only its own part, a
torn or missing record, part or head detected and rebuilt by a repair, a fold killed anywhere read as
before, a reader racing a fold reading the state after it, an index of the earlier layout taken
over. No audio: the order alone, through its own functions."""

import pyarrow as pa
import pytest

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_order as order
from speechdata.quality import near_dup_order_fold as order_fold
from speechdata.quality import near_dup_order_log as order_log
from speechdata.quality import near_dup_order_members as order_members
from speechdata.quality.near_dup_index import IndexDamaged, IndexedShard, read_state, reserve_position


def commit(root, reservation, version: str) -> IndexedShard:
    """A commit of the order alone (what :func:`commit_shard_entries` records, minus entries and segment)."""
    with order.corpus_index_lock(root):
        head = order._read_head(root, reservation.shard_id)
        shard = IndexedShard(reservation.position, reservation.shard_id, version, 3, order.COMMITTED)
        if head.mine == shard:  # unchanged: nothing written
            return shard
        order._write_commit_record(root, shard)
        order._append(root, head, [shard])
    return shard


def index(root, shard_ids) -> None:
    for shard_id in shard_ids:
        with reserve_position(root, shard_id) as reservation:
            commit(root, reservation, f"v-{shard_id}")


def records(root) -> list[str]:
    return [path.rsplit("/", 1)[-1] for path in sorted(root.glob(f"{order.ORDER_LOG}/*.json"))]


def parts(root) -> list[str]:
    return sorted(order._listed_parts(root))


def head(root) -> dict:
    return order_log._unsealed(root.fs.cat_file(root.path(order.HEAD)))


def positions(root) -> list[tuple[int, str, str]]:
    return [(s.position, s.shard_id, s.state) for s in read_state(root)]


@pytest.fixture
def fold_every_4(monkeypatch):
    monkeypatch.setattr(order_fold, "FOLD_EVERY", 4)
    monkeypatch.setattr(order_fold, "PART_ROWS", 4)


def test_each_reservation_and_commit_is_one_record_and_every_fourth_folds_into_the_parts(data_root, fold_every_4):
    index(data_root, ["a"])
    assert records(data_root) == ["000000000000.json", "000000000001.json"]
    assert not data_root.exists(order.HEAD) and parts(data_root) == []
    with reserve_position(data_root, "b") as reservation:
        assert positions(data_root) == [(0, "a", "committed"), (1, "b", "reserved")]
        commit(data_root, reservation, "v-b")  # record 3: folded
    assert records(data_root) == []
    assert head(data_root)["through"] == 3 and head(data_root)["next_position"] == 2
    assert list(head(data_root)["parts"]) == ["00000000"]  # positions 0-3
    assert sorted(head(data_root)["parts"].values()) == parts(data_root)
    listed = pa.concat_tables(data_root.read_parquet(f"{order.PARTS}/{name}") for name in parts(data_root))
    assert sorted(listed.column("shard_id").to_pylist()) == ["a", "b"]
    index(data_root, ["c", "a"])  # a re-run keeps its position and writes nothing
    assert records(data_root) == ["000000000004.json", "000000000005.json"]
    assert positions(data_root) == [(0, "a", "committed"), (1, "b", "committed"), (2, "c", "committed")]


def test_a_fold_rewrites_only_the_parts_its_records_touch(data_root, fold_every_4, tmp_path):
    earlier = [f"s{n:02d}" for n in range(30)]
    index(data_root, earlier)  # 60 records: folded 15 times, positions 0-29 in parts of 4
    before = head(data_root)["parts"]
    assert len(before) == 8
    index(data_root, ["new-1", "new-2"])  # positions 30 and 31: 4 records, one fold
    after = head(data_root)["parts"]
    assert {part for part in after if after[part] != before.get(part)} == {"00000007"}
    assert parts(data_root) == sorted(after.values())  # the replaced part is gone
    assert [s.shard_id for s in read_state(data_root)] == [*earlier, "new-1", "new-2"]
    # The parts a fold rewrote are the bytes a whole write of the same rows gives.
    whole = DataRoot(str(tmp_path / "whole"))
    order._write_state(whole, read_state(data_root))
    assert {name: whole.fs.cat_file(path) for name, path in order._listed_parts(whole).items()} == {
        name: data_root.fs.cat_file(path) for name, path in order._listed_parts(data_root).items()
    }


def test_a_reservation_reads_no_part_and_a_re_run_the_one_holding_its_position(data_root, fold_every_4, monkeypatch):
    index(data_root, [f"s{n:02d}" for n in range(12)])
    assert len(parts(data_root)) == 3
    cat_file, read = data_root.fs.cat_file, []
    monkeypatch.setattr(data_root.fs, "cat_file", lambda path: read.append(path) or cat_file(path))
    with reserve_position(data_root, "late") as reservation:
        commit(data_root, reservation, "v-late")
    assert not [path for path in read if f"/{order.PARTS}/" in path]
    # The head once before the index lock (with the parts' membership filters: no part lists it),
    # once under it (the filters' answer kept: not read again) and once for the commit.
    heads = [n for n, path in enumerate(read) if path.endswith(order.HEAD)]
    filters = [n for n, path in enumerate(read) if f"/{order_members.MEMBERS}/" in path]
    assert len(heads) == 3 and len(filters) == 1 and heads[0] < filters[0] < heads[1]
    read.clear()
    with reserve_position(data_root, "s05") as reservation:  # folded long ago, at position 5
        assert reservation.recommit and reservation.position == 5
        commit(data_root, reservation, "v-s05-again")
    assert sorted({path.rsplit("/", 1)[-1][:8] for path in read if f"/{order.PARTS}/" in path}) == ["00000001"]
    assert [s.entries_version for s in read_state(data_root) if s.shard_id == "s05"] == ["v-s05-again"]


def test_the_folded_snapshot_is_byte_identical_in_a_second_root(tmp_path, fold_every_4):
    roots = [DataRoot(str(tmp_path / name)) for name in ("one", "two")]
    for root in roots:
        index(root, ["a", "b", "c", "d"])
    one, two = (
        {path: root.fs.cat_file(root.path(path)) for path in [order.HEAD, *map(order_log._part_relative, parts(root))]}
        for root in roots
    )
    assert one == two and len(one) == 2


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


@pytest.mark.parametrize("damage", ["torn record", "missing record", "torn part", "missing part", "torn head"])
def test_a_torn_or_missing_part_of_the_order_is_detected_and_rebuilt_from_the_commit_records(
    data_root, fold_every_4, damage
):
    index(data_root, ["a", "b", "c"])  # records 0-3 folded, 4-5 after the head
    what, kind = damage.split()
    path = {
        "record": data_root.path(f"{order.ORDER_LOG}/000000000004.json"),  # 5 follows it
        "part": order._listed_parts(data_root)[parts(data_root)[0]],
        "head": data_root.path(order.HEAD),
    }[kind]
    if what == "torn":
        data_root.fs.pipe_file(path, data_root.fs.cat_file(path)[:30])
    else:
        data_root.fs.rm_file(path)
    with pytest.raises(IndexDamaged, match=kind):
        read_state(data_root)
    # What repair_index does with the order (it also re-maps each shard to its segment).
    order._write_state(data_root, order._state_from_commit_records(data_root))
    assert [(s.position, s.shard_id) for s in read_state(data_root)] == [(0, "a"), (1, "b"), (2, "c")]
    assert records(data_root) == []


def test_a_lost_head_with_no_record_after_it_is_damage_not_an_empty_order(data_root, fold_every_4):
    index(data_root, ["a", "b"])
    data_root.fs.rm_file(data_root.path(order.HEAD))
    with pytest.raises(IndexDamaged, match="head"):
        read_state(data_root)


@pytest.mark.parametrize("killed_at", ["head", "records"])
def test_a_fold_killed_before_its_head_or_its_removals_reads_the_same_and_the_next_fold_cleans_up(
    data_root, fold_every_4, monkeypatch, killed_at
):
    write_bytes, rm_file = data_root.write_bytes, data_root.fs.rm_file

    def killed_writing(relative, content):
        if relative == order.HEAD:
            raise KeyboardInterrupt("killed")
        return write_bytes(relative, content)

    def killed_removing(path):
        if order.ORDER_LOG in path:
            raise KeyboardInterrupt("killed")
        return rm_file(path)

    index(data_root, ["a", "b"])
    if killed_at == "head":
        monkeypatch.setattr(data_root, "write_bytes", killed_writing)
    else:
        monkeypatch.setattr(data_root.fs, "rm_file", killed_removing)
    with pytest.raises(KeyboardInterrupt):
        index(data_root, ["c", "d"])
    monkeypatch.undo()
    monkeypatch.setattr(order_fold, "FOLD_EVERY", 4)
    monkeypatch.setattr(order_fold, "PART_ROWS", 4)
    assert len(records(data_root)) == 4  # the fold's records are all there
    assert positions(data_root)[:3] == [(0, "a", "committed"), (1, "b", "committed"), (2, "c", "committed")]
    index(data_root, ["d", "e", "f", "g"])  # the next fold removes what the killed one left
    assert parts(data_root) == sorted(head(data_root)["parts"].values())
    assert all(int(record[:-5]) > head(data_root)["through"] for record in records(data_root))
    assert [s.shard_id for s in read_state(data_root)] == ["a", "b", "c", "d", "e", "f", "g"]


def test_a_reader_racing_a_fold_reads_the_state_after_it(data_root, fold_every_4, monkeypatch):
    index(data_root, ["a", "b"])
    stale = order_log._read_base(data_root)  # the head through record 3
    index(data_root, ["c", "d", "e"])  # folds through record 7 (removes records 4-7), then records 8 and 9
    read_base = order_log._read_base
    reads = iter([stale])
    monkeypatch.setattr(order_log, "_read_base", lambda root: next(reads, None) or read_base(root))
    assert [s.shard_id for s in read_state(data_root)] == ["a", "b", "c", "d", "e"]


def test_an_index_of_the_earlier_layout_is_read_and_taken_over_by_the_next_record(data_root, fold_every_4):
    earlier = [IndexedShard(p, f"old-{p}", f"v{p}", 3, order.COMMITTED, f"L0-{p}.seg") for p in range(5)]
    table = pa.Table.from_pylist([order._row_of(s) for s in earlier], schema=order.ORDER_SCHEMA)
    data_root.write_parquet(
        layout.near_duplicates_index_order(), table.replace_schema_metadata({order.THROUGH_KEY: b"6"})
    )
    data_root.write_bytes(  # a record after it, as the earlier code wrote them: positions alone
        f"{order.ORDER_LOG}/000000000007.json", order._sealed({"seq": 7, "upsert": [], "remove": [4]})
    )
    assert read_state(data_root) == earlier[:4]
    index(data_root, ["new"])
    assert not data_root.exists(layout.near_duplicates_index_order()) and head(data_root)["through"] == 8
    assert [(s.position, s.shard_id) for s in read_state(data_root)][-2:] == [(3, "old-3"), (5, "new")]
    assert records(data_root) == ["000000000009.json"]


def test_the_head_a_writer_reads_agrees_with_the_whole_order(data_root, monkeypatch):
    monkeypatch.setattr(order_fold, "FOLD_EVERY", 3)  # snapshots at varying points among the records
    monkeypatch.setattr(order_fold, "PART_ROWS", 2)
    for shard_id in ["a", "b", "c", "d", "e"]:
        with reserve_position(data_root, shard_id) as reservation:
            # b and d stay reserved (their runs gone) until the next shard has reserved after them.
            for gone in [s for s in read_state(data_root) if s.state == order.RESERVED and s.shard_id != shard_id]:
                order.drop_reservation(data_root, gone)
            if shard_id not in "bd":
                commit(data_root, reservation, f"v-{shard_id}")
        view = order._read_view(data_root)
        assert order.read_reserved(data_root) == [s for s in view.shards if s.state == order.RESERVED]
        for asked in ["a", "b", "c", "d", "e", "never"]:
            head = order._read_head(data_root, asked)
            assert head.mine == next((s for s in view.shards if s.shard_id == asked), None)
            assert head.next_position == max(s.position for s in view.shards) + 1
            assert (head.through, head.last) == (view.through, view.last)
    assert positions(data_root) == [(0, "a", "committed"), (2, "c", "committed"), (4, "e", "committed")]
    assert data_root.exists(order.HEAD)


def test_a_re_run_whose_commit_record_is_torn_or_lost_keeps_its_position_reading_only_its_own_part(
    data_root, fold_every_4, monkeypatch
):
    monkeypatch.setattr(order_fold, "PART_ROWS", 2)
    index(data_root, ["a", "b", "c", "d", "e", "f"])  # folded: parts 0-2 hold a-f
    torn = data_root.path(order._commit_record_relative("a"))
    data_root.fs.pipe_file(torn, data_root.fs.cat_file(torn)[:20])
    data_root.fs.rm_file(data_root.path(order._commit_record_relative("c")))
    cat_file, read = data_root.fs.cat_file, []
    monkeypatch.setattr(data_root.fs, "cat_file", lambda path: read.append(path) or cat_file(path))
    for shard_id, position in [("a", 0), ("c", 2), ("new", 6)]:
        read.clear()
        with reserve_position(data_root, shard_id) as reservation:  # its row found by the parts' filters
            parts_read = sorted({path.rsplit("/", 1)[-1][:8] for path in read if f"/{order.PARTS}/" in path})
            assert parts_read == ([] if shard_id == "new" else [f"{position // 2:08d}"])
            assert (reservation.recommit, reservation.position) == (shard_id != "new", position)
            commit(data_root, reservation, f"v-{shard_id}")
    monkeypatch.undo()
    assert [s.shard_id for s in read_state(data_root)] == ["a", "b", "c", "d", "e", "f", "new"]
