"""Segments keep a sampled audio key's earliest ``MAX_KEY_OCCURRENCES + 1`` postings only, and the
index decides exactly as an uncapped one: with the cap lowered to 4 so that a few shards of audio
keys drawn from a small pool of values hit it in some segments and not in others, across merges and
a shard re-indexed after its postings were merged. The capped index's reader also stops reading a
key once its postings pass the cap (``test_near_dup_skip_capped``); the uncapped one reads every key
in every segment, as before both."""

import io
from dataclasses import replace

import numpy as np
import pytest

from speechdata.quality import near_dup_index_merge, near_dup_postings
from speechdata.quality.near_dup_index import index_keys, read_state, repair_index
from speechdata.quality.near_dup_postings import (
    POSTING_DTYPE,
    SegmentShard,
    SegmentWriter,
    capped_postings_mask,
    read_all_postings,
    read_segment_header,
    segment_bytes,
)
from tests.unit.near_dup_stage_path import (
    CAP,
    corpus_of,
    lower_cap_and_fanout,
    run_shard,
    sampled_pool,
    segment_postings,
    speech_like,
    uncapped,
)


@pytest.fixture(autouse=True)
def small_cap_and_fanout(monkeypatch):
    lower_cap_and_fanout(monkeypatch, fold=False)


def build(data_root, corpus, reindexed=None):
    decided, counts, repairs = [], [], []
    for number, shard in enumerate(corpus):
        decisions, counted, repaired = run_shard(data_root, shard, returning=("decisions", "counts", "repairs"))
        decided.append(decisions)
        counts.append(counted)
        repairs += repaired
        if reindexed is not None and number == reindexed[0]:
            decisions, repaired = run_shard(data_root, reindexed[1], returning=("decisions", "repairs"))
            decided.append(decisions)
            repairs += repaired
    return decided, counts, repairs


def test_capped_segments_decide_every_shard_as_uncapped_ones_across_merges(tmp_path, monkeypatch):
    from speechdata.io.storage import DataRoot

    corpus = corpus_of(5, 10)
    capped_root = DataRoot(str(tmp_path / "capped"))
    capped = build(capped_root, corpus)
    capped_segments = segment_postings(capped_root)
    uncapped(monkeypatch)
    full_root = DataRoot(str(tmp_path / "full"))
    full = build(full_root, corpus)
    assert capped[0] == full[0]  # every shard's decisions
    for capped_counts_of, full_counts_of in zip(capped[1], full[1], strict=True):
        np.testing.assert_array_equal(capped_counts_of, full_counts_of)
    assert sum(d.kind is not None for shard in capped[0] for d in shard) >= 10  # the near copies found
    full_segments = segment_postings(full_root)
    assert {name[:2] for name in capped_segments} == {"L0", "L2"}  # merged twice: level 1, then 2
    # Capped: fewer postings, none of another kind left out, and a key at the cap in one segment
    # is below it in another.
    capped_total = sum(len(p) for p in capped_segments.values())
    full_total = sum(len(p) for p in full_segments.values())
    assert capped_total < full_total
    at_cap, below_cap = set(), set()
    for postings in capped_segments.values():
        keys, counts = np.unique(postings["key"][capped_postings_mask(postings)], return_counts=True)
        assert counts.max() <= CAP
        at_cap |= set(keys[counts == CAP].tolist())
        below_cap |= set(keys[counts < CAP].tolist())
    assert at_cap & below_cap
    other = [np.sort(p[~capped_postings_mask(p)], order=["key", "owner", "frame"]) for p in capped_segments.values()]
    other_full = [np.sort(p[~capped_postings_mask(p)], order=["key", "owner", "frame"]) for p in full_segments.values()]
    np.testing.assert_array_equal(np.sort(np.concatenate(other)), np.sort(np.concatenate(other_full)))


def test_a_shard_re_indexed_after_its_capped_postings_were_merged_is_rebuilt_not_guessed(tmp_path, monkeypatch):
    """s000's postings of a key fill the merged segment's cap; s000 is re-indexed without that key.
    Its stale postings would leave the key 0 earlier postings in that segment, where the live ones
    the cap dropped count: the reader finds the count unknown, the repair rebuilds the segment from
    its members' entries, and every decision is the uncapped index's."""
    from speechdata.io.storage import DataRoot

    rng = np.random.default_rng(99)  # not the corpus pool's generator: a key of its own
    corpus = corpus_of(11, 5)
    hum = sampled_pool(rng, 1)[0]
    for number in (0, 1):  # s000 holds the key 4 times (the cap), s001 twice more: never merged whole
        for rank in range(4 if number == 0 else 2):
            values = corpus[number][rank].fingerprint.sub_fingerprints
            values[10] = hum
    corpus.append(speech_like("s005", 4, rng, sampled_pool(rng, 24), originals=[corpus[1][0]]))
    corpus[5][0].fingerprint.sub_fingerprints[10] = hum  # the copy of an utterance holding the key
    replaced = speech_like("s000", 4, np.random.default_rng(12), sampled_pool(rng, 24))  # without it
    capped_root = DataRoot(str(tmp_path / "capped"))
    capped = build(capped_root, corpus, reindexed=(2, replaced))
    uncapped(monkeypatch)
    full = build(DataRoot(str(tmp_path / "full")), corpus, reindexed=(2, replaced))
    assert capped[0] == full[0]
    for capped_counts_of, full_counts_of in zip(capped[1], full[1], strict=True):
        np.testing.assert_array_equal(capped_counts_of, full_counts_of)
    assert any("segment rebuilt from its entries" in line for line in capped[2])
    assert [s.position for s in read_state(capped_root)] == list(range(6))


