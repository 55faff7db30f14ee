"""One writer per shard and product, and one at a time on the near-duplicate index (its reservations,
postings and repair too), on an S3 data root: the lock is an object created only if absent (moto's S3
server, as the bucket tests use)."""

import json
import os
import threading

import pytest

from speechdata.io.shard_lock import ShardLocked, data_root_lock, object_store_lock, shard_write_lock
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_index import INDEX_LOCK_KEY, INDEX_LOCK_PRODUCT, CorpusIndexBusy, corpus_index_lock

LOCK = "_locks/s1/raw_shards.lock"


@pytest.fixture
def s3_root(s3_bucket) -> DataRoot:
    return DataRoot(f"{s3_bucket}/root")


def write_lock(root: DataRoot, relative: str, body: bytes) -> None:
    root.fs.pipe_file(root.path(relative), body)


def holder_token(root: DataRoot, relative: str) -> str:
    return json.loads(root.fs.cat_file(root.path(relative)))["token"]


def test_an_s3_lock_refuses_a_second_holder_by_name_and_is_removed_by_its_holder(s3_root):
    with object_store_lock(s3_root, "s1", "raw_shards", run_id="run-1") as me:
        assert holder_token(s3_root, LOCK) == me.token
        with (
            pytest.raises(
                ShardLocked, match=rf"raw_shards is being written by another run \(pid {os.getpid()} on .*run run-1"
            ),
            object_store_lock(s3_root, "s1", "raw_shards", run_id="run-2"),
        ):
            pass
        assert holder_token(s3_root, LOCK) == me.token  # the refused attempt left it in place
        with object_store_lock(s3_root, "s1", "alignments"):
            pass  # one lock per product
    assert not s3_root.exists(LOCK)


def test_an_s3_lock_of_an_ended_run_or_half_written_is_taken_over_and_a_live_one_holds(s3_root):
    elsewhere = {"host": "pod-elsewhere", "pid": 1, "started_at": "then", "run_id": "run-gone", "token": "t"}
    write_lock(s3_root, LOCK, json.dumps(elsewhere).encode())
    with (
        pytest.raises(ShardLocked, match="pid 1 on pod-elsewhere, run run-gone"),
        shard_write_lock(s3_root, "s1", "raw_shards", run_id="run-2", run_ended=lambda run_id: False),
    ):
        pass
    with shard_write_lock(
        s3_root, "s1", "raw_shards", run_id="run-2", run_ended=lambda run_id: run_id == "run-gone"
    ) as me:
        assert holder_token(s3_root, LOCK) == me.token
    assert not s3_root.exists(LOCK)
    write_lock(s3_root, LOCK, b'{"host": ')  # its holder died between create and write
    with data_root_lock(s3_root, "s1", "raw_shards") as me:
        assert holder_token(s3_root, LOCK) == me.token


def test_two_takers_of_one_stale_s3_lock_never_both_hold_it(s3_root):
    elsewhere = {"host": "pod-elsewhere", "pid": 1, "started_at": "then", "run_id": "run-gone", "token": "t"}
    write_lock(s3_root, LOCK, json.dumps(elsewhere).encode())
    start, held, refused = threading.Barrier(4), [], []
    release = threading.Event()

    def take() -> None:
        start.wait()
        try:
            with object_store_lock(s3_root, "s1", "raw_shards", holder_finished=lambda h: h.run_id == "run-gone") as me:
                held.append(me.token)
                release.wait(30)
        except ShardLocked:
            refused.append(True)

    takers = [threading.Thread(target=take) for _ in range(4)]
    for taker in takers:
        taker.start()
    for _ in range(100):
        if len(held) + len(refused) == 4 or (held and len(refused) == 3):
            break
        threading.Event().wait(0.1)
    assert len(held) == 1 and len(refused) == 3, (held, refused)
    assert holder_token(s3_root, LOCK) == held[0]
    release.set()
    for taker in takers:
        taker.join(30)
    assert not s3_root.exists(LOCK)


def test_the_near_duplicate_index_is_locked_on_s3_and_a_second_indexer_gives_up_naming_the_holder(s3_root):
    with corpus_index_lock(s3_root) as holder:
        assert holder is not None
        assert s3_root.exists(f"_locks/{INDEX_LOCK_KEY}/{INDEX_LOCK_PRODUCT}.lock")
        with pytest.raises(CorpusIndexBusy, match=f"pid {holder.pid}"), corpus_index_lock(s3_root, timeout_s=0.5):
            pass
    with corpus_index_lock(s3_root, timeout_s=0.5) as again:
        assert again is not None and again.token != holder.token


def test_shards_are_reserved_decided_committed_and_repaired_on_s3(s3_root, monkeypatch):
    from speechdata.quality import near_dup_index, near_dup_index_order, near_dup_order_fold
    from speechdata.quality.near_dup_matching import NearDuplicateThresholds, decide_shard
    from speechdata.quality.near_dup_planted import planted_set
    from speechdata.quality.near_duplicates import utterance_signals

    monkeypatch.setattr(near_dup_order_fold, "FOLD_EVERY", 3)  # records 0-2 folded into the snapshot
    monkeypatch.setattr(near_dup_order_fold, "PART_ROWS", 1)  # a part per position
    planted = planted_set(3, seed=4)  # originals first: their copies land in the second shard
    shards = {"first": planted[:3], "second": planted[3:]}
    decided = {}
    for shard_id, utterances in shards.items():
        signals = sorted(
            (utterance_signals(shard_id, u.utt_id, u.samples, 24_000, u.text) for u in utterances),
            key=lambda s: s.utt_id,
        )
        with near_dup_index.reserve_position(s3_root, shard_id) as reservation:
            assert s3_root.exists(f"_locks/{INDEX_LOCK_KEY}/position-{reservation.position:012d}.lock")
            reader = near_dup_index.IndexReader(s3_root, reservation.position)
            reader.prefetch(near_dup_index.index_keys(signals, reservation.position)["key"])
            reader.settle(near_dup_index.wait_for_earlier(s3_root, reservation))
            decisions = decide_shard(reservation.position, signals, reader, NearDuplicateThresholds())
            near_dup_index.commit_shard_entries(s3_root, reservation, signals, decisions)
        decided[shard_id] = {d.utt_id: d.representative_shard for d in decisions if d.kind}
    assert decided["first"] == {} and set(decided["second"].values()) == {"first"}
    assert [s.shard_id for s in near_dup_index.read_order(s3_root)] == ["first", "second"]
    # The snapshot (a head and a part per position) holds records 0-2; record 3 (second's commit) follows it.
    [record] = s3_root.glob(f"{near_dup_index_order.ORDER_LOG}/*.json")
    assert record.endswith("000000000003.json")
    assert len(near_dup_index_order._listed_parts(s3_root)) == 2
    # A torn record, then a torn part, then a torn head, on S3: each rebuilt from the commit records,
    # positions kept.
    for which in ("record", "part", "head"):
        torn = {
            "record": record,
            "part": min(near_dup_index_order._listed_parts(s3_root).values()),
            "head": s3_root.path(near_dup_index_order.HEAD),
        }[which]
        s3_root.fs.pipe_file(torn, s3_root.fs.cat_file(torn)[:40])
        assert "rebuilt shards.parquet" in near_dup_index.repair_index(s3_root)[0]
        assert [(s.position, s.shard_id) for s in near_dup_index.read_order(s3_root)] == [(0, "first"), (1, "second")]
        assert not s3_root.glob(f"{near_dup_index_order.ORDER_LOG}/*.json")
