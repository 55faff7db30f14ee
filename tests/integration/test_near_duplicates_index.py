"""The near-duplicate index as parts: a torn order or a damaged segment rebuilt by the next run, a
dead shard's reservation dropped and a live one waited for (and what it commits seen), segments merged without changing a
decision, an overlong utterance left unchecked with its reason, and the index path deciding as the
in-memory one does (what a batch pass relies on)."""

import threading
import time

import pyarrow as pa
import pytest

from speechdata.io import layout
from speechdata.quality import (
    near_dup_filter,
    near_dup_index,
    near_dup_index_merge,
    near_dup_index_order,
    near_dup_order_fold,
    near_dup_order_members,
    near_dup_postings,
    near_duplicates,
)
from speechdata.quality.fingerprint_envelope import envelope_band_keys
from speechdata.quality.near_dup_index import (
    CorpusIndexBusy,
    IndexedShard,
    IndexReader,
    read_order,
    read_state,
    write_index,
)
from speechdata.quality.near_dup_matching import NearDuplicateThresholds, decide_shard, find_representatives
from speechdata.quality.near_dup_planted import planted_set
from speechdata.quality.near_duplicates import run_near_duplicates, shard_signals, utterance_signals
from tests.integration.test_near_duplicates_assets import encoded, land_and_normalize, land_two_shards, rows_of, voice


@pytest.fixture
def two_shards(data_root):
    return land_two_shards(data_root)


B_VERDICTS = {"b-0-mp3": "a", "b-2-trimmed": "b", "b-3-same-words": "a"}


def verdicts(root, shard_id: str) -> dict[str, str]:
    return {row["utt_id"]: row["representative_shard"] for row in rows_of(root, shard_id)}


