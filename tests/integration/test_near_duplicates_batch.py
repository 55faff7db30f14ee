"""The whole-corpus near-duplicate pass in one process, as the UI and the shell launch it: the
Dagster job records each shard's materialization and writes what the incremental stage writes; the
command decides a selection, shards landing afterwards continue from its index, a re-run of one shard
after a threshold change keeps the others' decisions, a shard landing during a pass is ordered after
it and waits for it, and a pass that fails gives its positions back."""

import threading
import time

import dagster as dg
import numpy as np
import pytest

from assets.near_duplicates import BATCH_JOB_NAME, near_duplicates_batch_job
from assets.partitions import shard_partitions
from resources.storage import DataRootResource
from speechdata.cli import run
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality import near_dup_index_order
from speechdata.quality.near_dup_batch import run_near_duplicates_batch
from speechdata.quality.near_dup_index import RESERVED, read_state
from speechdata.quality.near_dup_matching import NearDuplicateThresholds
from speechdata.quality.near_duplicates import run_near_duplicates
from tests.integration.test_near_duplicates_assets import encoded, land_and_normalize, voice, written_bytes

SHARDS = ["b0", "b1"]


@pytest.fixture
def corpus(data_root) -> DataRoot:
    """b1 re-encodes b0's first recording and says b0's second transcript over new audio."""
    originals = [voice(n, seconds=2.5) for n in range(4)]
    originals[0] = pcm16(originals[0])
    land_and_normalize(
        data_root,
        "b0",
        {
            "b0-a": (encoded(originals[0]), "wav", "the words of the first recording"),
            "b0-b": (encoded(originals[1]), "wav", "a second recording says this"),
        },
    )
    land_and_normalize(
        data_root,
        "b1",
        {
            "b1-a": (encoded(originals[0], "FLAC"), "flac", "nothing like the first one"),
            "b1-b": (encoded(originals[2]), "wav", "A second recording says this!"),
        },
    )
    return data_root


def pcm16(samples: np.ndarray) -> np.ndarray:
    return np.rint(samples * 32767).astype(np.int16)


def forget(root: DataRoot) -> None:
    root.fs.rm(root.path(layout.NEAR_DUPLICATES_INDEX), recursive=True)
    for shard_id in root.glob("shards/*/near_duplicates.parquet"):
        root.fs.rm(shard_id)


def without_order_records(files: dict[str, bytes]) -> dict[str, bytes]:
    return {path: content for path, content in files.items() if f"/{near_dup_index_order.ORDER_LOG}/" not in path}


def rows(root: DataRoot, shard_id: str) -> list[tuple[str, str, str]]:
    table = root.read_parquet(layout.near_duplicates(shard_id)).to_pylist()
    return [(r["utt_id"], r["kind"], r["representative_utt"]) for r in table]


@pytest.mark.slow  # a Dagster instance and an in-process run: about 15 s on the shared build machine
def test_the_batch_job_records_each_shards_materialization_and_writes_what_the_asset_writes(corpus):
    key_loads = {shard_id: run_near_duplicates(corpus, shard_id).audio_key_load for shard_id in SHARDS}
    incremental, incremental_order = without_order_records(written_bytes(corpus)), read_state(corpus)
    forget(corpus)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(shard_partitions.name, SHARDS)
        result = near_duplicates_batch_job.execute_in_process(
            run_config={"ops": {"near_duplicates_batch": {"config": {"ray_address": "in-process", "partitions": 2}}}},
            instance=instance,
            resources={"data_root": DataRootResource(url=corpus.url)},
        )
        assert result.success and result.dagster_run.job_name == BATCH_JOB_NAME
        events = result.get_asset_materialization_events()
        logs = [record.user_message for record in instance.all_logs(result.run_id)]
    # The same order, and byte for byte every other file; the order's records (how it got there: one
    # shard after the other, or a pass's reservations then commits) differ.
    assert without_order_records(written_bytes(corpus)) == incremental and read_state(corpus) == incremental_order
    assert rows(corpus, "b1") == [("b1-a", "exact_audio", "b0-a"), ("b1-b", "near_transcript", "b0-b")]
    recorded = {e.materialization.partition: e.materialization.metadata for e in events}
    assert set(recorded) == set(SHARDS) and all(e.asset_key.path == ["near_duplicates"] for e in events)
    assert recorded["b1"]["duplicates_exact_audio"].value == 1 and recorded["b1"]["index_position"].value == 1
    # What the per-key cap kept out of each shard's audio vote, as the shard-by-shard stage counted it
    for shard_id, load in key_loads.items():
        assert recorded[shard_id]["audio_keys_looked_up"].value == load.keys > 0
        assert recorded[shard_id]["audio_keys_past_cap"].value == load.keys_past_cap
    assert any("signals 2/2" in line for line in logs) and any("2 shards decided" in line for line in logs)


