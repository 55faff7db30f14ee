"""The capped index read with a key past the cap dropped decides every shard exactly as everything
read everywhere, attacked from directions ``test_near_dup_skip_capped`` does not take: a re-run of
an earlier shard (its reader's position in the middle of segments that hold later owners, some of
them at the cap), any order of the segments (largest last included), keys at the cap exactly, the
in-memory source and the batch pass on the same order, a run killed between its prefetch and its
commit, a re-indexed shard's stale postings in the segment read first, and the figures the reader
reports. The cap is lowered to 4 (``MAX_KEY_OCCURRENCES`` 3) and keys drawn from a pool large enough
that many keys hold 2 to 6 postings, so the cap is crossed at every position of the order."""

import io
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest

from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_merge, near_dup_index_reader, near_dup_postings
from speechdata.quality.near_dup_batch import LocalEngine, ShardOutline, ShardSignals, decide_in_order
from speechdata.quality.near_dup_candidates import AudioKeyLoad
from speechdata.quality.near_dup_index import (
    IndexDamaged,
    IndexReader,
    compact_index,
    index_keys,
    read_state,
    reserve_position,
    wait_for_earlier,
)
from speechdata.quality.near_dup_index_order import READ_ATTEMPTS, _FoldedMeanwhile
from speechdata.quality.near_dup_matching import MemorySource, NearDuplicateThresholds, decide_shard
from speechdata.quality.near_dup_postings import (
    audio_only_keys,
    capped_postings_mask,
    exact_key,
    position_of,
    postings_for,
    sampled_audio_keys,
    sort_postings,
)
from speechdata.quality.near_duplicates import write_near_duplicate_files
from tests.unit.near_dup_stage_path import (
    CAP,
    LookupLog,
    decide_and_commit,
    decide_as_the_stage,
    decided_again_reading_every_key,
    lower_cap_and_fanout,
    outputs,
    run_shard,
    sampled_pool,
    segment_names,
    segment_postings,
    speech_like,
    uncapped,
)

SHARDS = 14


@pytest.fixture(autouse=True)
def small_cap_fanout_and_parts(monkeypatch):
    lower_cap_and_fanout(monkeypatch)


@pytest.fixture(scope="module")
def hovering_index(tmp_path_factory):
    """``hovering_corpus(31)``'s first fourteen shards indexed by the stage (a level-2, a level-1 and
    two level-0 segments), each shard's files from its first run, and a fifteenth shard not indexed.
    Tests read it only (a committed shard re-run without committing changes nothing)."""
    corpus = hovering_corpus(31, SHARDS + 1)
    data_root = DataRoot(str(tmp_path_factory.mktemp("hovering") / "index"))
    with pytest.MonkeyPatch.context() as monkeypatch:
        lower_cap_and_fanout(monkeypatch)
        first = [run_shard(data_root, shard) for shard in corpus[:SHARDS]]
    return data_root, corpus[:SHARDS], first, corpus[SHARDS]


def hovering_corpus(seed: int, shards: int = SHARDS) -> list[list]:
    """Shards of 3 utterances whose pool keys hold a few postings each (around the cap), the first
    utterance of each shard after the second a near copy of an earlier one; one utterance holds the
    same pool value in three frames (three postings of one key, one owner)."""
    rng = np.random.default_rng(seed)
    pool = sampled_pool(rng, 160)
    corpus = []
    for number in range(shards):
        earlier = [s for shard in corpus for s in shard]
        originals = [earlier[int(rng.integers(0, len(earlier)))]] if number >= 2 else []
        corpus.append(speech_like(f"s{number:03d}", 3, rng, pool, originals))
    corpus[4][2].fingerprint.sub_fingerprints[[10, 20, 30]] = pool[0]
    return corpus


def thresholds() -> NearDuplicateThresholds:
    return NearDuplicateThresholds()


def files_of(tmp_path, shard_id: str, decisions) -> tuple[bytes, bytes]:
    scratch = DataRoot(str(tmp_path / f"files-{shard_id}"))
    write_near_duplicate_files(scratch, shard_id, decisions)
    return outputs(scratch, shard_id)


