"""A bridge commit that fails at any step leaves readers the old version whole or the new one whole.

Each test publishes an old version of a shard, stages a new one (different sizes, so every byte range
moves), fails the commit at one step, and reads every published manifest row back through the real
``webdataset`` reader and by its byte range. A re-run then reaches exactly the clean result.
"""

import hashlib

import numpy as np
import pyarrow as pa
import pytest

import speechdata.bridge.commit as commit_module
from speechdata.bridge.commit import commit_bridge, stage_bridge, staged_index
from speechdata.bridge.manifest import manifest_path
from speechdata.bridge.reader import bridge_dataset, read_sample_at
from speechdata.bridge.tars import BridgeSample
from speechdata.io import layout
from speechdata.io.storage import DataRoot

OLD_KEYS = ["a", "b", "c"]
NEW_KEYS = ["a", "b"]


def sample(key: str, version: str, frames: int) -> BridgeSample:
    tokens = 2
    grid = np.array([0] * (frames - 1) + [1], np.int32)
    return BridgeSample(
        key=key,
        wav=np.full(1920 * frames, 0.25 if version == "new" else -0.25, np.float32),
        qwen=np.ones((tokens, 4), np.float16),
        wavlm=np.ones((frames, 4), np.float16),
        tokens=np.arange(tokens, dtype=np.int32),
        grid=grid,
        dur=np.array([frames - 1, 1], np.int32),
        info={"n_frames": frames, "n_tokens": tokens, "version": version},
    )


def manifest_for(index: pa.Table) -> pa.Table:
    return index.select(["key", "tar_url", "offset", "size"])


def publish_old_and_stage_new(data_root: DataRoot) -> pa.Table:
    old = stage_bridge(data_root, "s", iter([sample(k, "old", 5) for k in OLD_KEYS]), max_samples=1)
    commit_bridge(data_root, "s", old.index, manifest_for(old.index))
    new = stage_bridge(data_root, "s", iter([sample(k, "new", 9) for k in NEW_KEYS]), max_samples=1)
    assert not new.problems
    return new.index


def published_version(data_root: DataRoot) -> str:
    """Read every row of the published manifest back; the version they all hold (fails on a mix)."""
    manifest = data_root.read_parquet(manifest_path("s")).to_pylist()
    versions = set()
    for row in manifest:
        streamed = {s["__key__"]: s for s in bridge_dataset([data_root.uri(row["tar_url"])])}
        assert row["key"] in streamed, (row, sorted(streamed))
        by_range = read_sample_at(row["tar_url"], row["offset"], row["size"], data_root=data_root.url)
        assert by_range["__key__"] == row["key"]
        assert by_range["json"] == streamed[row["key"]]["json"]
        assert np.array_equal(by_range["wav"], streamed[row["key"]]["wav"])
        versions.add(by_range["json"]["version"])
    assert len(versions) == 1, f"the published manifest mixes versions {versions}"
    [version] = versions
    assert sorted(r["key"] for r in manifest) == (OLD_KEYS if version == "old" else NEW_KEYS)
    return version


def relative_digests(data_root: DataRoot) -> dict[str, str]:
    return {
        path[len(data_root.root) + 1 :]: hashlib.sha256(data_root.fs.cat_file(path)).hexdigest()
        for path in sorted(data_root.fs.find(data_root.root))
    }


def test_a_clean_commit_publishes_the_new_version_and_retires_the_old_tars(tmp_path):
    data_root = DataRoot(str(tmp_path / "clean"))
    index = publish_old_and_stage_new(data_root)
    assert published_version(data_root) == "old"  # staging changes nothing a reader sees
    commit_bridge(data_root, "s", index, manifest_for(index))
    assert published_version(data_root) == "new"
    tars = sorted(p.rsplit("/", 1)[-1] for p in data_root.glob("bridge/*.tar"))
    assert tars == sorted(u.rsplit("/", 1)[-1] for u in set(index["tar_url"].to_pylist())) and len(tars) == 2


def count_fault_points(tmp_path, monkeypatch) -> int:
    data_root = DataRoot(str(tmp_path / "counted"))
    index = publish_old_and_stage_new(data_root)
    calls = []
    monkeypatch.setattr(commit_module, "fault_point", calls.append)
    commit_bridge(data_root, "s", index, manifest_for(index))
    monkeypatch.undo()
    return len(calls)


def test_a_commit_failing_at_any_step_publishes_one_whole_version_and_a_rerun_finishes_it(tmp_path, monkeypatch):
    reference = DataRoot(str(tmp_path / "reference"))
    index = publish_old_and_stage_new(reference)
    commit_bridge(reference, "s", index, manifest_for(index))
    clean = relative_digests(reference)

    n_points = count_fault_points(tmp_path, monkeypatch)
    assert n_points >= 5  # two tar moves, index, manifest, stale tars: every step can fail
    for failing_call in range(n_points):
        data_root = DataRoot(str(tmp_path / f"fails-at-{failing_call}"))
        index = publish_old_and_stage_new(data_root)
        calls = []

        def fail_at_step(name, calls=calls, failing_call=failing_call):
            calls.append(name)
            if len(calls) == failing_call + 1:
                raise OSError(f"no space left on device (after {name})")

        monkeypatch.setattr(commit_module, "fault_point", fail_at_step)
        with pytest.raises(OSError, match="no space left"):
            commit_bridge(data_root, "s", index, manifest_for(index))
        monkeypatch.undo()
        published_version(data_root)  # whole, whichever it is

        resumed = staged_index(data_root, "s")
        assert resumed is not None, f"the staged index went before the commit finished (step {calls[-1]})"
        commit_bridge(data_root, "s", resumed, manifest_for(resumed))
        assert published_version(data_root) == "new"
        assert relative_digests(data_root) == clean, calls[-1]


def test_a_manifest_write_that_fails_after_the_tars_moved_leaves_the_old_version_readable(tmp_path, monkeypatch):
    data_root = DataRoot(str(tmp_path / "full-disk"))
    index = publish_old_and_stage_new(data_root)
    real_write = DataRoot.write_parquet

    def disk_full_for_manifests(self, relative, table, **options):
        if relative == manifest_path("s"):
            raise OSError("no space left on device")
        return real_write(self, relative, table, **options)

    monkeypatch.setattr(DataRoot, "write_parquet", disk_full_for_manifests)
    with pytest.raises(OSError):
        commit_bridge(data_root, "s", index, manifest_for(index))
    monkeypatch.undo()
    assert data_root.exists(layout.bridge_index("s"))  # the failure came after the tars and the index
    assert published_version(data_root) == "old"
    commit_bridge(data_root, "s", staged_index(data_root, "s"), manifest_for(index))
    assert published_version(data_root) == "new"


def test_removing_a_shards_old_tars_never_touches_a_shard_whose_id_extends_it(tmp_path):
    data_root = DataRoot(str(tmp_path / "neighbours"))
    other = stage_bridge(data_root, "s-b", iter([sample("x", "old", 5)]))
    commit_bridge(data_root, "s-b", other.index, manifest_for(other.index))
    before = sorted(data_root.glob("bridge/s-b-*.tar"))
    publish_old_and_stage_new(data_root)
    commit_bridge(data_root, "s", staged_index(data_root, "s"), manifest_for(staged_index(data_root, "s")))
    assert sorted(data_root.glob("bridge/s-b-*.tar")) == before and before
