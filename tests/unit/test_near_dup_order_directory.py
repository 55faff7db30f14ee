"""What a new shard's run reads of the near-duplicate shard list (``ShardDirectory``): the head with
each part's summary, the records and the part holding its position, never another part; its
committed utterances and rows per segment before any position agree with every row read whole;
a shard re-listed at a new position drops its earlier row in the same record; a head written
before summaries is read whole and given them by the next fold. No audio: the order alone."""

import pytest

from speechdata.io import layout
from speechdata.quality import near_dup_index_order as order
from speechdata.quality import near_dup_order_fold as order_fold
from speechdata.quality import near_dup_order_log as order_log
from speechdata.quality.near_dup_index import IndexedShard, read_state, reserve_position
from speechdata.quality.near_dup_order_directory import read_directory


@pytest.fixture(autouse=True)
def small_parts(monkeypatch):
    monkeypatch.setattr(order_fold, "FOLD_EVERY", 4)
    monkeypatch.setattr(order_fold, "PART_ROWS", 4)


def index(root, shard_id: str, segment: str, utterances: int) -> IndexedShard:
    with reserve_position(root, shard_id) as reservation, order.corpus_index_lock(root):
        head = order._read_head(root, shard_id)
        shard = IndexedShard(reservation.position, shard_id, f"v-{segment}", utterances, order.COMMITTED, segment)
        order._write_commit_record(root, shard)
        order._append(root, head, [shard])
    return shard


def whole_before(root, position: int) -> tuple[int, dict[str, dict[int, int]]]:
    """Committed utterances and rows per segment (per part of 4) before ``position``, from every row."""
    utterances, segments = 0, {}
    for shard in read_state(root):
        if shard.state == order.COMMITTED and shard.position < position:
            utterances += shard.utterances
            by_part = segments.setdefault(shard.segment, {})
            by_part[shard.position // 4] = by_part.get(shard.position // 4, 0) + 1
    return utterances, segments


def test_a_new_shard_reads_only_its_own_part_and_what_the_records_touch_and_agrees_with_every_row(
    data_root, monkeypatch
):
    for n in range(18):  # level-1 segments of 8 shards, then level-0 ones; one shard re-indexed
        index(data_root, f"s{n:02d}", f"L1-{n // 8}" if n < 16 else f"L0-{n}", 100 + n)
    index(data_root, "s05", "L0-s05-again", 7)  # keeps position 5: part 1 now maps to two segments
    with reserve_position(data_root, "late") as reservation:
        cat_file, read = data_root.fs.cat_file, []
        monkeypatch.setattr(data_root.fs, "cat_file", lambda path: read.append(path) or cat_file(path))
        directory = read_directory(data_root, reservation.position)
        parts_read = {path.rsplit("/", 1)[-1][:8] for path in read if f"/{order.PARTS}/" in path}
        touched = {s.position // 4 for upserts, _ in directory.log.changes for s in upserts}
        assert parts_read == {f"{part:08d}" for part in touched | {reservation.position // 4}}
        assert len(parts_read) < len(directory.log.head.parts)
        monkeypatch.undo()
        for position in [0, 3, 4, 5, 6, 13, 16, 17, reservation.position]:
            directory = read_directory(data_root, position)
            assert (directory.utterances(position), directory.segments(position)) == whole_before(data_root, position)
        assert list(read_directory(data_root)) == read_state(data_root)  # as a sequence: every row


def test_a_shard_re_listed_after_losing_its_commit_record_drops_its_earlier_row_in_the_same_record(data_root):
    for n, shard_id in enumerate(["a", "b", "c", "d"]):  # folded: part 0 holds a-d
        index(data_root, shard_id, f"L0-{shard_id}", 10 + n)
    data_root.write_bytes(layout.near_duplicates("b"), b"its decisions file")
    data_root.fs.rm_file(data_root.path(order._commit_record_relative("b")))
    index(data_root, "b", "L0-b-again", 5)  # taken for a new shard: indexed again at the end
    assert [(s.position, s.shard_id) for s in read_state(data_root)] == [(0, "a"), (2, "c"), (3, "d"), (4, "b")]
    last = order_log._read_log(data_root).changes[0]
    assert last[1] == [1] and [s.shard_id for s in last[0]] == ["b"]  # its reservation dropped position 1
    for position in range(6):
        directory = read_directory(data_root, position)
        assert (directory.utterances(position), directory.segments(position)) == whole_before(data_root, position)


def test_a_head_written_before_part_summaries_is_read_whole_then_given_them_by_the_next_fold(data_root):
    for n in range(8):
        index(data_root, f"s{n}", f"L0-{n}", 3)
    body = order_log._unsealed(data_root.fs.cat_file(data_root.path(order.HEAD)))
    del body["summary"]
    data_root.write_bytes(order.HEAD, order_log._sealed(body))
    directory = read_directory(data_root, 8)
    assert directory.loaded == {0} and directory.utterances(8) == 24  # every row, as one part
    for n in range(8, 10):  # 4 records: one fold, which rewrites every part with its summary
        index(data_root, f"s{n}", f"L0-{n}", 3)
    assert sorted(order_log._unsealed(data_root.fs.cat_file(data_root.path(order.HEAD)))["summary"]) == [
        "00000000",
        "00000001",
        "00000002",
    ]
    assert read_directory(data_root, 10).utterances(10) == 30
