"""The near_duplicates stage and asset on landed shards: the exact hash through ingest, the
incremental order (the copy indexed first is kept), idempotent re-runs, the corpus index's lock,
a run killed mid-commit, and the asset with the tiny resources."""

import io
import json
import multiprocessing
import threading
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from assets import SHARD_ASSETS
from assets.ingest import normalized_audio, raw_shards
from assets.near_duplicates import near_duplicates
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.quality import near_dup_index_order
from speechdata.quality.near_dup_index import CorpusIndexBusy, corpus_index_lock, read_order
from speechdata.quality.near_dup_index_entries import ENTRIES_VERSION_CHARS, note_entries_written
from speechdata.quality.near_dup_planted import SAMPLE_RATE, Speaker, speech_like, transformed
from speechdata.quality.near_duplicates import NEAR_DUPLICATES_SCHEMA, run_near_duplicates
from speechdata.testing.shards import build_sample_shard
from tests.conftest import land_shard
from tests.materialize import materialize_shard


def voice(number: int, seconds: float = 4.0) -> np.ndarray:
    return speech_like(np.random.default_rng(100 + number), Speaker(100.0 + 13 * number, 0.9 + 0.02 * number), seconds)


def encoded(samples: np.ndarray, container: str = "WAV", subtype: str = "PCM_16", **tags) -> bytes:
    buffer = io.BytesIO()
    with sf.SoundFile(
        buffer, "w", SAMPLE_RATE, 1, format=container, subtype=subtype
    ) as handle:  # tags: what a re-wrap changes besides the container
        for name, value in tags.items():
            setattr(handle, name, value)
        handle.write(samples)
    return buffer.getvalue()


def land_and_normalize(data_root: DataRoot, shard_id: str, utterances: dict[str, tuple[bytes, str, str]]) -> None:
    """``utterances``: ``{utt_id: (file bytes, extension, text)}``, landed then taken through ingest."""
    rows, files = [], {}
    for utt_id, (data, extension, text) in utterances.items():
        files[f"{utt_id}.{extension}"] = data
        rows.append({"utt_id": utt_id, "audio_path": f"{utt_id}.{extension}", "text": text, "language": "en"})
    land_shard(data_root, shard_id, rows, files)
    run_raw_shards(data_root, shard_id)
    run_normalized_audio(data_root, shard_id, workers=1)


def rows_of(data_root: DataRoot, shard_id: str) -> list[dict]:
    return data_root.read_parquet(layout.near_duplicates(shard_id)).to_pylist()


def test_a_rewrapped_file_is_an_exact_duplicate_through_ingest(data_root):
    pcm = np.rint(voice(0) * 32767).astype(np.int16)
    land_and_normalize(
        data_root,
        "rewrap",
        {
            "u1-wav": (encoded(pcm), "wav", "the first words said here"),
            "u2-flac": (encoded(pcm, "FLAC", title="re-wrapped", artist="uploader"), "flac", "other text entirely now"),
            "u3-other": (encoded(voice(1)), "wav", "nothing like the others at all"),
        },
    )
    summary = run_near_duplicates(data_root, "rewrap")
    assert rows_of(data_root, "rewrap") == [
        {
            "utt_id": "u2-flac",
            "representative_shard": "rewrap",
            "representative_utt": "u1-wav",
            "kind": "exact_audio",
            "similarity": 1.0,
        }
    ]
    assert summary.by_kind == {
        "exact_audio": 1,
        "near_audio": 0,
        "contained_audio": 0,
        "shifted_audio": 0,
        "near_transcript": 0,
        "contains_earlier": 0,
        "other_speaker_reading": 0,
    }


@pytest.fixture
def two_shards(data_root):
    return land_two_shards(data_root)


def land_two_shards(data_root):
    """Shard ``a`` lands first; ``b`` carries an MP3 of one of a's utterances, a trimmed copy of
    another of its own, a transcript of a's under new audio, and one utterance of its own."""
    originals = [voice(n) for n in range(4)]
    rng = np.random.default_rng(9)
    land_and_normalize(
        data_root,
        "a",
        {
            "a-0": (encoded(originals[0]), "wav", "a sentence that only shard a has said"),
            "a-1": (encoded(originals[1]), "flac", "the second thing shard a recorded today"),
        },
    )
    land_and_normalize(
        data_root,
        "b",
        {
            "b-0-mp3": (encoded(transformed(rng, originals[0], "gain"), "MP3", "MPEG_LAYER_III"), "mp3", "mp3 words"),
            "b-1-own": (encoded(originals[2]), "wav", "shard b says something new here"),
            "b-2-trimmed": (encoded(transformed(rng, originals[2], "trimmed")), "wav", "a trimmed copy of b"),
            "b-3-same-words": (encoded(originals[3]), "wav", "The second thing Shard A recorded, today!"),
        },
    )
    return data_root


