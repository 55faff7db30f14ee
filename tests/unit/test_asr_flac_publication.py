"""A re-extracted shard never changes the audio under a published ASR manifest, even when it fails.

Each test publishes an old version of a shard (FLACs, index, manifests), re-lands it with other
audio and fewer utterances, then runs the new commit (``asr_flac`` then the manifest build) and
fails it at one step. Every row of every published manifest, parquet and NeMo JSONL alike, must
then decode to the samples and duration of one whole version; a re-run reaches the clean result.
"""

import hashlib
import json
import posixpath

import numpy as np
import pytest
import soundfile as sf

import speechdata.asr.flac as flac_module
import speechdata.asr.stage as stage_module
from speechdata.asr.flac import run_asr_flac
from speechdata.asr.stage import SPLITS, build_and_write_asr_manifests
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.shards import build_sample_shard

SHARD = "s1"


def land_and_index(data_root: DataRoot, n_utterances: int, seed: int) -> None:
    build_sample_shard(data_root, SHARD, n_utterances, seed=seed, long_recordings=1, formats=("wav", "flac"))
    run_raw_shards(data_root, SHARD)


def commit(data_root: DataRoot) -> None:
    run_asr_flac(data_root, SHARD)
    build_and_write_asr_manifests(data_root, combined=True)


def pcm_sha1_by_utt(data_root: DataRoot) -> dict[str, str]:
    index = data_root.read_parquet(layout.asr_flac_index(SHARD)).to_pylist()
    return {row["utt_id"]: row["audio_sha1"] for row in index}


def published_rows(data_root: DataRoot) -> dict[str, list[dict]]:
    """Every manifest file's rows as ``utt_id``, ``duration`` and the FLAC's path from the data root."""
    manifests_dir = posixpath.dirname(layout.asr_manifest("train"))
    files = {}
    for split in SPLITS:
        rows = data_root.read_parquet(layout.asr_manifest(split)).to_pylist()
        files[f"{split}.parquet"] = [
            {"utt_id": r["utt_id"], "duration": r["duration"], "flac": r["flac_path"], "text": r["text"]} for r in rows
        ]
        lines = data_root.fs.cat_file(data_root.path(layout.asr_manifest(split, "jsonl"))).decode().splitlines()
        nemo = [json.loads(line) for line in lines]
        # The JSONL has no utt_id: match each line to its parquet row by its position and text.
        files[f"{split}.jsonl"] = [
            {
                "utt_id": None,
                "duration": r["duration"],
                "flac": posixpath.normpath(posixpath.join(manifests_dir, r["audio_filepath"])),
                "text": r["text"],
            }
            for r in nemo
        ]
    return files


def assert_each_manifest_reads_one_whole_version(data_root: DataRoot, versions: dict[str, dict[str, str]]) -> None:
    """Decode every row's FLAC: its samples hash and duration must be one version's, the same for the file."""
    for name, rows in published_rows(data_root).items():
        possible = set(versions)
        for row in rows:
            path = data_root.path(row["flac"])
            assert data_root.fs.exists(path), f"{name}: {row['flac']} is gone while the manifest names it"
            with data_root.fs.open(path, "rb") as handle:
                pcm, rate = sf.read(handle, dtype="int16")
            assert rate == 16_000
            assert row["duration"] == pytest.approx(pcm.shape[0] / rate, abs=1e-9), f"{name}: {row['flac']}"
            sha1 = hashlib.sha1(np.ascontiguousarray(pcm).tobytes()).hexdigest()
            holding = {v for v, by_utt in versions.items() if sha1 in by_utt.values()}
            assert holding, f"{name}: {row['flac']} holds samples of no published version"
            possible &= holding
        assert possible, f"{name} mixes the samples of several versions"


def publish_old_and_land_new(data_root: DataRoot) -> dict[str, str]:
    land_and_index(data_root, 5, seed=1)
    commit(data_root)
    old = pcm_sha1_by_utt(data_root)
    land_and_index(data_root, 3, seed=2)  # other audio, two utterances withdrawn
    return old


