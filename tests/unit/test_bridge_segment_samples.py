"""A recording longer than one training sample is packed as one sample per aligned segment, cut on the
Mimi clock, and the real WebDataset reader reads those samples."""

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import webdataset as wds

from speechdata import products
from speechdata.alignment.segmentation import cut_segments
from speechdata.alignment.table import alignment_rows, alignments_table, words_by_utterance
from speechdata.audio.codec import decode_pcm16
from speechdata.bridge.segments import SEGMENT_KEY_SEPARATOR, utterance_of_key
from speechdata.bridge.shard_manifest import build_shard_manifest
from speechdata.bridge.tars import iter_bridge_samples, pack_samples
from speechdata.features.array_store import iter_arrays
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.packing_inputs import write_packing_inputs

SHARD = "talks"


def land_long_recordings(root: DataRoot, codec: str) -> list[str]:
    """Two 70 s recordings, their words aligned, and the aligner's segment rows for each."""
    keys = write_packing_inputs(root, SHARD, 2, seconds=70.0, qwen_dim=8, wavlm_dim=4, codec=codec, pool=2)
    table = root.read_parquet(layout.alignments(SHARD))
    rows = table.to_pylist()
    for utt_id, words in words_by_utterance(table).items():
        rows += alignment_rows(utt_id, "segment", cut_segments(words, 70_000))
    root.write_parquet(layout.alignments(SHARD), alignments_table(rows))
    root.write_parquet(
        layout.alignment_scores(SHARD), pa.table({"utt_id": keys, "score": pa.array([-0.5] * len(keys), pa.float32())})
    )
    return keys


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    out = {}
    for codec in ("pcm16", "flac16"):
        root = DataRoot(str(tmp_path_factory.mktemp(codec)))
        keys = land_long_recordings(root, codec)
        samples = list(iter_bridge_samples(root, SHARD))
        tars, index = pack_samples(root, SHARD, iter(samples))
        out[codec] = root, keys, samples, tars, index
    return out


def test_each_segment_is_a_sample_cut_on_the_mimi_clock(packed):
    root, keys, samples, _, _ = packed["pcm16"]
    assert [s.key for s in samples] == sorted(s.key for s in samples)
    assert {utterance_of_key(s.key) for s in samples} == set(keys)
    assert all(SEGMENT_KEY_SEPARATOR in s.key for s in samples)
    container = root.read_parquet(layout.normalized_audio(SHARD)).to_pylist()
    audio = {r["utt_id"]: decode_pcm16(r["audio"], r["codec"]) for r in container}
    qwen = dict(iter_arrays(root, layout.qwen_hidden_states(SHARD)))
    wavlm = dict(iter_arrays(root, layout.wavlm_features(SHARD)))
    words = {k: [w.text for w in v] for k, v in words_by_utterance(root.read_parquet(layout.alignments(SHARD))).items()}
    for key in keys:
        mine = [s for s in samples if utterance_of_key(s.key) == key]
        assert len(mine) >= 3  # 70 s cut into segments of at most 20 s
        assert [w["word"] for s in mine for w in s.info["words"]] == words[key]  # every word in one segment
        assert " ".join(s.info["text"] for s in mine) == " ".join(words[key])
        for sample in mine:
            segment = sample.info["segment"]
            first_frame, frames = segment["first_frame"], sample.info["n_frames"]
            assert segment["offset_ms"] == first_frame * 80
            assert sample.wav.shape[0] <= frames * 1920
            np.testing.assert_array_equal(
                sample.wav, audio[key][first_frame * 1920 : first_frame * 1920 + sample.wav.shape[0]]
            )
            np.testing.assert_array_equal(sample.wavlm, wavlm[key][first_frame : first_frame + frames])
            t0 = segment["first_token"]
            np.testing.assert_array_equal(sample.qwen, qwen[key][t0 : t0 + sample.info["n_tokens"]])
            assert sample.grid.shape == (frames,) and sample.dur.shape == sample.tokens.shape
            assert int(sample.dur.sum()) + int((sample.grid == -1).sum()) == frames
            owned = sample.grid[sample.grid >= 0]
            assert owned.size and (np.diff(owned) >= 0).all() and owned.max() < sample.tokens.size
            assert all(0 <= w["start_ms"] <= w["end_ms"] <= frames * 80 for w in sample.info["words"])


def test_flac_and_pcm_storage_pack_the_same_segment_tars(packed):
    digests = {
        codec: [hashlib.sha256(Path(root.path(t.relative)).read_bytes()).hexdigest() for t in tars]
        for codec, (root, _, _, tars, _) in packed.items()
    }
    assert digests["pcm16"] == digests["flac16"]


def test_the_webdataset_reader_reads_the_segment_samples(packed):
    root, _, samples, tars, _ = packed["pcm16"]
    urls = [root.path(t.relative) for t in tars]
    read = list(wds.WebDataset(urls, shardshuffle=False).decode())
    assert [r["__key__"] for r in read] == [s.key for s in samples]
    for record, sample in zip(read, samples, strict=True):
        assert record["json"]["text"] == sample.info["text"]
        assert record["json"]["segment"]["utt_id"] == utterance_of_key(sample.key)
        np.testing.assert_array_equal(record["grid.npy"], sample.grid)
        assert record["wavlm.npy"].shape == (record["json"]["n_frames"], 4)
        assert record["qwen.npy"].shape == (record["json"]["n_tokens"], 8)


def test_the_manifest_lists_each_segment_and_the_ledger_counts_its_recording(packed):
    root, keys, samples, _, index = packed["pcm16"]
    manifest = build_shard_manifest(root, SHARD, index).to_pylist()
    assert [r["key"] for r in manifest] == [s.key for s in samples]
    for row, sample in zip(manifest, samples, strict=True):
        assert row["text"] == sample.info["text"] and row["n_frames"] == sample.info["n_frames"]
        assert row["duration_s"] == sample.wav.shape[0] / 24_000 < 31.0
    [bridge] = [line for line in products.product_lines() if line.name == "bridge"]
    assert bridge.id_part_separator == SEGMENT_KEY_SEPARATOR
    root.write_parquet(layout.shard_manifest(SHARD), pa.Table.from_pylist(manifest))
    from speechdata.accounting.ledgers import produced_utterances

    assert produced_utterances(root, SHARD, "bridge") == set(keys)
