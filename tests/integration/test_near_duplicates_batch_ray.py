"""The whole-corpus near-duplicate pass on a local two-node Ray cluster writes exactly what the
incremental path writes shard by shard in the same order: every near_duplicates.parquet and the
index, byte for byte, for the first import and for a re-run after a threshold change."""

import shutil

import numpy as np
import pytest

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_batch import run_near_duplicates_batch
from speechdata.quality.near_dup_batch_ray import RayEngine, ray_connection
from speechdata.quality.near_dup_index import read_order
from speechdata.quality.near_dup_matching import NearDuplicateThresholds
from speechdata.quality.near_dup_planted import transformed
from speechdata.quality.near_duplicates import run_near_duplicates
from tests.index_journal import read_state, without_order_records
from tests.integration.test_near_duplicates_assets import encoded, land_and_normalize, voice, written_bytes
from tests.ray_cluster import NODES, start_cluster

pytestmark = pytest.mark.slow

SHARDS = ["c0", "c1", "c2", "c3"]


def build_corpus(root: DataRoot) -> None:
    """Four shards: c1 re-wraps one of c0's recordings and re-encodes another; c2 trims c1's
    re-encoding (a copy of a copy) and says c0's words over new audio; c3 changes the gain of c1's own."""
    rng = np.random.default_rng(4)
    originals = [voice(n, seconds=3.0) for n in range(6)]
    pcm = np.rint(originals[0] * 32767).astype(np.int16)
    land_and_normalize(
        root,
        "c0",
        {
            "c0-a": (encoded(pcm), "wav", "first words of the corpus here"),
            "c0-b": (encoded(originals[1]), "wav", "another recording of shard zero"),
            "c0-c": (encoded(originals[2]), "flac", "these words come back later on"),
        },
    )
    mp3 = encoded(transformed(rng, originals[1], "gain"), "MP3", "MPEG_LAYER_III")
    land_and_normalize(
        root,
        "c1",
        {
            "c1-a-rewrapped": (encoded(pcm, "FLAC", title="again"), "flac", "unrelated text number one"),
            "c1-b-mp3": (mp3, "mp3", "unrelated text number two"),
            "c1-own": (encoded(originals[3]), "wav", "shard one says its own thing"),
        },
    )
    land_and_normalize(
        root,
        "c2",
        {
            "c2-trimmed": (encoded(transformed(rng, originals[1], "trimmed")), "wav", "unrelated text three"),
            "c2-same-words": (encoded(originals[4]), "wav", "These words come back, later on!"),
        },
    )
    land_and_normalize(
        root,
        "c3",
        {
            "c3-gain": (encoded(transformed(rng, originals[3], "gain")), "wav", "yet more unrelated words"),
            "c3-own": (encoded(originals[5]), "wav", "the last shard's own words"),
        },
    )


def forget_near_duplicates(root: DataRoot) -> None:
    shutil.rmtree(root.path(layout.NEAR_DUPLICATES_INDEX))
    for shard_id in SHARDS:
        root.fs.rm(root.path(layout.near_duplicates(shard_id)))


@pytest.fixture(scope="module")
def ray_cluster():
    cluster = start_cluster({"num_cpus": 1, "object_store_memory": 100 * 1024 * 1024})
    yield cluster
    cluster.shutdown()


def test_the_batch_pass_on_two_ray_nodes_writes_what_the_incremental_path_writes(data_root, ray_cluster):
    build_corpus(data_root)
    for shard_id in SHARDS:
        run_near_duplicates(data_root, shard_id)
    incremental, incremental_order = without_order_records(written_bytes(data_root)), read_state(data_root)
    rows = {s: data_root.read_parquet(layout.near_duplicates(s)).to_pylist() for s in SHARDS}
    assert {row["kind"] for shard in rows.values() for row in shard} == {"exact_audio", "near_audio", "near_transcript"}
    assert [row["representative_utt"] for row in rows["c2"]] == ["c0-c", "c0-b"]  # a copy of a copy

    forget_near_duplicates(data_root)
    progress = []
    audio_only = NearDuplicateThresholds(check_transcripts=False)
    with ray_connection(ray_cluster.address) as described:
        assert described.startswith(f"{NODES} node(s)")
        summary = run_near_duplicates_batch(
            data_root,
            SHARDS,
            engine=RayEngine(),
            partitions=3,
            on_progress=lambda stage, done, total: progress.append((stage, done, total)),
        )
        batch, batch_order = without_order_records(written_bytes(data_root)), read_state(data_root)
        # A threshold change: the indexed shards' stored signals, decided again.
        run_near_duplicates_batch(data_root, SHARDS, audio_only, engine=RayEngine(), signals_from="index")
        batch_audio_only = without_order_records(written_bytes(data_root))

    assert batch == incremental and batch_order == incremental_order
    assert [(s.shard_id, s.index_position) for s in summary.shards] == list(zip(SHARDS, range(4), strict=True))
    assert summary.by_kind == {
        "exact_audio": 1,
        "near_audio": 3,
        "contained_audio": 0,
        "shifted_audio": 0,
        "near_transcript": 1,
    }
    assert ("signals", 4, 4) in progress and ("decide", 3, 3) in progress
    assert [done == total for stage, done, total in progress if stage == "commit"][-1]

    for shard_id in SHARDS:
        run_near_duplicates(data_root, shard_id, audio_only)
    assert without_order_records(written_bytes(data_root)) == batch_audio_only != batch
    assert [s.shard_id for s in read_order(data_root)] == SHARDS
    assert [row["utt_id"] for row in data_root.read_parquet(layout.near_duplicates("c2")).to_pylist()] == ["c2-trimmed"]
