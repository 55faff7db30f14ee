"""A new shard costs the country's dataset what that shard holds: the first shard's published files
stay byte for byte (and untouched on disk), no segment changes split, only the new shard is read,
ledgers are checked and indexes written for the new shard alone, the card needs no dataset file,
a killed build leaves nothing behind the next one does not clean, and every split still loads with
the real `datasets` reader."""

import os
import re
from pathlib import Path

import datasets
import pytest

from speechdata.accounting.ledgers import shard_ledgers
from speechdata.hf import dataset as hf_dataset_module
from speechdata.hf.card import CARD_FILE
from speechdata.hf.country_build import refresh_country
from speechdata.hf.dataset import DatasetOptions
from speechdata.hf.published_index import published_index
from speechdata.hf.splits import SplitTargets
from speechdata.hf.state import rows_as_dicts, state_connection
from speechdata.importers.aligned_json import import_aligned_countries
from speechdata.io import layout
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.aligned_json import build_aligned_json_corpus

DATASET = "ds"
# Generous evaluation shares so that each small shard puts recordings in test and validation.
TARGETS = SplitTargets(test=0.25, validation=0.25)
OPTIONS = DatasetOptions(dataset=DATASET)


def land(corpus, data_root, first_recording: int, recordings: int = 4) -> list[str]:
    build_aligned_json_corpus(
        corpus, {"de": recordings}, clips=None, audio_format="flac", first_recording=first_recording
    )
    shards = [s for r in import_aligned_countries(str(corpus), data_root) for s in r.shards]
    for shard in shards:
        run_raw_shards(data_root, shard)
    return shards


def state(data_root, sql: str) -> list[dict]:
    with state_connection(data_root, layout.hf_state_database(DATASET, "de")) as db:
        return rows_as_dicts(db, sql)