def decided_at_own_position(data_root, signals):
    """A committed shard decided again at its position (the re-run's path, read as the stage reads:
    prefetch, settle), with its reader and its keys past the cap."""
    with reserve_position(data_root, signals[0].shard_id) as again:
        own = index_keys(signals, again.position)
        reader = IndexReader(data_root, again.position)
        reader.prefetch(own["key"], audio_only_keys(own))
        reader.settle(wait_for_earlier(data_root, again))
        load = AudioKeyLoad()
        decided = decide_shard(again.position, signals, reader, thresholds(), own_postings=own, key_load=load)
        return decided, reader, load


def assert_the_vote_sees_what_every_posting_shows(reader, shard, every: np.ndarray) -> None:
    """The postings ``reader`` gives for the shard's keys, against ``every`` posting of the corpus:
    a key with at most ``MAX_KEY_OCCURRENCES`` earlier postings gets every one of them; a key with
    more gets more (a subset of them), and every one of another kind than a sampled audio one."""
    own = index_keys(shard, reader.position)
    keys = np.unique(own["key"])
    returned = sort_postings(reader.postings(keys, audio_only_keys(own)))
    earlier = postings_for(every[position_of(every["owner"]) < reader.position], keys)
    counts = np.searchsorted(earlier["key"], keys, "right") - np.searchsorted(earlier["key"], keys, "left")
    few, many = keys[counts <= CAP - 1], keys[counts > CAP - 1]
    np.testing.assert_array_equal(postings_for(returned, few), postings_for(earlier, few))
    common = postings_for(returned, many)
    got = np.searchsorted(common["key"], many, "right") - np.searchsorted(common["key"], many, "left")
    assert (got > CAP - 1).all()
    fields = ("key", "owner", "frame")
    assert set(zip(*(common[f].tolist() for f in fields))) <= set(zip(*(earlier[f].tolist() for f in fields)))
    others = postings_for(earlier, many)
    np.testing.assert_array_equal(common[~capped_postings_mask(common)], others[~capped_postings_mask(others)])


def earlier_counts(corpus) -> set[int]:
    """Every count of earlier postings (other shards only) an audio key of a shard has."""
    every = np.concatenate([index_keys(shard, position) for position, shard in enumerate(corpus)])
    every = every[capped_postings_mask(every)]
    seen = set()
    for position, shard in enumerate(corpus):
        keys = audio_only_keys(index_keys(shard, position))
        before = np.sort(every["key"][position_of(every["owner"]) < position])
        counts = np.searchsorted(before, keys, "right") - np.searchsorted(before, keys, "left")
        seen |= set(counts.tolist())
    return seen