def test_the_later_shards_copy_is_rejected_and_the_earlier_kept(two_shards):
    root = two_shards
    run_near_duplicates(root, "a")
    run_near_duplicates(root, "b")
    assert rows_of(root, "a") == []
    verdicts = {
        row["utt_id"]: (row["kind"], row["representative_shard"], row["representative_utt"])
        for row in rows_of(root, "b")
    }
    assert verdicts == {
        "b-0-mp3": ("near_audio", "a", "a-0"),
        "b-2-trimmed": ("near_audio", "b", "b-1-own"),
        "b-3-same-words": ("near_transcript", "a", "a-1"),
    }
    assert [(s.position, s.shard_id) for s in read_order(root)] == [(0, "a"), (1, "b")]


def test_rerunning_a_shard_changes_nothing_and_its_entries_never_match_themselves(two_shards):
    root = two_shards
    run_near_duplicates(root, "a")
    run_near_duplicates(root, "b")
    before = written_bytes(root)
    again_a = run_near_duplicates(root, "a")
    again_b = run_near_duplicates(root, "b")
    after = written_bytes(root)
    # the order's records (a reservation and a commit per shard; no snapshot before 64 records); per
    # shard its entries, its postings segment and the segment's key filter, its commit record and its file
    assert len(before) == 14
    assert after == before
    assert (again_a.index_position, again_a.indexed_before, again_a.duplicates) == (0, 0, [])
    assert (again_b.index_position, again_b.indexed_before, len(again_b.duplicates)) == (1, 2, 3)


def test_a_shard_reads_only_what_its_keys_touch_and_sees_a_reindexed_shard(two_shards):
    root = two_shards
    run_near_duplicates(root, "a")
    first = run_near_duplicates(root, "b")
    # b fetched the entries of the utterances its keys named (both of a's), no more.
    assert first.entries_read == 2 and first.postings_read > 0
    assert {row["utt_id"] for row in rows_of(root, "b")} == {"b-0-mp3", "b-2-trimmed", "b-3-same-words"}
    # a re-landed with other audio and other words: its entries and segment are a new version, which b then reads.
    land_and_normalize(
        root,
        "a",
        {
            "a-0": (encoded(voice(20)), "wav", "nothing shard b ever copied from"),
            "a-1": (encoded(voice(21)), "flac", "words no other shard has spoken"),
        },
    )
    run_near_duplicates(root, "a")
    [entries] = root.glob(f"{layout.near_duplicates_index_entries_dir()}/a-*.parquet")  # the replaced one removed
    assert entries.endswith(f"a-{read_order(root)[0].entries_version}.parquet")
    again = run_near_duplicates(root, "b")
    assert {row["utt_id"] for row in rows_of(root, "b")} == {"b-2-trimmed"}
    assert again.index_position == 1 and again.indexed_before == 2


def written_bytes(root: DataRoot) -> dict[str, bytes]:
    """Every file of the corpus index and every shard's near_duplicates.parquet, by path."""
    paths = root.fs.find(root.path(layout.NEAR_DUPLICATES_INDEX)) + root.glob("shards/*/near_duplicates.parquet")
    return {path: Path(path).read_bytes() for path in paths}


def _index_in_another_process(url: str, shard_id: str, start, results) -> None:
    start.wait()
    summary = run_near_duplicates(DataRoot(url), shard_id)
    results[shard_id] = (summary.index_position, [d.representative_shard for d in summary.duplicates])


def test_two_shards_indexed_at_once_never_both_keep_a_copy(data_root):
    same = voice(7)
    for shard_id in ("left", "right"):
        land_and_normalize(data_root, shard_id, {f"{shard_id}-copy": (encoded(same), "wav", f"{shard_id} words")})
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        start, results = manager.Event(), manager.dict()
        workers = [
            context.Process(target=_index_in_another_process, args=(data_root.url, shard_id, start, results))
            for shard_id in ("left", "right")
        ]
        for worker in workers:
            worker.start()
        start.set()
        for worker in workers:
            worker.join(120)
        outcome = dict(results)
    assert [worker.exitcode for worker in workers] == [0, 0]
    first, second = sorted(outcome, key=lambda shard: outcome[shard][0])
    assert outcome[first] == (0, []) and outcome[second] == (1, [first])
    assert rows_of(data_root, first) == [] and len(rows_of(data_root, second)) == 1
    assert sorted(s.shard_id for s in read_order(data_root)) == ["left", "right"]


