"""Key filters beside the posting segments (speechdata.quality.near_dup_filter) and what the index does
with them: a key a segment holds is always let through (no false negative), few absent keys are; a
torn or altered filter is detected and rebuilt by a repair, after which the shard decides the same;
the live segments stay few (tiered compaction) however many shards commit."""

import io

import numpy as np
import pytest

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_merge
from speechdata.quality.fingerprint_audio import AudioFingerprint
from speechdata.quality.near_dup_filter import (
    DamagedFilter,
    FilterBuilder,
    filter_bytes,
    keys_maybe_in,
    verify_filter,
)
from speechdata.quality.near_dup_index import (
    IndexDamaged,
    IndexReader,
    commit_shard_entries,
    compact_index,
    read_order,
    repair_index,
    reserve_position,
    wait_for_earlier,
    write_index,
)
from speechdata.quality.near_dup_matching import Decision, NearDuplicateThresholds, UtteranceSignals, decide_shard

SEGMENT = "L0-0123456789abcdef.seg"


def written(data_root, content: bytes, relative: str = "f.seg.filter") -> str:
    data_root.write_bytes(relative, content)
    return relative


@pytest.mark.parametrize("count", [1, 7, 5_000])
def test_every_key_a_filter_was_built_from_passes_it_and_few_others_do(data_root, count):
    rng = np.random.default_rng(count)
    keys = rng.integers(0, 2**64 - 1, count, dtype=np.uint64)
    relative = written(data_root, filter_bytes(keys, SEGMENT))
    absent = rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64)
    query = np.unique(np.concatenate([keys, absent]))
    passed, read = keys_maybe_in(data_root, relative, SEGMENT, query)
    assert np.isin(keys, passed).all()
    false_positives = len(np.setdiff1d(passed, keys))
    assert false_positives < 0.03 * len(absent)
    assert read <= 64 + 64 * len(query)


def test_a_small_segments_filter_lets_fewer_than_one_absent_key_in_a_thousand_through():
    from speechdata.quality import near_dup_filter

    assert near_dup_filter.bits_per_key(near_dup_filter.SMALL_SEGMENT_RECORDS) == 20
    assert near_dup_filter.bits_per_key(near_dup_filter.SMALL_SEGMENT_RECORDS + 1) == 12
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64)
    absent = np.setdiff1d(rng.integers(0, 2**64 - 1, 200_000, dtype=np.uint64), keys)
    in_memory = DataRoot("memory://filter-rate")
    in_memory.write_bytes("small.filter", filter_bytes(keys, SEGMENT))
    passed, _ = keys_maybe_in(in_memory, "small.filter", SEGMENT, np.unique(np.concatenate([keys, absent])))
    assert np.isin(keys, passed).all()
    assert len(passed) - len(keys) < 0.001 * len(absent)  # 0.047 % measured on 2 M keys; 12 bits: 0.55 %