def test_re_runs_in_the_middle_in_any_segment_order_decide_as_the_memory_source_and_the_batch_pass(
    tmp_path, monkeypatch, hovering_index
):
    """Fourteen shards built by the stage (a level-2, a level-1 and two level-0 segments); every shard
    re-run afterwards at its own position, where the segments hold later owners (which do not count)
    and keys at the cap whose kept postings reach past the position, reads as the first run decided:
    largest segment first, smallest first, and with the skipping off. The first runs' files are
    what the in-memory source decides and the batch pass's decisions on the same order are those; the
    keys past the cap each counts (``AudioKeyLoad``) are the same everywhere."""
    data_root, corpus, first, _ = hovering_index
    assert {CAP - 1, CAP, CAP + 1} <= earlier_counts(corpus)  # keys at the cap exactly, each side
    assert not any(repairs for _, repairs in first)
    segments = segment_postings(data_root)
    assert sorted(name[:2] for name in segments if any(s.segment == name for s in read_state(data_root))) == [
        "L0",
        "L0",
        "L1",
        "L2",
    ]
    # A segment at the cap for a key with kept postings on both sides of some shard's position.
    level2 = next(postings for name, postings in segments.items() if name.startswith("L2"))
    audio = level2[capped_postings_mask(level2)]
    keys, counts = np.unique(audio["key"], return_counts=True)
    at_cap = audio[np.isin(audio["key"], keys[counts == CAP])]
    straddling = {
        position
        for position in range(1, 9)
        for key in np.unique(at_cap["key"])
        if 0 < (position_of(at_cap["owner"][at_cap["key"] == key]) < position).sum() < CAP
    }
    assert straddling

    memory, loads, indexed = [], [], []
    for shard in corpus:
        source, loads = MemorySource(indexed), [*loads, AudioKeyLoad()]
        memory.append(decide_shard(source.next_position, shard, source, thresholds(), key_load=loads[-1]))
        indexed += [(s, (d.representative_shard, d.representative_utt)) for s, d in zip(shard, memory[-1], strict=True)]
    for shard, decisions, (written, _) in zip(corpus, memory, first, strict=True):
        assert files_of(tmp_path, shard[0].shard_id, decisions) == written
    assert sum(d.kind is not None for shard in memory for d in shard) >= 8  # the near copies found
    ids = [shard[0].shard_id for shard in corpus]
    handles = [ShardSignals(shard_id, shard, None) for shard_id, shard in zip(ids, corpus, strict=True)]
    outlines = [ShardOutline(shard[0].shard_id, [s.utt_id for s in shard], None, [], 0.0) for shard in corpus]
    batch_loads = {}
    batch = decide_in_order(
        LocalEngine(),
        ids,
        np.arange(len(ids), dtype=np.int64),
        set(ids),
        handles,
        outlines,
        thresholds(),
        3,
        key_loads=batch_loads,
    )
    assert [batch[shard_id] for shard_id in ids] == memory
    assert [batch_loads[shard_id] for shard_id in ids] == loads
    assert sum(load.keys_past_cap for load in loads) > 0

    every = sort_postings(np.concatenate([index_keys(shard, position) for position, shard in enumerate(corpus)]))
    log = LookupLog(monkeypatch)
    largest_first = IndexReader._lookup_order
    orders = {
        "largest first": largest_first,
        "smallest first": lambda self: largest_first(self)[::-1],
    }
    looked_up = {}
    for skip in (True, False):
        monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", skip)
        for label, order in orders.items():
            monkeypatch.setattr(IndexReader, "_lookup_order", order)
            log.lookups.clear()
            for shard, decisions, load in zip(corpus, memory, loads, strict=True):
                again, reader, again_load = decided_at_own_position(data_root, shard)
                assert again == decisions, (label, skip, shard[0].shard_id)
                assert again_load == load  # a key dropped is still counted past the cap
                assert_the_vote_sees_what_every_posting_shows(reader, shard, every)
            looked_up[skip, label] = log.keys_looked_up
    # The largest first spares the most lookups (smallest first, a key passes the cap mostly in the
    # last segment read, which spares nothing).
    assert looked_up[True, "largest first"] < looked_up[True, "smallest first"] <= looked_up[False, "largest first"]


def test_a_run_killed_between_its_prefetch_and_its_commit_re_runs_to_the_same_files(tmp_path, hovering_index):
    """s006 is killed after its prefetch (a compaction runs before it is re-run) and s007 after its
    decisions, before its commit; s008 after its commit, before its files. Their re-runs write, byte
    for byte, what the runs never killed wrote."""
    _, corpus, first, _ = hovering_index
    corpus, clean = corpus[:9], [written for written, _ in first[:9]]

    class Killed(Exception):
        pass

    def killed(*_) -> None:
        raise Killed

    def decided_then_killed(*stage) -> None:
        decide_as_the_stage(*stage)
        raise Killed

    def killed_run(data_root, signals, at: str) -> None:
        if at == "prefetch":
            run_shard(data_root, signals, meanwhile=killed)
        elif at == "decided":
            run_shard(data_root, signals, decide=decided_then_killed)
        run_shard(data_root, signals, returning=("decisions",))  # committed, its files never written
        raise Killed

    data_root = DataRoot(str(tmp_path / "index"))
    kills = {6: "prefetch", 7: "decided", 8: "committed"}
    for number, shard in enumerate(corpus):
        if number in kills:
            with pytest.raises(Killed):
                killed_run(data_root, shard, kills[number])
            while compact_index(data_root):
                pass
        written, repairs = run_shard(data_root, shard)
        assert not repairs
        assert written == clean[number], shard[0].shard_id


