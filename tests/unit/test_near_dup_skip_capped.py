"""A sampled audio key whose earlier postings pass the cap in one segment is not looked up in the
other live segments (it never votes), and every shard writes byte for byte what it writes when every
key is read in every segment: with the cap lowered to 4 and keys drawn from a small pool, so that
keys pass the cap in some segments and not in others, where segments became live, were merged or
held a shard re-indexed between a shard's prefetch and its settled read, and the shard list folded
meanwhile. (Across merges, levels and a shard re-indexed since a merge, every shard of a capped
index read this way decides as an uncapped one read every key everywhere: ``test_near_dup_capped_keys``.)"""

import io
from dataclasses import replace

import numpy as np
import pyarrow.parquet as pq
import pytest

from speechdata.quality import near_dup_index_reader
from speechdata.quality.fingerprint_envelope import ENVELOPE_POINTS, SHAPE_SEGMENTS, ShiftSignature
from speechdata.quality.near_dup_filter import KeyProbe
from speechdata.quality.near_dup_index import IndexReader, compact_index, index_keys, reserve_position, wait_for_earlier
from speechdata.quality.near_dup_index_order import _FoldedMeanwhile
from speechdata.quality.near_dup_matching import NearDuplicateThresholds, decide_shard
from speechdata.quality.near_dup_postings import audio_only_keys, envelope_keys, sampled_audio_keys
from tests.unit.near_dup_stage_path import (
    LookupLog,
    decide_and_commit,
    decided_again_reading_every_key,
    lower_cap_and_fanout,
    run_shard,
    sampled_pool,
    segment_names,
    speech_like,
)


@pytest.fixture(autouse=True)
def small_cap_fanout_and_parts(monkeypatch):
    lower_cap_and_fanout(monkeypatch)


def test_a_key_past_the_cap_in_the_largest_segment_is_looked_up_in_no_other(tmp_path, monkeypatch):
    """Nine shards merged into one level-2 segment hold a key 9 times (4 kept: the cap), two
    level-0 segments after it once each; a new shard holding the key reads it in the level-2
    segment only, and decides as the reader that reads it everywhere. The same utterances share an
    envelope: its band-pair keys, as common, are read in every segment. A prefetch that meets a
    folded shard list reads every key in every segment and decides the same."""
    from speechdata.io.storage import DataRoot

    rng = np.random.default_rng(3)
    pool = sampled_pool(rng, 24)
    hum = sampled_pool(np.random.default_rng(99), 1)[0]
    corpus = [speech_like(f"s{number:03d}", 4, rng, pool) for number in range(11)]
    envelope = rng.standard_normal(ENVELOPE_POINTS).astype(np.float32)
    shared = ShiftSignature(envelope / np.linalg.norm(envelope), np.zeros((SHAPE_SEGMENTS, 52), np.int8), 4.0)
    for shard in corpus:
        shard[0].fingerprint.sub_fingerprints[10] = hum
        shard[0] = replace(shard[0], shift=shared)
    new = speech_like("new", 4, rng, pool, originals=[corpus[10][1]])
    new[2].fingerprint.sub_fingerprints[10] = hum
    new[2] = replace(new[2], shift=shared)
    envelope_key = envelope_keys(shared.envelope)[0]
    data_root = DataRoot(str(tmp_path))
    for shard in corpus:
        run_shard(data_root, shard)
    hum_key = sampled_audio_keys(np.array([hum], np.uint32), np.ones(1, bool))[0][0]
    log = LookupLog(monkeypatch)
    decided, read = {}, {}
    for skip in (True, False):
        monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", skip)
        log.lookups.clear()
        with reserve_position(data_root, "new") as reservation:
            reader = IndexReader(data_root, reservation.position, wait_for_earlier(data_root, reservation))
            decided[skip] = decide_shard(reservation.position, new, reader, NearDuplicateThresholds())
        holding = log.segments_looking_up(hum_key)
        assert [name[:2] for name in holding] == (["L2"] if skip else ["L2", "L0", "L0"])
        assert [name[:2] for name in log.segments_looking_up(envelope_key)] == ["L2", "L0", "L0"]
        read[skip] = reader.postings_read
    assert decided[True] == decided[False]
    assert decided[True][0].kind is not None  # the copy of s010's utterance found
    # The pool's keys pass the cap in the level-2 segment too: fewer of their postings read.
    assert read[True] < read[False]
    # A prefetch whose first count meets a part of the shard list folded away stops dropping keys
    # (the key is read in every segment then); the settled read decides the same.
    monkeypatch.setattr(near_dup_index_reader, "SKIP_CAPPED_KEYS", True)
    owners_in = IndexReader._owners_in

    def folded_once(self, name, header):
        if not folded:
            folded.append(name)
            raise _FoldedMeanwhile()
        return owners_in(self, name, header)

    folded: list[str] = []
    monkeypatch.setattr(IndexReader, "_owners_in", folded_once)
    log.lookups.clear()
    with reserve_position(data_root, "new") as reservation:
        own = index_keys(new, reservation.position)
        reader = IndexReader(data_root, reservation.position)
        reader.prefetch(own["key"], audio_only_keys(own))
        assert [name[:2] for name in log.segments_looking_up(hum_key)] == ["L2", "L0", "L0"]
        reader.settle(wait_for_earlier(data_root, reservation))
        assert (
            decide_shard(reservation.position, new, reader, NearDuplicateThresholds(), own_postings=own)
            == decided[True]
        )
    assert folded


