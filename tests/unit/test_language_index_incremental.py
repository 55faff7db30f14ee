"""The language index is updated shard by shard: a new shard's update reads, gates and writes that
shard only, the parts equal the from-scratch build, and a killed update re-runs to the same bytes."""

import io

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

import speechdata.vad.language_index as language_index
from speechdata.accounting.ledger_gate import UnbalancedLedger
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_raw_shards
from speechdata.vad.language_index import (
    build_language_shard_index,
    read_language_shard_index,
    update_language_shard_index,
)
from speechdata.vad.stage import run_vad_segments
from speechdata.vad.tar_retention import published_tar_paths, remove_unreferenced_packed_tars
from tests.conftest import land_shard

RATE = 16_000


def wav(seed: int, seconds: float = 2.0) -> bytes:
    samples = (np.random.default_rng(seed).standard_normal(int(seconds * RATE)) * 0.1).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, samples, RATE, format="WAV")
    return buffer.getvalue()


def segmented_shard(data_root: DataRoot, shard_id: str, seed: int, languages=("en", "fr", "en")) -> None:
    files = {f"{shard_id}-{n}.wav": wav(seed * 10 + n) for n in range(len(languages))}
    rows = [
        {"utt_id": path.removesuffix(".wav"), "audio_path": path, "language": language}
        for path, language in zip(files, languages, strict=True)
    ]
    land_shard(data_root, shard_id, rows, files)
    segments = [{"audio_path": path, "start_s": [0.2], "end_s": [1.8]} for path in files]
    data_root.write_parquet(layout.landing_vad_segments(shard_id), pa.Table.from_pylist(segments))
    run_raw_shards(data_root, shard_id)
    run_vad_segments(data_root, shard_id, model=None)


def part_stats(data_root: DataRoot, language: str) -> dict[str, tuple]:
    stats = {}
    for path in data_root.glob(layout.language_shard_index_part(language, "*")):
        info = data_root.fs.info(path)
        stats[path] = (info["mtime"], info.get("ino"), data_root.fs.cat_file(path))
    return stats


@pytest.fixture
def gated(monkeypatch) -> list[str]:
    """The shards whose ledger the update checks, in order."""
    checked: list[str] = []
    real = language_index.require_balanced

    def counting(data_root, shard_id, product, produced):
        checked.append(shard_id)
        return real(data_root, shard_id, product, produced)

    monkeypatch.setattr(language_index, "require_balanced", counting)
    return checked


def test_a_new_shard_touches_only_its_own_part_and_ledger(data_root, gated, monkeypatch):
    for number, shard_id in enumerate(("s1", "s2")):
        segmented_shard(data_root, shard_id, number)
    first = update_language_shard_index(data_root, "en")
    assert first.shards_checked == ["s1", "s2"] and gated == ["s1", "s2"]
    assert read_language_shard_index(data_root, "en") == build_language_shard_index(data_root, "en")
    gated.clear()  # the from-scratch build gates every shard
    before = part_stats(data_root, "en")
    state_before = data_root.fs.cat_file(data_root.path(layout.language_shard_index_state("en")))

    # Nothing changed: nothing read, gated or written.
    reads: list[str] = []
    real_read = DataRoot.read_parquet
    monkeypatch.setattr(
        DataRoot, "read_parquet", lambda self, rel, *a, **k: reads.append(rel) or real_read(self, rel, *a, **k)
    )
    again = update_language_shard_index(data_root, "en")
    assert again.shards_checked == [] and gated == []
    assert reads == [layout.language_shard_index_state("en")]
    assert data_root.fs.cat_file(data_root.path(layout.language_shard_index_state("en"))) == state_before

    segmented_shard(data_root, "s3", 2)
    reads.clear()
    third = update_language_shard_index(data_root, "en")
    assert third.shards_checked == ["s3"] and gated == ["s3"]
    # Only the new shard's VAD table is read (and its ledger's inputs): no other shard's files.
    assert not [path for path in reads if "/s1/" in path or "/s2/" in path], reads
    after = part_stats(data_root, "en")
    assert {path: after[path] for path in before} == before  # untouched: same bytes, mtime and inode
    assert len(after) == 3
    assert read_language_shard_index(data_root, "en") == build_language_shard_index(data_root, "en")
    assert third.totals["files"] == sum(read_language_shard_index(data_root, "en")["files"].to_pylist()) == 6