def asr_outputs(data_root: DataRoot) -> dict[str, str]:
    paths = data_root.fs.find(data_root.path(layout.ASR)) + [data_root.path(layout.asr_flac_index(SHARD))]
    return {path[len(data_root.root) + 1 :]: hashlib.sha256(data_root.fs.cat_file(path)).hexdigest() for path in paths}


@pytest.fixture
def reference(tmp_path) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """The old version's samples, the new version's and every output of a clean commit."""
    data_root = DataRoot(str(tmp_path / "reference"))
    old = publish_old_and_land_new(data_root)
    commit(data_root)
    new = pcm_sha1_by_utt(data_root)
    assert set(new) < set(old) and any(new[u] != old[u] for u in new)  # the fixture really changes audio
    return old, new, asr_outputs(data_root)


def test_between_the_extraction_and_the_manifest_build_the_published_manifest_still_reads_back(tmp_path, reference):
    old, new, clean = reference
    data_root = DataRoot(str(tmp_path / "gap"))
    publish_old_and_land_new(data_root)
    run_asr_flac(data_root, SHARD)  # the manifest asset has not run yet
    assert_each_manifest_reads_one_whole_version(data_root, {"old": old})
    build_and_write_asr_manifests(data_root, combined=True)
    assert_each_manifest_reads_one_whole_version(data_root, {"new": new})
    assert asr_outputs(data_root) == clean


def count_fault_points(tmp_path, monkeypatch) -> list[str]:
    data_root = DataRoot(str(tmp_path / "counted"))
    publish_old_and_land_new(data_root)
    calls: list[str] = []
    for module in (flac_module, stage_module):
        monkeypatch.setattr(module, "fault_point", calls.append)
    commit(data_root)
    monkeypatch.undo()
    return calls


def test_a_commit_failing_at_any_step_leaves_every_manifest_row_reading_its_audio(tmp_path, monkeypatch, reference):
    old, new, clean = reference
    points = count_fault_points(tmp_path, monkeypatch)
    # FLACs, index, then parquet and JSONL of each split, then the removed table: every step can fail.
    assert len(points) == 2 + 2 * len(SPLITS) + 1, points
    for failing_call in range(len(points)):
        data_root = DataRoot(str(tmp_path / f"fails-at-{failing_call}"))
        publish_old_and_land_new(data_root)
        calls: list[str] = []

        def fail_at_step(name, calls=calls, failing_call=failing_call):
            calls.append(name)
            if len(calls) == failing_call + 1:
                raise OSError(f"no space left on device (after {name})")

        for module in (flac_module, stage_module):
            monkeypatch.setattr(module, "fault_point", fail_at_step)
        with pytest.raises(OSError, match="no space left"):
            commit(data_root)
        monkeypatch.undo()
        assert_each_manifest_reads_one_whole_version(data_root, {"old": old, "new": new})

        commit(data_root)
        assert_each_manifest_reads_one_whole_version(data_root, {"new": new})
        assert asr_outputs(data_root) == clean, calls[-1]


def test_flacs_are_collected_only_once_no_manifest_names_them(tmp_path, reference):
    old, new, _ = reference
    data_root = DataRoot(str(tmp_path / "collected"))
    publish_old_and_land_new(data_root)
    before = set(data_root.glob(f"{layout.asr_flac_dir(SHARD)}/*.flac"))
    run_asr_flac(data_root, SHARD)
    assert before <= set(data_root.glob(f"{layout.asr_flac_dir(SHARD)}/*.flac"))  # nothing removed yet
    summary = build_and_write_asr_manifests(data_root, combined=True)
    remaining = {p.rsplit("/", 1)[-1] for p in data_root.glob(f"{layout.asr_flac_dir(SHARD)}/*.flac")}
    indexed = {
        p.rsplit("/", 1)[-1] for p in data_root.read_parquet(layout.asr_flac_index(SHARD))["flac_path"].to_pylist()
    }
    assert remaining == indexed and len(indexed) == len(new)
    assert summary.flacs_removed == len(before - {data_root.path(f"{layout.asr_flac_dir(SHARD)}/{n}") for n in indexed})
    assert summary.flacs_removed > 0