def test_a_stale_capped_segment_read_first_and_a_re_indexed_shards_posting_in_a_smaller_segment(tmp_path, monkeypatch):
    """The level-2 segment (read first) holds a key at the cap: s000 twice, s001 and s002 once (s003
    to s005 beyond the cap). s001 is re-indexed still holding the key: its kept posting in the
    level-2 segment is stale (the key counts 3 there, uncertain), its live one lands in a level-0
    segment read after. The next level-0 segment (s001's or s009's, both hold the key) brings the
    count to the cap: the key is dropped, the third segment is not read for it, no repair is
    needed (the postings counted pass the cap), and the new shard decides as the uncapped index read
    everywhere. Another key below the cap in the level-2 segment (3) passes it summed with a
    level-0 segment's, and is dropped alike."""
    rng = np.random.default_rng(41)
    pool = sampled_pool(rng, 160)
    hum, low = sampled_pool(np.random.default_rng(99), 2)
    private = sampled_pool(np.random.default_rng(7), 160)
    # s001's keys are its own (not the pool's): its stale postings leave no other key uncertain.
    corpus = [speech_like(f"s{number:03d}", 3, rng, pool if number != 1 else private) for number in range(10)]
    for number, rank in ((0, 0), (0, 1), (1, 0), (2, 0), (3, 0), (4, 0), (5, 0), (9, 0)):
        corpus[number][rank].fingerprint.sub_fingerprints[10] = hum
    for number, rank in ((0, 2), (3, 2), (6, 2), (9, 1), (9, 2)):
        corpus[number][rank].fingerprint.sub_fingerprints[12] = low
    relisted = speech_like("s001", 3, np.random.default_rng(12), private)
    relisted[1].fingerprint.sub_fingerprints[10] = hum
    relisted[2].fingerprint.sub_fingerprints[12] = low
    new = speech_like("new", 3, rng, pool, originals=[corpus[9][0], corpus[3][2]])
    new[2].fingerprint.sub_fingerprints[[10, 12]] = [hum, low]
    hum_key, low_key = sampled_audio_keys(np.array([hum, low], np.uint32), np.ones(2, bool))[0]
    assert {hum_key, low_key} <= set(audio_only_keys(index_keys(new, 0)).tolist())

    def built(root):
        for shard in [*corpus, relisted]:
            run_shard(root, shard)

    data_root = DataRoot(str(tmp_path / "capped"))
    built(data_root)
    live = sorted({s.segment.rsplit("/", 1)[-1][:2] for s in read_state(data_root)})
    assert live == ["L0", "L2"] and len({s.segment for s in read_state(data_root)}) == 3
    level2 = next(postings for name, postings in segment_postings(data_root).items() if name.startswith("L2"))
    kept = level2[level2["key"] == hum_key]
    assert position_of(kept["owner"]).tolist() == [0, 0, 1, 2]  # at the cap, s001's stale among them
    log = LookupLog(monkeypatch)
    written, repairs = run_shard(data_root, new)
    assert not repairs
    for key in (hum_key, low_key):
        assert [name[:2] for name in log.segments_looking_up(key)] == ["L2", "L0"]
    uncapped(monkeypatch)
    full_root = DataRoot(str(tmp_path / "full"))
    built(full_root)
    assert run_shard(full_root, new)[0] == written


def test_the_reported_figures_count_what_was_read(monkeypatch, hovering_index):
    """postings_read, blocks_read and the filter and segment bytes count what the reader read: with
    a key dropped they are lower, never below what the postings it returned hold, and the
    utterances it was checked against do not change."""
    data_root, corpus, _, new = hovering_index
    figures = {}
    for skip in (True, False):
        monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", skip)
        reader = IndexReader(data_root, len(corpus))
        own = index_keys(new, len(corpus))
        returned = reader.postings(np.unique(own["key"]), audio_only_keys(own))
        assert reader.postings_read >= len(returned)
        assert reader.blocks_read >= reader.blocks_read_by_chance >= 0
        figures[skip] = (reader.postings_read, reader.blocks_read, reader.segment_bytes_read, reader.utterances)
    assert figures[True][3] == figures[False][3] == 3 * len(corpus)
    assert figures[True][0] < figures[False][0] and figures[True][1] <= figures[False][1]
    assert figures[True][2] <= figures[False][2]