def test_a_filter_written_with_the_earlier_sizing_is_read_as_written(data_root, monkeypatch):
    """12 bits per posting and 6 hashes, the filters of every segment written before: the header says
    so, and a lookup tests those 6 bits (every key passes, absent ones at the earlier rate)."""
    from speechdata.quality import near_dup_filter

    rng = np.random.default_rng(6)
    keys = rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64)
    with monkeypatch.context() as earlier:
        earlier.setattr(near_dup_filter, "HASHES", 6)
        earlier.setattr(near_dup_filter, "SMALL_SEGMENT_BITS_PER_KEY", 12)
        content = filter_bytes(keys, SEGMENT)
    assert len(content) == 64 + 64 * -(-20_000 * 12 // 448) and len(content) < len(filter_bytes(keys, SEGMENT))
    relative = written(data_root, content)
    verify_filter(io.BytesIO(content), relative, SEGMENT)
    absent = np.setdiff1d(rng.integers(0, 2**64 - 1, 200_000, dtype=np.uint64), keys)
    passed, _ = keys_maybe_in(data_root, relative, SEGMENT, np.unique(np.concatenate([keys, absent])))
    assert np.isin(keys, passed).all()
    assert 0.003 * len(absent) < len(passed) - len(keys) < 0.01 * len(absent)  # 0.59 % measured


def test_a_filter_built_a_chunk_at_a_time_is_the_one_built_at_once(monkeypatch):
    from speechdata.quality import near_dup_filter

    keys = np.random.default_rng(1).integers(0, 2**64 - 1, 5_000, dtype=np.uint64)
    monkeypatch.setattr(near_dup_filter, "ADD_CHUNK", 333)
    builder = FilterBuilder(len(keys))
    for part in np.array_split(keys, 7):
        builder.add(part)
    assert b"".join(builder.finish(SEGMENT)) == filter_bytes(keys, SEGMENT)


@pytest.mark.parametrize("gap, run", [(0, 1), (3, 5), (64, 1 << 14)])
def test_a_local_lookup_reads_the_lines_it_needs_and_answers_as_the_whole_file_does(data_root, monkeypatch, gap, run):
    """The local lookup (lines read in runs, keys in line order, chunk by chunk) lets through exactly
    the keys a lookup over the whole file in memory does, and reads only the lines its keys pick:
    runs of one line, short runs split where they grow too wide, and the default."""
    from speechdata.io.storage import DataRoot
    from speechdata.quality import near_dup_filter

    rng = np.random.default_rng(7)
    keys = rng.integers(0, 2**64 - 1, 100_000, dtype=np.uint64)
    content = filter_bytes(keys, SEGMENT)
    relative = written(data_root, content)
    query = np.unique(np.concatenate([keys[::100], rng.integers(0, 2**64 - 1, 600, dtype=np.uint64)]))
    monkeypatch.setattr(near_dup_filter, "RUN_GAP_LINES", gap)
    monkeypatch.setattr(near_dup_filter, "RUN_LINES", run)
    monkeypatch.setattr(near_dup_filter, "LOOKUP_CHUNK", 256)
    local, read = keys_maybe_in(data_root, relative, SEGMENT, query)
    in_memory = DataRoot("memory://filter-lookup")
    in_memory.write_bytes(relative, content)
    whole, _ = keys_maybe_in(in_memory, relative, SEGMENT, query)
    assert np.array_equal(local, whole)
    assert np.all(local[1:] > local[:-1])
    assert np.isin(keys[::100], local).all()
    assert read < len(content) / 2  # the lines its keys pick, not every line


@pytest.mark.parametrize(
    "damage",
    ["flip a bit", "truncate", "another segment", "swap two lines"],
)
def test_a_damaged_filter_is_detected(data_root, damage):
    keys = np.random.default_rng(2).integers(0, 2**64 - 1, 3_000, dtype=np.uint64)
    content = bytearray(filter_bytes(keys, SEGMENT))
    name = SEGMENT
    if damage == "flip a bit":
        content[64 + 64 * 5 + 3] ^= 0x10
    elif damage == "truncate":
        content = content[:-64]
    elif damage == "another segment":
        name = "L0-fedcba9876543210.seg"
    else:
        content[64:128], content[128:192] = content[128:192], content[64:128]
    relative = written(data_root, bytes(content))
    with pytest.raises(DamagedFilter):
        verify_filter(io.BytesIO(bytes(content)), relative, name)
    with pytest.raises(DamagedFilter):
        # every line is read when every key is queried
        lines = (len(content) - 64) // 64 + 1
        query = np.unique(np.concatenate([keys, np.arange(lines * 50, dtype=np.uint64)]))
        keys_maybe_in(data_root, relative, name, query)


def signals_of(shard_id: str, count: int, rng, copies_of=()) -> list[UtteranceSignals]:
    made = []
    for number in range(count):
        utt_id = f"{shard_id}-{number:03d}"
        if copies_of and number == 0:
            original = copies_of[0]
            made.append(UtteranceSignals(shard_id, utt_id, original.exact_hash, original.fingerprint, None, 0))
            continue
        frames = int(rng.integers(60, 120))
        fingerprint = AudioFingerprint(rng.integers(0, 2**32, frames, dtype=np.uint32), rng.random(frames) < 0.9)
        made.append(UtteranceSignals(shard_id, utt_id, rng.bytes(32).hex(), fingerprint, None, 0))
    return made


def index_of(data_root, shards: int, rng) -> list[tuple[str, list[UtteranceSignals], list[Decision]]]:
    corpus = []
    for number in range(shards):
        shard_id = f"s{number:03d}"
        signals = signals_of(shard_id, 4, rng)
        corpus.append((shard_id, signals, [Decision(s.utt_id, shard_id, s.utt_id, None, 1.0) for s in signals]))
    write_index(data_root, corpus)
    return corpus


def decide_new(data_root, signals):
    with reserve_position(data_root, signals[0].shard_id) as reservation:
        reader = IndexReader(data_root, reservation.position, wait_for_earlier(data_root, reservation))
        return decide_shard(reservation.position, signals, reader, NearDuplicateThresholds()), reader


def filters(data_root) -> list[str]:
    return sorted(data_root.glob(f"{layout.NEAR_DUPLICATES_INDEX}/segments/*.seg.filter"))


@pytest.mark.parametrize("damage", ["torn", "lost"])
def test_a_torn_or_lost_filter_is_found_by_a_lookup_and_rebuilt_by_a_repair(data_root, damage):
    rng = np.random.default_rng(3)
    corpus = index_of(data_root, 3, rng)
    new = signals_of("new", 4, rng, copies_of=corpus[1][1])
    expected, _ = decide_new(data_root, new)
    assert expected[0].representative_utt == corpus[1][1][0].utt_id
    before = {path: data_root.fs.cat_file(path) for path in filters(data_root)}
    assert before
    victim = sorted(before)[0]
    if damage == "torn":
        data_root.fs.pipe_file(victim, before[victim][: len(before[victim]) // 2 + 5])
    else:
        data_root.fs.rm_file(victim)
    with pytest.raises(IndexDamaged):
        decide_new(data_root, new)
    done = repair_index(data_root)
    assert any("filter of segment" in line for line in done)
    assert {path: data_root.fs.cat_file(path) for path in filters(data_root)} == before
    assert decide_new(data_root, new)[0] == expected


def test_keys_absent_from_a_segment_read_none_of_its_blocks_but_false_positives(data_root, monkeypatch):
    from speechdata.quality import near_dup_index_reader, near_dup_postings

    blocks_read = []
    checked_blocks = near_dup_postings._checked_blocks
    monkeypatch.setattr(
        near_dup_postings, "_checked_blocks", lambda *args: blocks_read.append(args[-2:]) or checked_blocks(*args)
    )
    rng = np.random.default_rng(4)
    index_of(data_root, 3, rng)
    new = signals_of("new", 4, rng)
    _, reader = decide_new(data_root, new)
    assert reader.postings_read == 0 and reader.filter_bytes_read > 0
    filtered = len(blocks_read)
    keys = len(np.unique(near_dup_postings.index_keys(new, 3)["key"]))
    assert filtered <= 0.03 * keys * 3  # three segments

    blocks_read.clear()
    monkeypatch.setattr(
        near_dup_index_reader, "keys_maybe_in", lambda root, relative, name, keys, probe=None: (keys, 0)
    )
    decide_new(data_root, new)
    assert len(blocks_read) > filtered


def test_the_live_segments_stay_logarithmic_in_the_shards_committed(data_root, monkeypatch):
    monkeypatch.setattr(near_dup_index_merge, "FANOUT", 2)
    rng = np.random.default_rng(5)
    index_of(data_root, 1, rng)
    for number in range(1, 12):
        signals = signals_of(f"n{number:03d}", 2, rng)
        with reserve_position(data_root, signals[0].shard_id) as reservation:
            decisions = [Decision(s.utt_id, s.shard_id, s.utt_id, None, 1.0) for s in signals]
            commit_shard_entries(data_root, reservation, signals, decisions)
        while compact_index(data_root):
            pass
        live = {shard.segment for shard in read_order(data_root)}
        # FANOUT 2: one segment per set bit of the shard count at most (binary counter)
        assert len(live) <= bin(number + 1).count("1")
        assert len(filters(data_root)) == len(live)
