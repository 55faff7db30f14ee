"""A per-shard part of the ASR manifests is a manifest by itself: the training dataset reads a
directory of parts, and each JSONL part's relative paths resolve from its own directory (NeMo's rule)."""

import json
import posixpath

import pytest

from speechdata.asr.dataset import AsrManifestDataset
from speechdata.asr.flac import run_asr_flac
from speechdata.asr.manifest import AsrManifestConfig
from speechdata.asr.stage import build_and_write_asr_manifests, read_published_build
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.shards import build_sample_shard


def test_the_parts_are_manifests_the_dataset_and_nemo_paths_resolve(tmp_path):
    data_root = DataRoot(str(tmp_path / "root"))
    for seed, shard_id in enumerate(("s1", "s2")):
        build_sample_shard(data_root, shard_id, 3, seed=seed, long_recordings=0, formats=("wav",))
        run_raw_shards(data_root, shard_id)
        run_asr_flac(data_root, shard_id)
    config = AsrManifestConfig(validation_share=0.5, eval_per_language=1, min_duration_s=0.1)
    build_and_write_asr_manifests(data_root, config, combined=False)
    assert not data_root.exists(layout.asr_manifest("train"))
    parts_dir = data_root.path(posixpath.dirname(layout.asr_manifest_part("train", "s1")))
    dataset = AsrManifestDataset(parts_dir, tokenizer=lambda text: [1, 2])
    assert len(dataset) > 0
    for index in range(len(dataset)):
        item = dataset[index]
        assert item is not None and item["signal"].shape[0] == pytest.approx(item["duration"] * 16_000, abs=1)
    lines = 0
    for split in ("train", "validation"):
        for path in data_root.glob(layout.asr_manifest_part(split, "*", "jsonl")):
            for line in data_root.fs.cat_file(path).decode().splitlines():
                # NeMo's rule: a relative audio_filepath is taken from the manifest's own directory.
                assert data_root.fs.exists(posixpath.join(posixpath.dirname(path), json.loads(line)["audio_filepath"]))
                lines += 1
    assert lines == read_published_build(data_root).train.height + read_published_build(data_root).validation.height