def test_a_shard_waits_for_the_index_lock_and_gives_up_naming_the_holder(data_root):
    land_and_normalize(data_root, "waits", {"w-0": (encoded(voice(3)), "wav", "some words to index")})
    with corpus_index_lock(data_root) as holder:
        with pytest.raises(CorpusIndexBusy, match=f"pid {holder.pid}"):
            run_near_duplicates(data_root, "waits", lock_timeout_s=0.5)
        waiting = threading.Thread(target=run_near_duplicates, args=(data_root, "waits"), kwargs={"lock_timeout_s": 60})
        waiting.start()
        time.sleep(1.0)
        assert waiting.is_alive() and not data_root.exists(layout.near_duplicates("waits"))
    waiting.join(60)
    assert not waiting.is_alive() and data_root.exists(layout.near_duplicates("waits"))


def test_a_run_killed_between_its_entries_and_the_order_reruns_clean(two_shards, monkeypatch):
    root = two_shards
    run_near_duplicates(root, "a")
    write_bytes = root.write_bytes

    def killed_at_the_order(relative, content):
        committing_b = relative.startswith(near_dup_index_order.ORDER_LOG) and any(
            row["shard_id"] == "b" and row["state"] == "committed" for row in json.loads(content)["upsert"]
        )
        if committing_b:
            raise KeyboardInterrupt("killed")
        return write_bytes(relative, content)

    monkeypatch.setattr(root, "write_bytes", killed_at_the_order)
    with pytest.raises(KeyboardInterrupt):
        run_near_duplicates(root, "b")
    monkeypatch.undo()
    assert [s.shard_id for s in read_order(root)] == ["a"]
    assert not root.exists(layout.near_duplicates("b"))
    assert len(root.glob(f"{layout.near_duplicates_index_entries_dir()}/b-*.parquet")) == 1
    run_near_duplicates(root, "b")
    assert [s.shard_id for s in read_order(root)] == ["a", "b"]
    [entries] = root.glob(f"{layout.near_duplicates_index_entries_dir()}/b-*.parquet")
    assert entries.endswith(f"b-{read_order(root)[1].entries_version}.parquet")
    assert len(rows_of(root, "b")) == 3


def test_a_commit_removes_the_entries_files_its_shard_wrote_without_listing_the_entries_folder(two_shards, monkeypatch):
    root = two_shards
    run_near_duplicates(root, "a")
    abandoned = "0" * ENTRIES_VERSION_CHARS  # a killed run's file: noted before it was written
    note_entries_written(root, "b", abandoned)
    root.write_bytes(layout.near_duplicates_index_entries("b", abandoned), b"a killed run's entries")
    folder = root.path(layout.near_duplicates_index_entries_dir()).rstrip("/")
    ls, listed = root.fs.ls, []
    monkeypatch.setattr(root.fs, "ls", lambda path, *args, **kwargs: listed.append(path) or ls(path, *args, **kwargs))
    run_near_duplicates(root, "b")
    monkeypatch.undo()
    assert folder not in {path.rstrip("/") for path in listed}
    [entries] = root.glob(f"{layout.near_duplicates_index_entries_dir()}/b-*.parquet")
    assert entries.endswith(f"b-{read_order(root)[1].entries_version}.parquet")
    assert not root.exists(layout.near_duplicates_index_entries_written("b"))


def test_the_asset_materializes_with_the_tiny_resources_and_joins_the_per_shard_job(data_root):
    assert near_duplicates in SHARD_ASSETS
    build_sample_shard(data_root, "sample", 6, seed=2)
    with dg.instance_for_test() as instance:
        result = materialize_shard(instance, data_root, "sample", [raw_shards, normalized_audio, near_duplicates])
    [event] = result.asset_materializations_for_node("near_duplicates")
    metadata = event.metadata
    table = pq.read_table(data_root.path(layout.near_duplicates("sample")))
    assert table.schema.equals(NEAR_DUPLICATES_SCHEMA, check_metadata=True)
    assert metadata["dagster/row_count"].value == table.num_rows
    assert sum(metadata[f"duplicates_{kind}"].value for kind in ("exact_audio", "near_audio", "near_transcript")) == (
        table.num_rows
    )
    assert metadata["index_position"].value == 0
    assert "pairs_sample" in metadata and metadata["utterances_checked"].value >= 6