def test_an_audio_key_that_is_another_utterances_exact_key_is_read_in_every_segment(tmp_path, monkeypatch):
    """The new shard holds a key as one utterance's sampled audio key and as another's exact key
    (a 64-bit collision, made here: an exact key is its hash's first 8 bytes, salted). Its audio
    postings pass the cap in the level-2 segment, read first, yet it is read in the level-0 segment
    after it too, where s009's utterance holds it as its exact key: the new shard's copy of that
    utterance is found, as the uncapped index read everywhere finds it."""
    rng = np.random.default_rng(51)
    pool = sampled_pool(rng, 160)
    hum = sampled_pool(np.random.default_rng(99), 1)[0]
    hum_key = sampled_audio_keys(np.array([hum], np.uint32), np.ones(1, bool))[0][0]
    colliding = f"{int(hum_key ^ near_dup_postings._EXACT_SALT):016x}" + "0" * 48
    assert exact_key(colliding) == hum_key
    corpus = [speech_like(f"s{number:03d}", 3, rng, pool) for number in range(10)]
    for number in range(6):
        corpus[number][0].fingerprint.sub_fingerprints[10] = hum
    corpus[9][0] = replace(corpus[9][0], exact_hash=colliding)
    new = speech_like("new", 3, rng, pool)
    new[0] = replace(new[0], exact_hash=colliding, fingerprint=corpus[9][0].fingerprint)
    new[1].fingerprint.sub_fingerprints[10] = hum
    assert hum_key not in audio_only_keys(index_keys(new, 10))

    def built(root):
        for shard in corpus:
            run_shard(root, shard)

    data_root = DataRoot(str(tmp_path / "capped"))
    built(data_root)
    log = LookupLog(monkeypatch)
    written, _ = run_shard(data_root, new)
    assert [name[:2] for name in log.segments_looking_up(hum_key)] == ["L2", "L0"]
    copies = pq.read_table(io.BytesIO(written[0])).to_pylist()
    assert [(row["utt_id"], row["kind"], row["representative_utt"]) for row in copies] == [
        ("new-000", "exact_audio", "s009-000")
    ]
    uncapped(monkeypatch)
    full_root = DataRoot(str(tmp_path / "full"))
    built(full_root)
    assert run_shard(full_root, new)[0] == written


def test_every_segment_the_prefetch_read_merged_and_swept_before_the_settled_read(tmp_path, monkeypatch):
    """b prefetches from two level-1 segments of 3 shards each (a tie in the order, broken by name)
    and two level-0 ones, dropping keys past the cap; a, reserved before b, commits meanwhile, the
    compaction merges everything into one level-2 segment and sweeps the five segments b read as
    orphans. b's settled read finds none of them live, reads the level-2 segment with every key, and
    writes what a reader that reads every key everywhere decides."""
    monkeypatch.setattr(near_dup_index_merge, "ORPHAN_GRACE_S", 0.0)
    rng = np.random.default_rng(61)
    pool = sampled_pool(rng, 40)  # common keys: several pass the cap in the first level-1 segment
    corpus = [speech_like(f"s{number:03d}", 3, rng, pool) for number in range(8)]
    late_a = speech_like("a", 3, rng, pool, originals=corpus[7][:1])
    late_b = speech_like("b", 3, rng, pool, originals=[corpus[1][0], late_a[1]])
    data_root = DataRoot(str(tmp_path / "index"))
    for shard in corpus:
        run_shard(data_root, shard)
    prefetched = segment_names(data_root)
    assert sorted(name[:2] for name in prefetched) == ["L0", "L0", "L1", "L1"]
    log = LookupLog(monkeypatch)
    own_b = index_keys(late_b, 9)
    monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", False)
    IndexReader(data_root, 9).prefetch(own_b["key"], audio_only_keys(own_b))
    every_key_everywhere = log.keys_looked_up
    monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", True)
    log.lookups.clear()
    with reserve_position(data_root, "a") as first:

        def a_commits_and_all_is_merged(root):
            looked_up_at_prefetch.append(log.keys_looked_up)
            decide_and_commit(root, first, late_a)
            while compact_index(root):
                pass
            compact_index(root)  # the sweep of what the last merge left

        looked_up_at_prefetch: list[int] = []
        written, repairs = run_shard(data_root, late_b, meanwhile=a_commits_and_all_is_merged)
    assert not repairs
    assert not prefetched & segment_names(data_root)  # every segment b prefetched from: gone
    assert looked_up_at_prefetch[0] < every_key_everywhere  # the prefetch dropped keys
    assert written == decided_again_reading_every_key(tmp_path, data_root, late_b, monkeypatch)
    assert pq.read_metadata(io.BytesIO(written[0])).num_rows == 2


