"""Staged bridge tars: nothing changes for readers until the commit, and a broken commit resumes."""

import hashlib

import numpy as np
import pyarrow as pa
import pytest

import speechdata.bridge.commit as commit_module
from speechdata.bridge.commit import commit_bridge, stage_bridge, staged_index
from speechdata.bridge.tars import BridgeSample
from speechdata.io import layout


def sample(key: str, frames: int = 5, tokens: int = 2) -> BridgeSample:
    grid = np.array([0, 0, 1, -1, -1][:frames], np.int32)
    return BridgeSample(
        key=key,
        wav=np.zeros(1920 * frames, np.float32),
        qwen=np.ones((tokens, 4), np.float16),
        wavlm=np.ones((frames, 4), np.float16),
        tokens=np.arange(tokens, dtype=np.int32),
        grid=grid,
        dur=np.array([2, 1], np.int32),
        info={"n_frames": frames, "n_tokens": tokens},
    )


def digests(data_root) -> dict[str, str]:
    return {p: hashlib.sha256(data_root.fs.cat_file(p)).hexdigest() for p in sorted(data_root.fs.find(data_root.root))}


def manifest_for(index: pa.Table) -> pa.Table:
    return pa.table({"key": index["key"]})


def test_staging_changes_nothing_a_reader_sees_until_the_commit(data_root):
    first = stage_bridge(data_root, "s", iter([sample("a"), sample("b")]), max_samples=1)
    assert not first.problems and len(first.tars) == 2
    assert not data_root.fs.glob(data_root.path("bridge/*.tar"))
    commit_bridge(data_root, "s", first.index, manifest_for(first.index))
    assert len(data_root.fs.glob(data_root.path("bridge/s-*.tar"))) == 2
    assert staged_index(data_root, "s") is None

    empty = stage_bridge(data_root, "s", iter([]))
    assert empty.tars == [] and empty.index.num_rows == 0
    assert len(data_root.fs.glob(data_root.path("bridge/s-*.tar"))) == 2  # the old version, whole
    commit_bridge(data_root, "s", empty.index, manifest_for(empty.index))
    assert data_root.fs.glob(data_root.path("bridge/s-*.tar")) == []
    assert data_root.read_parquet(layout.bridge_index("s")).num_rows == 0


def test_a_commit_interrupted_half_way_is_finished_by_the_next_run(data_root, monkeypatch):
    def samples():
        return iter([sample("a"), sample("b"), sample("c")])

    reference = stage_bridge(data_root, "s", samples(), max_samples=1)
    commit_bridge(data_root, "s", reference.index, manifest_for(reference.index))
    clean = digests(data_root)
    data_root.fs.rm(data_root.root, recursive=True)

    staged = stage_bridge(data_root, "s", samples(), max_samples=1)

    def crash(name):
        if name == "commit":
            raise KeyboardInterrupt("killed mid-swap")

    monkeypatch.setattr(commit_module, "fault_point", crash)
    with pytest.raises(KeyboardInterrupt):
        commit_bridge(data_root, "s", staged.index, manifest_for(staged.index))
    monkeypatch.undo()
    assert len(data_root.fs.glob(data_root.path("bridge/s-*.tar"))) == 1  # half swapped
    resumed = staged_index(data_root, "s")
    commit_bridge(data_root, "s", resumed, manifest_for(resumed))
    assert digests(data_root) == clean