def test_a_merge_of_a_segment_whose_capped_postings_went_stale_repairs_it_first(tmp_path, monkeypatch):
    """The same re-indexed s000, and no shard reads the key until a merge takes that segment in:
    the compaction runs the repair instead of writing a merged segment short of the live postings,
    and the shard that then reads the key decides and counts as the uncapped index does."""
    from speechdata.io.storage import DataRoot

    rng = np.random.default_rng(99)  # not the corpus pool's generator: a key of its own
    corpus = corpus_of(11, 3)
    hum = sampled_pool(rng, 1)[0]
    for number in (0, 1):
        for rank in range(4 if number == 0 else 2):
            corpus[number][rank].fingerprint.sub_fingerprints[10] = hum
    others = sampled_pool(rng, 24)  # keys the first shards' do not share: their readers find no stale key
    corpus += [speech_like(f"s{number:03d}", 4, rng, others) for number in range(3, 9)]
    corpus.append(speech_like("s009", 4, rng, others, originals=[corpus[1][0]]))
    corpus[9][0].fingerprint.sub_fingerprints[10] = hum
    replaced = speech_like("s000", 4, np.random.default_rng(12), sampled_pool(rng, 24))
    repairs = []

    def counted_repair(*args, **kwargs):
        repairs.append(repair_index(*args, **kwargs))
        return repairs[-1]

    monkeypatch.setattr(near_dup_index_merge, "repair_index", counted_repair)
    capped = build(DataRoot(str(tmp_path / "capped")), corpus, reindexed=(2, replaced))
    assert any("segment rebuilt from its entries" in line for line in sum(repairs, []))
    assert not capped[2]  # the compaction repaired it: no reader found it
    uncapped(monkeypatch)
    full = build(DataRoot(str(tmp_path / "full")), corpus, reindexed=(2, replaced))
    assert capped[0] == full[0]
    for capped_counts_of, full_counts_of in zip(capped[1], full[1], strict=True):
        np.testing.assert_array_equal(capped_counts_of, full_counts_of)


def test_only_sampled_audio_postings_are_capped_and_a_writer_fed_mid_key_caps_as_one_piece(monkeypatch):
    rng = np.random.default_rng(4)
    pool = sampled_pool(rng, 1)
    signals = speech_like("s", 12, rng, pool)
    for utterance in signals:
        utterance.fingerprint.sub_fingerprints[5:8] = pool[0]  # the same key 3 times an utterance
    common = [replace(s, exact_hash=signals[0].exact_hash) for s in signals]  # one exact key in all 12
    postings = index_keys(common, 0)
    audio = capped_postings_mask(postings)
    assert audio.sum() == len(postings) - len(common)  # every audio posting, no exact one
    written = segment_bytes(postings, 0, [SegmentShard(0, "s", "v")])
    _, kept = read_all_postings(io.BytesIO(written), "s.seg")
    hum_key = near_dup_postings.sampled_audio_keys(pool[:1], np.ones(1, bool))[0][0]
    assert (kept["key"] == hum_key).sum() == CAP  # of 36, the earliest 4 by owner and frame
    np.testing.assert_array_equal(kept[kept["key"] == hum_key], postings[postings["key"] == hum_key][:CAP])
    assert (kept["key"] == postings["key"][~audio][0]).sum() == 12  # the exact key: never capped
    writer = SegmentWriter()
    for piece in np.array_split(postings, 37):  # pieces that split the common key's postings
        writer.add(piece)
    name, pieces = writer.finish(0, [SegmentShard(0, "s", "v")])
    assert b"".join(pieces) == written
    assert read_segment_header(io.BytesIO(written), "s.seg").records == len(kept) < len(postings)
    # A key's kept postings holding a stale shard's: unknown when they fill the cap and all come
    # before the bound; known when one is at or after it, or when there are more than the cap (a
    # segment written before the cap holds every posting).
    hum = kept[kept["key"] == hum_key]
    stale, after = np.arange(CAP) == 0, np.zeros(CAP, bool)
    assert near_dup_postings.uncertain_capped_keys(hum, stale, after).tolist() == [hum_key]
    assert len(near_dup_postings.uncertain_capped_keys(hum, stale, np.arange(CAP) == CAP - 1)) == 0
    assert len(near_dup_postings.uncertain_capped_keys(hum, np.zeros(CAP, bool), after)) == 0
    every = postings[postings["key"] == hum_key]
    assert len(near_dup_postings.uncertain_capped_keys(every, np.arange(len(every)) == 0)) == 0
    unmixed = near_dup_postings._unmix(postings["key"])
    np.testing.assert_array_equal(near_dup_postings._mix(unmixed), postings["key"])
    assert POSTING_DTYPE.itemsize == 28  # the format: unchanged