def test_the_parts_the_prefetch_reads_to_count_are_in_parts_read(tmp_path, monkeypatch):
    """s001 is re-indexed (its postings in the level-2 segment go stale) and the shard list folded
    since, so counting that segment's postings reads the shard list's part 0: the prefetch reads it
    against the state it started from, the settled read again. ``parts_read`` counts both reads."""
    from speechdata.quality.near_dup_order_directory import ShardDirectory

    corpus = hovering_corpus(34, 15)
    # s001's keys are its own, before and after: no pool key of the level-2 segment goes stale.
    private = sampled_pool(np.random.default_rng(7), 160)
    corpus[1] = speech_like("s001", 3, np.random.default_rng(11), private)
    relisted = speech_like("s001", 3, np.random.default_rng(12), private)
    data_root = DataRoot(str(tmp_path / "index"))
    for shard in [*corpus[:10], relisted, *corpus[10:14]]:  # the shard list folded since the re-index
        run_shard(data_root, shard)
    assert {s.shard_id: s.segment.rsplit("/", 1)[-1][:2] for s in read_state(data_root)}["s001"] == "L1"
    loads: list[tuple[int, int]] = []
    load = ShardDirectory.load

    def logged(directory, part):
        if part not in directory.loaded:
            loads.append((id(directory), part))
        load(directory, part)

    new = corpus[14]
    with reserve_position(data_root, new[0].shard_id) as reservation:
        own = index_keys(new, reservation.position)
        reader = IndexReader(data_root, reservation.position)
        monkeypatch.setattr(ShardDirectory, "load", logged)
        reader.prefetch(own["key"], audio_only_keys(own))
        monkeypatch.setattr(ShardDirectory, "load", load)
        prefetched = list(loads)
        reader.settle(wait_for_earlier(data_root, reservation))
        decide_shard(reservation.position, new, reader, thresholds(), own_postings=own)
    assert [part for _, part in prefetched] == [0]
    assert reader.parts_read == len(reader._directory.loaded) + 1
    assert 0 in reader._directory.loaded


def test_a_settled_read_that_meets_a_fold_after_dropping_keys_reads_again_and_decides_the_same(
    monkeypatch, hovering_index
):
    """The read meets a part of the shard list folded away while counting the second segment, after
    the first made keys drop (the second was read for the rest only): it reads again from the state
    after the fold, with what it read kept, and decides as every key read everywhere; a fold on
    every one of ``READ_ATTEMPTS`` reads is damage (the stage repairs)."""
    data_root, corpus, _, new = hovering_index
    every = sort_postings(np.concatenate([index_keys(shard, position) for position, shard in enumerate(corpus)]))
    owners_in = IndexReader._owners_in
    monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", False)
    every_key_everywhere = decide_shard(len(corpus), new, IndexReader(data_root, len(corpus)), thresholds())
    monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", True)
    for folds in (READ_ATTEMPTS - 1, READ_ATTEMPTS):
        reader = IndexReader(data_root, len(corpus))
        second = reader._lookup_order()[1]
        raised = []

        def folded(self, name, header, raised=raised, folds=folds, second=second):
            if name == second and len(raised) < folds:
                raised.append(name)
                raise _FoldedMeanwhile()
            return owners_in(self, name, header)

        monkeypatch.setattr(IndexReader, "_owners_in", folded)
        if folds == READ_ATTEMPTS:
            with pytest.raises(IndexDamaged, match="moved on every one"):
                decide_shard(len(corpus), new, reader, thresholds())
            continue
        assert decide_shard(len(corpus), new, reader, thresholds()) == every_key_everywhere
        assert len(raised) == folds and not reader._read[second][2].all()  # keys dropped before it
        monkeypatch.setattr(IndexReader, "_owners_in", owners_in)
        assert_the_vote_sees_what_every_posting_shows(reader, new, every)