def test_a_killed_update_reruns_to_the_same_bytes(data_root, monkeypatch):
    for number, shard_id in enumerate(("s1", "s2")):
        segmented_shard(data_root, shard_id, number)
    real_write = DataRoot.write_parquet

    def dies_at_the_state(self, relative, table, **options):
        if relative == layout.language_shard_index_state("fr"):
            raise KeyboardInterrupt("killed")
        return real_write(self, relative, table, **options)

    monkeypatch.setattr(DataRoot, "write_parquet", dies_at_the_state)
    with pytest.raises(KeyboardInterrupt):
        update_language_shard_index(data_root, "fr")
    monkeypatch.setattr(DataRoot, "write_parquet", real_write)
    rerun = update_language_shard_index(data_root, "fr")
    assert rerun.shards_checked == ["s1", "s2"]
    killed_then_rerun = part_stats(data_root, "fr")

    clean = DataRoot(data_root.path("") + "-clean")
    for number, shard_id in enumerate(("s1", "s2")):
        segmented_shard(clean, shard_id, number)
    update_language_shard_index(clean, "fr")
    assert [stat[2] for stat in killed_then_rerun.values()] == [stat[2] for stat in part_stats(clean, "fr").values()]


def test_an_unbalanced_changed_shard_stops_the_update_before_any_write(data_root):
    segmented_shard(data_root, "s1", 0)
    update_language_shard_index(data_root, "en")
    before = part_stats(data_root, "en")
    segmented_shard(data_root, "s2", 1)
    # s1 re-landed with one more utterance and not re-segmented: its table no longer balances.
    land_shard(
        data_root,
        "s1",
        [{"utt_id": f"s1-{n}", "audio_path": f"s1-{n}.wav", "language": "en"} for n in range(4)],
        {f"s1-{n}.wav": wav(n) for n in range(4)},
    )
    with pytest.raises(UnbalancedLedger, match="s1"):
        update_language_shard_index(data_root, "en")
    assert part_stats(data_root, "en") == before  # s2's part not written either


def test_a_single_file_index_is_converted_and_its_tars_honoured_until_then(data_root):
    segmented_shard(data_root, "s1", 0)
    segmented_shard(data_root, "s2", 1, languages=("fr", "fr", "fr"))
    data_root.write_parquet(layout.language_shard_index("en"), build_language_shard_index(data_root, "en"))
    [tar] = read_language_shard_index(data_root, "en")["tar_path"].to_pylist()
    assert tar in published_tar_paths(data_root, "s1")
    update = update_language_shard_index(data_root, "en")
    assert not data_root.exists(layout.language_shard_index("en"))
    assert update.parts_written == ["s1"] and update.shards == 1  # s2 holds no English: no part
    assert published_tar_paths(data_root, "s1") == {tar}
    assert published_tar_paths(data_root, "s2") == set()  # fr was never indexed
    assert remove_unreferenced_packed_tars(data_root, ["s1", "s2"]) == 0


def test_a_shard_that_loses_the_language_loses_its_part(data_root):
    segmented_shard(data_root, "s1", 0)
    segmented_shard(data_root, "s2", 1)
    update_language_shard_index(data_root, "fr")
    segmented_shard(data_root, "s2", 5, languages=("en", "en", "en"))  # re-landed without French
    update = update_language_shard_index(data_root, "fr")
    assert update.shards_checked == ["s2"] and update.parts_removed == ["s2"]
    assert read_language_shard_index(data_root, "fr")["shard"].to_pylist() == ["s1"]
    assert read_language_shard_index(data_root, "fr") == build_language_shard_index(data_root, "fr")


def test_a_shards_published_tars_are_found_without_listing_every_shards_part(data_root, monkeypatch):
    segmented_shard(data_root, "s1", 0)
    segmented_shard(data_root, "s2", 1)
    segmented_shard(data_root, "s3", 2, languages=("fr", "fr", "fr"))
    update_language_shard_index(data_root, "en")
    update_language_shard_index(data_root, "fr")
    every = published_tar_paths(data_root)
    patterns = []
    glob = data_root.glob
    monkeypatch.setattr(data_root, "glob", lambda pattern: patterns.append(pattern) or glob(pattern))

    by_shard = {shard: published_tar_paths(data_root, shard) for shard in ("s1", "s2", "s3")}

    own = {shard: {tar for tar in every if tar.startswith(f"shards/{shard}/")} for shard in by_shard}
    assert all(len(tars) == 1 for tars in own.values()) and set().union(*own.values()) == every
    assert by_shard == own
    # One listing of the language folders per shard: the cost per new shard stays flat in the corpus.
    assert set(patterns) == {f"{layout.LANGUAGE_INDEX}/language=*"}