def published_files(data_root) -> dict[str, tuple[bytes, int]]:
    """Every file of the dataset folder but the card, with its bytes and modification time."""
    base = Path(data_root.path(layout.hf_dataset_dir(DATASET)))
    return {str(p.relative_to(base)): (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(base.rglob("*.parquet"))}


@pytest.fixture
def first_shard(tmp_path, data_root, clips):
    corpus = tmp_path / "countries"
    build_aligned_json_corpus(corpus, {"de": 4}, clips=clips, audio_format="flac")
    shards = [s for r in import_aligned_countries(str(corpus), data_root) for s in r.shards]
    for shard in shards:
        run_raw_shards(data_root, shard)
    first = refresh_country(data_root, "de", OPTIONS, TARGETS)
    return corpus, shards, first


def land_second(corpus, data_root, clips, first_recording: int = 10) -> list[str]:
    build_aligned_json_corpus(corpus, {"de": 4}, clips=clips, audio_format="flac", first_recording=first_recording)
    before = set(os.listdir(data_root.path(layout.SHARDS)))
    for report in import_aligned_countries(str(corpus), data_root):
        for shard in report.shards:
            run_raw_shards(data_root, shard)
    return sorted(set(os.listdir(data_root.path(layout.SHARDS))) - before)


def test_a_second_shard_leaves_the_first_shards_files_untouched_and_no_segment_changes_split(
    first_shard, data_root, clips
):
    corpus, [first], built = first_shard
    assert {f.split for f in built.build.written} >= {"test", "validation", "train_1"}
    files_before = published_files(data_root)
    index_before = Path(data_root.path(published_index(first, "de"))).stat().st_mtime_ns
    splits_before = {(r["shard_id"], r["key"]): r["split"] for r in state(data_root, "SELECT * FROM segments")}
    recordings_before = {r["recording_id"]: r["split"] for r in state(data_root, "SELECT * FROM recordings")}

    [second] = land_second(corpus, data_root, clips)
    again = refresh_country(data_root, "de", OPTIONS, TARGETS)

    # Only the new shard was read, gated and indexed.
    assert again.assignment.shards_read == 1
    assert (again.shards_checked, again.shards_indexed) == (1, 1)
    # Every file published before is there, byte for byte, never rewritten.
    files_after = published_files(data_root)
    assert {path: files_after.get(path) for path in files_before} == files_before
    new_files = set(files_after) - set(files_before)
    assert new_files and {f["shard_id"] for f in state(data_root, "SELECT * FROM files WHERE split IS NOT NULL")} == {
        first,
        second,
    }
    assert {p.split("/")[1].split("-")[0] for p in new_files} >= {"test", "validation"}
    assert Path(data_root.path(published_index(first, "de"))).stat().st_mtime_ns == index_before
    # No segment or recording changed split; the new ones are all in the state.
    splits_after = {(r["shard_id"], r["key"]): r["split"] for r in state(data_root, "SELECT * FROM segments")}
    assert {k: splits_after[k] for k in splits_before} == splits_before
    assert {r["recording_id"]: r["split"] for r in state(data_root, "SELECT * FROM recordings")}.items() >= (
        recordings_before.items()
    )
    assert {shard for shard, _ in splits_after} == {first, second}
    # Every split loads with the real reader, each row once, and the card counts what the state holds.
    loaded = datasets.load_dataset(data_root.path(layout.hf_dataset_dir(DATASET)), "de")
    rows_on_disk: dict[str, int] = {}
    for f in state(data_root, "SELECT split, rows FROM files WHERE split IS NOT NULL AND status <> 'deleted'"):
        rows_on_disk[f["split"]] = rows_on_disk.get(f["split"], 0) + f["rows"]
    assert {split: ds.num_rows for split, ds in loaded.items()} == rows_on_disk
    keys = [(r["shard_id"], r["key"]) for split in loaded.values() for r in split.remove_columns("audio")]
    assert len(keys) == len(set(keys)) == sum(rows_on_disk.values())
    card = Path(data_root.path(layout.hf_dataset_file(DATASET, CARD_FILE))).read_text()
    assert f"num_examples: {rows_on_disk['test']}" in card
    for shard in (first, second):
        assert shard_ledgers(data_root, shard)["hf"].balanced, shard


def test_a_rebuild_with_nothing_new_reads_no_shard_and_writes_nothing(first_shard, data_root):
    files_before = published_files(data_root)
    card = Path(data_root.path(layout.hf_dataset_file(DATASET, CARD_FILE))).read_bytes()
    again = refresh_country(data_root, "de", OPTIONS, TARGETS)
    assert again.assignment.shards_read == 0 and again.build.written == []
    assert (again.shards_checked, again.shards_indexed) == (0, 0)
    assert published_files(data_root) == files_before
    assert Path(data_root.path(layout.hf_dataset_file(DATASET, CARD_FILE))).read_bytes() == card


def test_a_build_killed_between_writing_a_part_and_recording_it_is_cleaned_by_the_next(
    first_shard, data_root, clips, monkeypatch, tmp_path
):
    corpus, _, _ = first_shard
    land_second(corpus, data_root, clips)
    real_commit = hf_dataset_module.commit_part

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("worker killed after the part's files were moved into place")

    monkeypatch.setattr(hf_dataset_module, "commit_part", killed)
    with pytest.raises(KeyboardInterrupt):
        refresh_country(data_root, "de", OPTIONS, TARGETS)
    assert state(data_root, "SELECT * FROM part_writes")  # the started part is remembered
    monkeypatch.setattr(hf_dataset_module, "commit_part", real_commit)
    refresh_country(data_root, "de", OPTIONS, TARGETS)
    assert state(data_root, "SELECT * FROM part_writes") == []
    recorded = {f["path_in_repo"] for f in state(data_root, "SELECT * FROM files WHERE split IS NOT NULL")}
    assert {f"de/{p.split('/', 1)[1]}" for p in published_files(data_root)} == recorded

    # The same landing built without the kill gives the same files, byte for byte.
    clean_root = type(data_root)(str(tmp_path / "clean"))
    clean_corpus = tmp_path / "clean-countries"
    build_aligned_json_corpus(clean_corpus, {"de": 4}, clips=clips, audio_format="flac")
    for shard in [s for r in import_aligned_countries(str(clean_corpus), clean_root) for s in r.shards]:
        run_raw_shards(clean_root, shard)
    refresh_country(clean_root, "de", OPTIONS, TARGETS)
    land_second(clean_corpus, clean_root, clips)
    refresh_country(clean_root, "de", OPTIONS, TARGETS)
    assert {p: b for p, (b, _) in published_files(clean_root).items()} == {
        p: b for p, (b, _) in published_files(data_root).items()
    }


def test_train_subsets_fill_to_their_budget_across_builds(tmp_path, data_root, clips):
    corpus = tmp_path / "countries"
    options = DatasetOptions(dataset=DATASET, max_split_size_gb=1.0)
    for batch in range(3):
        build_aligned_json_corpus(corpus, {"de": 2}, clips=clips, audio_format="flac", first_recording=10 * batch)
        for report in import_aligned_countries(str(corpus), data_root):
            for shard in report.shards:
                run_raw_shards(data_root, shard)
        refresh_country(data_root, "de", options, SplitTargets(test=0.0, validation=0.0))
    files = state(data_root, "SELECT split, shard_id FROM files WHERE split IS NOT NULL")
    # Three builds, one train split: each build added its shard's part to train_1.
    assert {f["split"] for f in files} == {"train_1"}
    assert len({f["shard_id"] for f in files}) == 3


def test_a_split_written_before_parts_moves_into_parts_whole_when_one_of_its_rows_must_go(first_shard, data_root):
    # Make the first build look like one from before parts: files named without a part, no shard recorded.
    base = Path(data_root.path(layout.hf_dataset_dir(DATASET)))
    with state_connection(data_root, layout.hf_state_database(DATASET, "de")) as db:
        for path, split in db.execute("SELECT path_in_repo, split FROM files WHERE split IS NOT NULL").fetchall():
            legacy = re.sub(r"-shard-[0-9a-f]{10}", "", path)
            (base / path).rename(base / legacy)
            db.execute("UPDATE files SET path_in_repo = ?, shard_id = NULL WHERE path_in_repo = ?", [legacy, path])
            db.execute("UPDATE segments SET file = ? WHERE file = ?", [legacy, path])
        db.execute("DELETE FROM shards")  # and a state that never recorded stamps
        [(copy, old_file)] = db.execute(
            "SELECT key, file FROM segments WHERE split = 'test' AND file IS NOT NULL ORDER BY key LIMIT 1"
        ).fetchall()
        db.execute("UPDATE segments SET status = 'filtered', reason = 'near_duplicate' WHERE key = ?", [copy])
    untouched = {p: b for p, (b, _) in published_files(data_root).items() if not p.startswith("de/test-")}

    again = refresh_country(data_root, "de", OPTIONS, TARGETS)
    assert again.assignment.shards_read == 1  # read once, to record its stamp
    files = published_files(data_root)
    assert not (base / old_file).exists() and all("-shard-" in p for p in files if p.startswith("de/test-"))
    # The other splits' old files stay as they were; the test split lost exactly the copy.
    assert {p: files[p][0] for p in untouched} == untouched
    loaded = datasets.load_dataset(str(base), "de")
    assert copy not in loaded["test"]["key"]
    rows = {f["split"]: 0 for f in state(data_root, "SELECT split FROM files WHERE split IS NOT NULL")}
    for f in state(data_root, "SELECT split, rows FROM files WHERE split IS NOT NULL AND status <> 'deleted'"):
        rows[f["split"]] += f["rows"]
    assert {split: ds.num_rows for split, ds in loaded.items()} == rows


def test_the_sensors_fingerprints_read_only_new_shards_and_match_what_the_refresh_recorded(
    first_shard, data_root, clips, monkeypatch
):
    from speechdata.hf import segments as hf_segments

    corpus, _, built = first_shard
    reads = []
    real_index = hf_segments.published_shard_index
    monkeypatch.setattr(
        hf_segments, "published_shard_index", lambda root, shard: reads.append(shard) or real_index(root, shard)
    )
    first = hf_segments.country_input_fingerprints(data_root)
    assert first["de"] == built.assignment.input_fingerprint
    reads.clear()
    assert hf_segments.country_input_fingerprints(data_root) == first and reads == []  # nothing changed: no read
    [second] = land_second(corpus, data_root, clips)
    after = hf_segments.country_input_fingerprints(data_root)
    assert reads == [second] and after["de"] != first["de"]
    assert refresh_country(data_root, "de", OPTIONS, TARGETS).assignment.input_fingerprint == after["de"]
