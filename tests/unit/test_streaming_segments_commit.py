"""A streaming_segments run that fails part-way leaves every utterance the published table names with its JSON."""

import hashlib
import json

import pytest

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.translation.stage import run_streaming_segments
from tests.unit.test_streaming_stage import SHARD, land


def published_utterances_read_back(data_root: DataRoot) -> set[str]:
    """Every utterance of the published table, each checked against its own JSON document."""
    table = data_root.read_parquet(layout.streaming_segments(SHARD))
    utt_ids = set(table["utt_id"].to_pylist())
    for utt_id in utt_ids:
        relative = layout.streaming_segments_json(SHARD, utt_id)
        assert data_root.exists(relative), f"the published table names {utt_id}, whose JSON is gone"
        with data_root.fs.open(data_root.path(relative)) as handle:
            assert json.loads(handle.read())["utt_id"] == utt_id
    return utt_ids


def output_digests(data_root: DataRoot) -> dict[str, str]:
    prefix = data_root.path("translation")
    return {
        path[len(prefix) :]: hashlib.sha256(data_root.fs.cat_file(path)).hexdigest()
        for path in sorted(data_root.fs.find(prefix))
    }


def test_a_rerun_failing_between_its_json_writes_keeps_the_published_utterances_readable(data_root, monkeypatch):
    land(data_root)
    run_streaming_segments(data_root, SHARD)
    clean = output_digests(data_root)
    published = published_utterances_read_back(data_root)
    assert len(published) == 3

    real_write_bytes = DataRoot.write_bytes
    json_writes = []

    def disk_full_at_the_second_json(self, relative, data):
        if relative.endswith(".json") and "/json/" in relative:
            json_writes.append(relative)
            if len(json_writes) == 2:
                raise OSError("no space left on device")
        return real_write_bytes(self, relative, data)

    monkeypatch.setattr(DataRoot, "write_bytes", disk_full_at_the_second_json)
    with pytest.raises(OSError, match="no space left"):
        run_streaming_segments(data_root, SHARD)
    monkeypatch.undo()
    assert published_utterances_read_back(data_root) == published

    run_streaming_segments(data_root, SHARD)
    assert output_digests(data_root) == clean


def test_a_rerun_that_writes_fewer_utterances_removes_the_others_json(data_root):
    land(data_root)
    run_streaming_segments(data_root, SHARD)
    data_root.fs.rm(data_root.path(f"{layout.landing_segmentation_dir(SHARD)}/good.json"))
    run_streaming_segments(data_root, SHARD)
    assert not data_root.exists(layout.streaming_segments_json(SHARD, "good"))
    assert published_utterances_read_back(data_root) == {"poor", "imported"}
