"""What a new shard's run reads of the near-duplicate shard list (``ShardDirectory``): the head with
each part's summary, the records and the part holding its position, never another part; its
committed utterances and rows per segment before any position agree with every row read whole;
a shard whose commit record is lost after its run was killed keeps its position (never listed
twice); a head written before summaries is read whole and given them by the next fold. No audio: the order alone."""

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


def test_a_shard_killed_after_its_commit_whose_commit_record_is_lost_keeps_its_position_listed_once(
    data_root, monkeypatch
):
    """A run killed after committing, before its decisions file: its order record folded away by 64
    other commits, its commit record then lost. Its re-run finds its row through the parts' membership
    filters (reading that part alone) and keeps its position: never listed twice, so no part's
    summary counts a row the shard list no longer has."""
    index(data_root, "killed", "L0-killed", 9)  # committed; no decisions file written
    with order.corpus_index_lock(data_root):  # 64 other commits: their order records alone
        for n in range(64):
            head = order._read_head(data_root, f"s{n:02d}")
            shard = IndexedShard(head.next_position, f"s{n:02d}", f"v-{n}", 1 + n % 3, order.COMMITTED, f"L0-{n}")
            order._append(data_root, head, [shard])
    assert not any(s.shard_id == "killed" for upserts, _ in order_log._read_log(data_root).changes for s in upserts)
    data_root.fs.rm_file(data_root.path(order._commit_record_relative("killed")))
    assert not data_root.exists(layout.near_duplicates("killed"))
    cat_file, read = data_root.fs.cat_file, []
    monkeypatch.setattr(data_root.fs, "cat_file", lambda path: read.append(path) or cat_file(path))
    with reserve_position(data_root, "killed") as reservation:
        assert (reservation.recommit, reservation.position) == (True, 0)
        assert {path.rsplit("/", 1)[-1][:8] for path in read if f"/{order.PARTS}/" in path} == {"00000000"}
    monkeypatch.undo()
    index(data_root, "killed", "L0-killed", 9)  # its commit again: the same row
    assert [s.shard_id for s in read_state(data_root)].count("killed") == 1
    for position in [0, 1, 30, 64, 65]:
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