def test_the_command_decides_a_selection_and_later_shards_continue_from_its_index(corpus, capsys):
    assert run(["near-duplicates", "batch", "--in-process", "--data-root", corpus.url, "--partitions", "3"]) == 0
    printed = capsys.readouterr()
    assert "2 shards decided (index positions 0-1)" in printed.out
    # Two small shards: no audio key is near the cap, so no warning
    assert "0.0% of the audio keys past the cap" in printed.out and "warning" not in printed.err
    assert rows(corpus, "b1") == [("b1-a", "exact_audio", "b0-a"), ("b1-b", "near_transcript", "b0-b")]

    # A shard landing afterwards, through the incremental stage: the next position, against the pass's index.
    land_and_normalize(corpus, "b2", {"b2-a": (encoded(pcm16(voice(0, seconds=2.5)), "FLAC"), "flac", "b2 words here")})
    assert run_near_duplicates(corpus, "b2").index_position == 2
    assert rows(corpus, "b2") == [("b2-a", "exact_audio", "b0-a")]

    # One shard again after a threshold change: b0 and b2 keep their decisions; b1 decides as the stage would.
    before = written_bytes(corpus)
    args = ["near-duplicates", "batch", "b1", "--audio-only", "--signals-from", "index", "--in-process"]
    assert run([*args, "--data-root", corpus.url, "--quiet"]) == 0
    batch = written_bytes(corpus)
    assert rows(corpus, "b1") == [("b1-a", "exact_audio", "b0-a")]
    changed = {path for path in batch if batch[path] != before.get(path)} | set(before) ^ set(batch)
    assert not any("/b0" in path or "/b2" in path for path in changed)
    run_near_duplicates(corpus, "b1", NearDuplicateThresholds(check_transcripts=False))
    assert written_bytes(corpus) == batch


def test_a_pass_that_fails_writes_nothing_and_gives_its_positions_back(corpus, capsys):
    run_near_duplicates(corpus, "b0")
    before = written_bytes(corpus)
    # "gone" has no normalized audio: the pass fails before it commits anything.
    assert run(["near-duplicates", "batch", "b1", "gone", "--in-process", "--data-root", corpus.url]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "'gone' has no normalized audio" in line and "--select raw_shards,normalized_audio" in line, line
    assert written_bytes(corpus) == before
    assert not [s for s in read_state(corpus) if s.state == RESERVED]
    assert run_near_duplicates(corpus, "b1").index_position == 1


def test_no_selected_shard_is_one_error_line(data_root, capsys):
    data_root.fs.makedirs(data_root.root, exist_ok=True)
    assert run(["near-duplicates", "batch", "--in-process", "--data-root", data_root.url]) == 1
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "no shards selected" in line


def test_a_shard_landing_during_the_pass_is_ordered_after_it_and_waits_for_its_commits(corpus):
    land_and_normalize(corpus, "b2", {"b2-a": (encoded(pcm16(voice(0, seconds=2.5)), "FLAC"), "flac", "b2 words")})
    landing: dict = {}
    decided = threading.Event()

    def land_b2_meanwhile(stage: str, done: int, total: int) -> None:
        # Once the pass holds its positions and has decided, b2 lands through the stage: it must wait.
        if stage == "decide" and done == total and "thread" not in landing:
            landing["thread"] = threading.Thread(
                target=lambda: landing.update(summary=run_near_duplicates(corpus, "b2"))
            )
            landing["thread"].start()
            time.sleep(1.5)
            landing["waited"] = landing["thread"].is_alive() and not corpus.exists(layout.near_duplicates("b2"))
            decided.set()

    summary = run_near_duplicates_batch(corpus, SHARDS, on_progress=land_b2_meanwhile, partitions=2)
    landing["thread"].join(60)
    assert decided.is_set() and landing["waited"]
    assert [s.index_position for s in summary.shards] == [0, 1]
    assert landing["summary"].index_position == 2
    assert rows(corpus, "b2") == [("b2-a", "exact_audio", "b0-a")]