def test_a_probe_cut_from_the_shards_keys_is_the_probe_of_the_keys_left_and_audio_only_keys_leave_out_other_kinds():
    rng = np.random.default_rng(1)
    keys = np.unique(rng.integers(0, 2**63, 5_000, dtype=np.uint64))
    keep = rng.random(len(keys)) < 0.3
    cut, made = KeyProbe(keys).subset(keep), KeyProbe(keys[keep])
    for field in ("keys", "order", "high", "bits"):
        np.testing.assert_array_equal(getattr(cut, field), getattr(made, field))
    signals = speech_like("s", 3, rng, sampled_pool(rng, 4))
    own = index_keys(signals, 0)
    audio = audio_only_keys(own)
    sampled = np.unique(
        np.concatenate([sampled_audio_keys(s.fingerprint.sub_fingerprints, s.fingerprint.active)[0] for s in signals])
    )
    assert set(audio.tolist()) <= set(sampled.tolist()) and len(audio) > 0.9 * len(sampled)
    # A transcript key equal to one of them (a 64-bit collision) is read everywhere.
    own_with_transcript = own.copy()
    own_with_transcript["context"][own["key"] == audio[0]] = 0
    assert audio[0] not in audio_only_keys(own_with_transcript)


def test_segments_merged_and_a_shard_list_folded_between_the_prefetch_and_the_settled_read(tmp_path, monkeypatch):
    """Shard a is reserved before b and commits while b waits: its level-0 segment makes a merge due
    (the segments b prefetched from are merged away, the merged one is new to b) and its records
    fold the shard list. b writes what a reader that reads every key everywhere decides."""
    from speechdata.io.storage import DataRoot

    rng = np.random.default_rng(21)
    pool = sampled_pool(rng, 24)
    corpus = [speech_like(f"s{number:03d}", 4, rng, pool) for number in range(8)]
    late_a = speech_like("a", 4, rng, pool, originals=corpus[3][:2])
    late_b = speech_like("b", 4, rng, pool, originals=late_a[2:])
    data_root = DataRoot(str(tmp_path / "index"))
    for shard in corpus:
        run_shard(data_root, shard)
    with reserve_position(data_root, "a") as first:

        def a_commits(root):
            decide_and_commit(root, first, late_a)
            live.append(segment_names(root))
            assert compact_index(root)
            live.append(segment_names(root))

        live: list[set[str]] = []
        written, _ = run_shard(data_root, late_b, meanwhile=a_commits)
    assert live[0] - live[1] and live[1] - live[0]  # level-0 segments merged away, a level-1 one new
    assert written == decided_again_reading_every_key(tmp_path, data_root, late_b, monkeypatch)
    assert pq.read_metadata(io.BytesIO(written[0])).num_rows == 2  # the copies of a's utterances


def test_a_key_dropped_at_the_prefetch_is_read_where_the_settled_counts_need_it(tmp_path, monkeypatch):
    """The level-2 segment holds a key 3 times (s000 twice, s001 once), s009 and s010 once each: at
    the prefetch the key reaches the cap (4) after the level-2 segment and the first level-0 one, so
    the second is not read for it. s001 is re-indexed without the key before the settled read: its
    posting is stale, the count after those two segments falls to 3, and the settled read looks the
    key up in the level-0 segment the prefetch spared (4: it never votes). The shard writes what a
    reader that reads every key everywhere decides."""
    from speechdata.io.storage import DataRoot

    rng = np.random.default_rng(8)
    pool = sampled_pool(rng, 24)
    hum = sampled_pool(np.random.default_rng(99), 1)[0]
    corpus = [speech_like(f"s{number:03d}", 4, rng, pool) for number in range(11)]
    for number, rank in ((0, 0), (0, 1), (1, 0), (9, 0), (10, 0)):
        corpus[number][rank].fingerprint.sub_fingerprints[10] = hum
    replaced = speech_like("s001", 4, np.random.default_rng(12), pool)
    new = speech_like("new", 4, rng, pool, originals=[corpus[10][0]])
    hum_key = sampled_audio_keys(np.array([hum], np.uint32), np.ones(1, bool))[0][0]

    def re_index(data_root):  # committed, not merged: the level-0 segments stay live
        prefetched.append(len(log.lookups))
        with reserve_position(data_root, "s001") as reservation:
            decide_and_commit(data_root, reservation, replaced)

    data_root = DataRoot(str(tmp_path / "index"))
    for shard in corpus:
        run_shard(data_root, shard)
    log, prefetched = LookupLog(monkeypatch), []
    written, repairs = run_shard(data_root, new, meanwhile=re_index)
    assert not repairs
    holding = log.segments_looking_up(hum_key)
    assert [name[:2] for name in holding] == ["L2", "L0", "L0"]
    # The last of them is read for the key after s001 was re-indexed: in the settled read.
    assert [at for at, (_, keys) in enumerate(log.lookups) if hum_key in keys][-1] > prefetched[-1]
    assert written == decided_again_reading_every_key(tmp_path, data_root, new, monkeypatch)
    assert pq.read_metadata(io.BytesIO(written[0])).num_rows == 1  # the copy of s010's utterance