def segments(root) -> list[str]:
    return sorted(root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*.seg"))


def test_a_torn_order_is_rebuilt_by_the_next_run_with_every_position_kept(two_shards):
    root = two_shards
    run_near_duplicates(root, "a")
    run_near_duplicates(root, "b")
    expected = root.fs.cat_file(root.path(layout.near_duplicates("b")))
    [*_, last_record] = sorted(root.glob(f"{near_dup_index_order.ORDER_LOG}/*.json"))  # b's commit
    torn = root.fs.cat_file(last_record)
    root.fs.pipe_file(last_record, torn[: len(torn) // 2])
    again = run_near_duplicates(root, "b")
    assert again.repairs and "rebuilt shards.parquet" in again.repairs[0]
    assert [(s.position, s.shard_id) for s in read_order(root)] == [(0, "a"), (1, "b")]
    assert root.fs.cat_file(root.path(layout.near_duplicates("b"))) == expected


def test_a_damaged_segment_is_rebuilt_from_the_entries_and_decides_the_same(two_shards):
    root = two_shards
    run_near_duplicates(root, "a")
    [segment_a] = segments(root)
    content = bytearray(root.fs.cat_file(segment_a))
    content[-7] ^= 0xFF  # a posting in a's last block
    root.fs.pipe_file(segment_a, bytes(content))
    summary = run_near_duplicates(root, "b")
    assert any("segment rebuilt from its entries" in line for line in summary.repairs)
    assert verdicts(root, "b") == B_VERDICTS
    root.fs.rm_file(segments(root)[0])  # lost outright: the same
    run_near_duplicates(root, "b")
    assert verdicts(root, "b") == B_VERDICTS


def test_a_dead_shards_reservation_is_dropped_and_a_live_one_waited_for(two_shards, monkeypatch):
    root = two_shards
    run_near_duplicates(root, "a")
    ghost = IndexedShard(1, "ghost", None, 0, "reserved", None, "token-of-a-dead-run")
    root.write_parquet(
        layout.near_duplicates_index_order(),
        pa.Table.from_pylist([vars(s) for s in [*read_state(root), ghost]], schema=near_dup_index.ORDER_SCHEMA),
    )
    summary = run_near_duplicates(root, "b")  # nobody holds position 1's lock: its run is gone
    assert summary.index_position == 2 and [s.shard_id for s in read_state(root)] == ["a", "b"]
    assert verdicts(root, "b") == B_VERDICTS

    land_and_normalize(root, "c", {"c-0": (encoded(voice(30)), "wav", "words of shard c alone here")})
    monkeypatch.setattr(near_dup_index_order, "LOCK_POLL_S", 0.05)
    with near_dup_index.reserve_position(root, "late") as reservation:  # alive, and not committing
        assert reservation.position == 3
        with pytest.raises(CorpusIndexBusy, match="late at 3"):
            run_near_duplicates(root, "c", lock_timeout_s=0.5)
    # late's run ended without committing: its reservation is found dead and c goes on.
    assert run_near_duplicates(root, "c").index_position == 4
    assert [s.shard_id for s in read_order(root)] == ["a", "b", "c"]


def test_merged_segments_change_no_decision(data_root, monkeypatch):
    monkeypatch.setattr(near_dup_index_merge, "FANOUT", 2)
    shards = {f"s{n}": voice(40 + n) for n in range(3)}
    for shard_id, samples in shards.items():
        land_and_normalize(data_root, shard_id, {f"{shard_id}-0": (encoded(samples), "wav", f"words of {shard_id}")})
    land_and_normalize(
        data_root,
        "copies",
        {f"copies-{n}": (encoded(voice(40 + n) * 0.5), "wav", f"copy number {n} of it") for n in range(3)},
    )
    for shard_id in [*shards, "copies"]:
        run_near_duplicates(data_root, shard_id)
    levels = sorted(name.rsplit("/", 1)[1].split("-")[0] for name in segments(data_root))
    assert levels[-1] in ("L1", "L2") and len(levels) < 4
    assert verdicts(data_root, "copies") == {"copies-0": "s0", "copies-1": "s1", "copies-2": "s2"}
    before = data_root.fs.cat_file(data_root.path(layout.near_duplicates("copies")))
    run_near_duplicates(data_root, "copies")
    assert data_root.fs.cat_file(data_root.path(layout.near_duplicates("copies"))) == before


def test_an_utterance_past_the_budget_is_left_unchecked_with_its_reason(data_root, monkeypatch):
    land_and_normalize(
        data_root,
        "long",
        {
            "long-0": (encoded(voice(50, seconds=6.0)), "wav", "a long recording of words"),
            "long-1": (encoded(voice(51, seconds=2.0)), "wav", "a short one of words"),
        },
    )
    monkeypatch.setattr(near_duplicates, "MAX_CHECKED_SECONDS", 4.0)
    summary = run_near_duplicates(data_root, "long")
    [unchecked] = summary.unchecked
    assert unchecked.utt_id == "long-0" and "longer than the 4 s checked" in unchecked.detail
    assert summary.rows_out == 1 and read_order(data_root)[0].utterances == 1


def test_the_index_on_disk_decides_as_the_utterances_in_memory(data_root):
    planted = planted_set(9, seed=5)
    signals = [utterance_signals(f"p{n // 9}", u.utt_id, u.samples, 24_000, u.text) for n, u in enumerate(planted)]
    thresholds = NearDuplicateThresholds()
    shards, indexed = [], []
    for number in range(3):
        mine = sorted(signals[number * 9 : (number + 1) * 9], key=lambda s: s.utt_id)
        decisions = find_representatives(indexed, mine, thresholds)
        shards.append((f"p{number}", mine, decisions))
        indexed += [(s, (d.representative_shard, d.representative_utt)) for s, d in zip(mine, decisions, strict=True)]
    assert any(d.kind for _, _, decisions in shards for d in decisions)
    write_index(data_root, shards)
    assert [s.shard_id for s in read_order(data_root)] == ["p0", "p1", "p2"]
    for position, (_, mine, decisions) in enumerate(shards):
        reader = IndexReader(data_root, position)
        assert decide_shard(position, mine, reader, thresholds) == decisions
        assert reader.rows_read <= sum(len(m) for _, m, _ in shards[:position])


def test_a_shard_waiting_on_an_earlier_reservation_sees_what_it_commits(data_root, monkeypatch):
    monkeypatch.setattr(near_dup_index_order, "LOCK_POLL_S", 0.05)
    land_and_normalize(data_root, "first", {"first-0": (encoded(voice(60)), "wav", "the words of the first")})
    land_and_normalize(data_root, "second", {"second-0": (encoded(voice(60) * 0.5), "wav", "quieter and other words")})
    with near_dup_index.reserve_position(data_root, "first") as reservation:
        later = threading.Thread(target=run_near_duplicates, args=(data_root, "second"))
        later.start()  # reads what is committed (nothing), then waits for "first"
        deadline = time.monotonic() + 60
        while not any(s.shard_id == "second" for s in read_state(data_root)) and time.monotonic() < deadline:
            time.sleep(0.05)
        signals, _, _ = shard_signals(data_root, "first")
        decisions = decide_shard(
            reservation.position, signals, IndexReader(data_root, reservation.position), NearDuplicateThresholds()
        )
        near_dup_index.commit_shard_entries(data_root, reservation, signals, decisions)
    later.join(60)
    assert [s.shard_id for s in read_order(data_root)] == ["first", "second"]
    assert verdicts(data_root, "second") == {"second-0": "first"}


def test_a_torn_entries_file_is_fingerprinted_again_at_its_position(two_shards):
    root = two_shards
    run_near_duplicates(root, "a")
    [entries_a] = root.glob(f"{layout.near_duplicates_index_entries_dir()}/a-*.parquet")
    content = root.fs.cat_file(entries_a)
    root.fs.pipe_file(entries_a, content[: len(content) // 2])
    summary = run_near_duplicates(root, "b")
    assert any("a: entries fingerprinted again from its audio" in line for line in summary.repairs)
    assert [(s.position, s.shard_id) for s in read_order(root)] == [(0, "a"), (1, "b")]
    assert verdicts(root, "b") == B_VERDICTS


def test_a_segment_no_shard_names_is_removed_once_old(two_shards, monkeypatch):
    root = two_shards
    run_near_duplicates(root, "a")
    orphan = f"{layout.NEAR_DUPLICATES_INDEX}/segments/L0-0123456789abcdef.seg"
    root.write_bytes(orphan, b"left by a run killed before its commit")
    run_near_duplicates(root, "b")
    assert root.exists(orphan)  # young: it may be a commit on its way
    monkeypatch.setattr(near_dup_index_merge, "ORPHAN_GRACE_S", 0.0)
    run_near_duplicates(root, "b")
    assert not root.exists(orphan) and len(segments(root)) == 2


def test_a_run_killed_after_its_commit_whose_commit_record_is_lost_decides_the_same_at_its_position(
    two_shards, monkeypatch
):
    """Killed after committing, before its decisions file; its order record folded into a part no
    later record touches; its commit record lost. The re-run finds its row (the parts' membership
    filters) and decides at its own position as the killed run did, never against its own earlier
    postings."""
    root = two_shards
    monkeypatch.setattr(near_dup_order_fold, "FOLD_EVERY", 2)
    monkeypatch.setattr(near_dup_order_fold, "PART_ROWS", 1)
    run_near_duplicates(root, "a")
    killed_with = []

    def killed(data_root, shard_id, decisions):
        killed_with.append(near_duplicates.near_duplicates_table(decisions).to_pylist())
        raise Killed("before its decisions file")

    with monkeypatch.context() as kill, pytest.raises(Killed):
        kill.setattr(near_duplicates, "write_near_duplicate_files", killed)
        run_near_duplicates(root, "b")
    assert not near_dup_index_order._read_log(root).changes  # b's commit folded into part 1
    root.fs.rm_file(root.path(near_dup_index_order._commit_record_relative("b")))
    assert not root.exists(layout.near_duplicates("b"))
    again = run_near_duplicates(root, "b")
    assert again.index_position == 1 and again.indexed_before == a_utterances(root)
    assert [(s.position, s.shard_id) for s in read_state(root)] == [(0, "a"), (1, "b")]
    assert rows_of(root, "b") == killed_with[0] and verdicts(root, "b") == B_VERDICTS


@pytest.mark.parametrize("damage", ["torn", "missing"])
def test_torn_or_missing_membership_filters_are_rebuilt_by_the_next_run_which_decides_the_same(
    two_shards, monkeypatch, damage
):
    root = two_shards
    monkeypatch.setattr(near_dup_order_fold, "FOLD_EVERY", 2)
    run_near_duplicates(root, "a")  # folded: the head names a's part and its filter
    [members] = root.glob(f"{near_dup_order_members.MEMBERS}/*.bin")
    if damage == "torn":
        root.fs.pipe_file(members, root.fs.cat_file(members)[:100])
    else:
        root.fs.rm_file(members)
    summary = run_near_duplicates(root, "b")  # a new shard: it reads the filters
    assert any("membership filters" in line for line in summary.repairs)
    assert verdicts(root, "b") == B_VERDICTS
    assert [(s.position, s.shard_id) for s in read_state(root)] == [(0, "a"), (1, "b")]


class Killed(Exception):
    """The run stopped where a kill would stop it."""


def a_utterances(root) -> int:
    return next(s.utterances for s in read_state(root) if s.shard_id == "a")


def test_an_index_of_the_earlier_layout_is_taken_over_by_the_next_run(two_shards):
    root = two_shards
    run_near_duplicates(root, "a")
    # The earlier layout: an order of four columns and one row group per entries file, no segments.
    [entries_a] = root.glob(f"{layout.near_duplicates_index_entries_dir()}/a-*.parquet")
    root.fs.pipe_file(entries_a, _one_row_group(root.fs.cat_file(entries_a)))
    order = pa.Table.from_pylist([vars(s) for s in read_state(root)], schema=near_dup_index.ORDER_SCHEMA)
    root.write_parquet(
        layout.near_duplicates_index_order(), order.select(["position", "shard_id", "entries_version", "utterances"])
    )
    for folder in ("segments", "committed", "order"):
        root.fs.rm(root.path(f"{layout.NEAR_DUPLICATES_INDEX}/{folder}"), recursive=True)
    summary = run_near_duplicates(root, "b")
    assert any("segment rebuilt from its entries" in line for line in summary.repairs)
    assert verdicts(root, "b") == B_VERDICTS
    assert [(s.position, s.shard_id) for s in read_order(root)] == [(0, "a"), (1, "b")]


def test_an_index_of_an_earlier_segment_format_is_rebuilt_by_the_next_run(two_shards, monkeypatch):
    root = two_shards
    with monkeypatch.context() as earlier_format:  # single envelope bands as keys, segment format 02
        earlier_format.setattr(near_dup_postings, "_MAGIC", b"NDSEG02\n")
        earlier_format.setattr(near_dup_filter, "_MAGIC", b"NDFLT01\n")
        earlier_format.setattr(
            near_dup_postings,
            "envelope_keys",
            lambda envelope: near_dup_postings._mix(envelope_band_keys(envelope) ^ near_dup_postings._ENVELOPE_SALT),
        )
        run_near_duplicates(root, "a")
    summary = run_near_duplicates(root, "b")
    assert any("a: segment rebuilt from its entries" in line for line in summary.repairs)
    assert verdicts(root, "b") == B_VERDICTS
    assert [root.fs.cat_file(path)[:8] for path in segments(root)] == [b"NDSEG03\n"] * 2


def _one_row_group(content: bytes) -> bytes:
    import io

    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pq.read_table(io.BytesIO(content)), buffer, row_group_size=1 << 20)
    return buffer.getvalue()


def test_shards_indexed_together_decide_as_if_one_after_the_other_in_their_order(data_root, monkeypatch):
    monkeypatch.setattr(near_dup_index_order, "WAIT_POLL_S", 0.02)
    planted = planted_set(6, seed=8)  # 6 originals, then a copy and a look-alike of each
    by_shard = {f"t{n}": [] for n in range(4)}
    for number, utterance in enumerate(planted):
        shard_id = f"t{number % 4}"
        by_shard[shard_id].append(
            utterance_signals(shard_id, utterance.utt_id, utterance.samples, 24_000, utterance.text)
        )
    by_shard = {shard_id: sorted(signals, key=lambda s: s.utt_id) for shard_id, signals in by_shard.items()}
    thresholds = NearDuplicateThresholds()
    decided, start = {}, threading.Barrier(len(by_shard))

    def index(shard_id):
        signals = by_shard[shard_id]
        start.wait()
        with near_dup_index.reserve_position(data_root, shard_id) as reservation:
            reader = IndexReader(data_root, reservation.position)
            reader.prefetch(near_dup_index.index_keys(signals, reservation.position)["key"])
            reader.settle(near_dup_index.wait_for_earlier(data_root, reservation))
            decided[shard_id] = decide_shard(reservation.position, signals, reader, thresholds)
            near_dup_index.commit_shard_entries(data_root, reservation, signals, decided[shard_id])

    workers = [threading.Thread(target=index, args=(shard_id,)) for shard_id in by_shard]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    order = [s.shard_id for s in read_order(data_root)]
    assert sorted(order) == sorted(by_shard)
    indexed = []
    for shard_id in order:  # the same shards, one after the other in the order they took
        alone = find_representatives(indexed, by_shard[shard_id], thresholds)
        assert decided[shard_id] == alone
        indexed += [(s, (d.representative_shard, d.representative_utt)) for s, d in zip(by_shard[shard_id], alone)]
    assert any(d.kind for decisions in decided.values() for d in decisions)
