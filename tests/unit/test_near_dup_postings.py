"""Posting segments (speechdata.quality.near_dup_postings): a lookup reads only the blocks that can
hold its keys and finds exactly their postings; a damaged block or header is detected; a streamed
merge writes the segment an in-memory merge would, byte for byte."""

import io

import numpy as np
import pytest

from speechdata.quality import near_dup_postings as postings_module
from speechdata.quality.near_dup_postings import (
    BLOCK_RECORDS,
    POSTING_DTYPE,
    DamagedSegment,
    SegmentShard,
    SegmentWriter,
    lookup_segment,
    merge_earlier_postings,
    merge_segments,
    owner_of,
    postings_for,
    read_segment_header,
    segment_bytes,
    segment_name,
    sort_postings,
)


def random_postings(rng, position: int, count: int, key_range: int) -> np.ndarray:
    made = np.zeros(count, POSTING_DTYPE)
    made["key"] = rng.integers(0, key_range, count, dtype=np.uint64)  # repeated keys span blocks
    made["owner"] = owner_of(position, rng.integers(0, 100, count))
    made["frame"] = rng.integers(0, 50, count)
    made["context"] = rng.integers(0, 2**63, count, dtype=np.uint64)
    return sort_postings(made)


def test_a_lookup_reads_only_the_blocks_of_its_keys_and_finds_every_posting_of_them(monkeypatch):
    rng = np.random.default_rng(0)
    everything = random_postings(rng, 0, 40 * BLOCK_RECORDS, 3_000)
    content = segment_bytes(everything, 0, [SegmentShard(0, "s", "v")])
    keys = np.unique(np.concatenate([everything["key"][[5, 5_000, 9_999]], [10**9]]))
    blocks_read = []
    checked_blocks = postings_module._checked_blocks
    monkeypatch.setattr(
        postings_module,
        "_checked_blocks",
        lambda *args: blocks_read.append(args[4] - args[3]) or checked_blocks(*args),
    )
    header, found = lookup_segment(io.BytesIO(content), "s.seg", keys)
    assert header.records == len(everything) and header.shards == (SegmentShard(0, "s", "v"),)
    np.testing.assert_array_equal(found, postings_for(everything, keys))
    assert 0 < sum(blocks_read) <= 8  # of 40


def test_a_damaged_block_or_header_is_detected():
    rng = np.random.default_rng(1)
    everything = random_postings(rng, 0, 3 * BLOCK_RECORDS, 500)
    content = bytearray(segment_bytes(everything, 0, [SegmentShard(0, "s", "v")]))
    content[-10] ^= 1
    with pytest.raises(DamagedSegment, match="block 2 checksum"):
        lookup_segment(io.BytesIO(bytes(content)), "s.seg", everything["key"][-1:])
    content = bytearray(segment_bytes(everything, 0, [SegmentShard(0, "s", "v")]))
    content[60] ^= 1
    with pytest.raises(DamagedSegment, match="header"):
        read_segment_header(io.BytesIO(bytes(content)), "s.seg")
    with pytest.raises(DamagedSegment, match="truncated"):
        lookup_segment(io.BytesIO(bytes(segment_bytes(everything, 0, []))[:-100]), "s.seg", everything["key"][-1:])


@pytest.mark.parametrize("chunk", [1, 300, 10**6])
def test_a_streamed_merge_writes_the_segment_an_in_memory_merge_would(chunk):
    rng = np.random.default_rng(2)
    inputs, everything = [], []
    for position in range(5):
        part = random_postings(rng, position, int(rng.integers(0, 3_000)), 5_000)
        content = segment_bytes(part, 0, [SegmentShard(position, f"s{position}", "v")])
        handle = io.BytesIO(content)
        inputs.append((handle, f"s{position}", read_segment_header(handle, f"s{position}")))
        everything.append(part)
    kept = np.array([0, 2, 3, 4])  # position 1 was re-indexed elsewhere
    merged = sort_postings(np.concatenate(everything))
    merged = merged[np.isin(merged["owner"] >> 24, kept)]
    shards = [SegmentShard(int(p), f"s{p}", "v") for p in kept]
    expected = segment_bytes(merged, 1, shards)
    writer = SegmentWriter()
    merge_segments([(handle, path, header, kept) for handle, path, header in inputs], writer, chunk)
    name, pieces = writer.finish(1, shards)
    assert b"".join(pieces) == expected and name == segment_name(expected, 1)


def test_an_envelope_pair_key_is_shared_exactly_when_both_of_its_bands_are():
    from speechdata.quality.fingerprint_envelope import LSH_BAND_PAIRS, LSH_BANDS, envelope_band_keys
    from speechdata.quality.near_dup_postings import envelope_keys

    rng = np.random.default_rng(3)
    first, second = np.triu_indices(LSH_BANDS, k=1)
    original = rng.standard_normal(64)
    shared_counts = set()
    for noise in [0.0, *np.linspace(0.3, 0.68, 20), 50.0]:
        copy = original + rng.normal(0, noise, 64)
        same_band = envelope_band_keys(original) == envelope_band_keys(copy)
        keys, copy_keys = envelope_keys(original), envelope_keys(copy)
        assert len(keys) == len(np.unique(keys)) == LSH_BAND_PAIRS
        shared = set(keys.tolist()) & set(copy_keys.tolist())
        # the keys shared are exactly those of the pairs whose two bands both match: k bands, k (k-1) / 2 keys
        assert shared == set(keys[same_band[first] & same_band[second]].tolist())
        assert len(shared) == same_band.sum() * (same_band.sum() - 1) // 2
        shared_counts.add(int(same_band.sum()))
    assert {0, 1, 2, 3, LSH_BANDS} <= shared_counts  # no band, one, the two of a pair, three, all


@pytest.mark.parametrize("batch_bytes", [1, 3 * BLOCK_RECORDS * 28, 8 << 20])
def test_a_lookup_finds_the_same_postings_however_its_blocks_are_gathered(monkeypatch, batch_bytes):
    """The blocks a lookup reads are searched for its keys a batch at a time: one block per batch,
    a few, or all at once give the same postings in the same order."""
    rng = np.random.default_rng(3)
    everything = random_postings(rng, 0, 30 * BLOCK_RECORDS, 900)
    content = segment_bytes(everything, 0, [SegmentShard(0, "s", "v")])
    keys = np.unique(np.concatenate([everything["key"][::97], rng.integers(0, 2**63, 50, dtype=np.int64)]))
    monkeypatch.setattr(postings_module, "LOOKUP_BATCH_BYTES", batch_bytes)
    _, found = lookup_segment(io.BytesIO(content), "s.seg", keys.astype(np.uint64))
    np.testing.assert_array_equal(found, postings_for(everything, keys.astype(np.uint64)))
    assert len(found) >= len(everything["key"][::97])


@pytest.mark.parametrize("earlier_count", [0, 1, 3_000])
def test_earlier_postings_merged_into_a_shards_own_are_what_sorting_both_gives(earlier_count):
    rng = np.random.default_rng(earlier_count)
    own = random_postings(rng, 9, 5_000, 600)
    # In any order, from several segments; keys shared with the shard's own and repeated (context differs).
    earlier = np.concatenate([random_postings(rng, position, earlier_count // 3, 600) for position in (4, 1, 7)])
    earlier = np.concatenate([earlier, earlier[: len(earlier) // 5]])
    earlier["context"][len(earlier) - len(earlier) // 5 :] += np.uint64(1)
    rng.shuffle(earlier)
    merged = merge_earlier_postings(earlier, own)
    assert merged.tobytes() == sort_postings(np.concatenate([earlier, own])).tobytes()
