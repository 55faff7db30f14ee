"""A shard ingested with flac16 storage and the same shard with pcm16 storage yield the same products.

Both 16-bit codecs store the same integers and decode to the same floats (``v / 32768``), so every
product downstream of the audio container (alignments, grids, features, tars, manifests, ASR, VAD,
translation segments) must be byte-identical; only ``audio_24k.parquet`` itself differs.
"""

import hashlib
import shutil

import dagster as dg
import numpy as np
import pytest

from assets import SHARD_ASSETS
from speechdata.audio.codec import decode_pcm16
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.testing.shards import build_sample_shard
from tests.index_journal import is_order_record, read_state
from tests.materialize import materialize_shard
from tests.tiny_resources import tiny_resources_for

SHARD = "c1"


def materialized_root(base, codec: str, model_cache_dir: str) -> DataRoot:
    data_root = DataRoot(str(base / codec))
    # One landing for both: the Opus encoder that builds sample shards is not deterministic.
    shutil.copytree(base / "landed" / "landing", base / codec / "landing")
    resources = tiny_resources_for(data_root.url, model_cache_dir)
    run_config = {"ops": {"normalized_audio": {"config": {"codec": codec}}}}
    with dg.instance_for_test() as instance:
        result = materialize_shard(instance, data_root, SHARD, SHARD_ASSETS, resources=resources, run_config=run_config)
        assert result.success
    return data_root


def file_digests(data_root: DataRoot) -> dict[str, str]:
    root = data_root.root.rstrip("/") + "/"
    return {
        path[len(root) :]: hashlib.sha256(data_root.fs.cat_file(path)).hexdigest()
        for path in sorted(data_root.fs.find(data_root.root))
        if not is_order_record(path)
    }


@pytest.fixture(scope="module")
def roots(tmp_path_factory, model_cache_dir):
    base = tmp_path_factory.mktemp("codecs")
    # Two utterances and the fault rows: the codec is chosen per stored utterance, so more utterances
    # or a long recording (its segments are stored as utterances too) repeat the same comparison.
    build_sample_shard(DataRoot(str(base / "landed")), SHARD, 2, seed=7, long_recordings=0, with_faults=True)
    return {codec: materialized_root(base, codec, model_cache_dir) for codec in ("flac16", "pcm16")}


def test_the_containers_differ_only_in_encoding_and_hold_loud_samples(roots):
    tables = {codec: root.read_parquet(layout.normalized_audio(SHARD)) for codec, root in roots.items()}
    assert tables["flac16"]["utt_id"].to_pylist() == tables["pcm16"]["utt_id"].to_pylist()
    for codec, table in tables.items():
        assert set(table["codec"].to_pylist()) == {codec}
    loud = 0
    for flac, pcm in zip(tables["flac16"]["audio"].to_pylist(), tables["pcm16"]["audio"].to_pylist(), strict=True):
        ints = decode_pcm16(pcm, "pcm16")
        assert np.array_equal(decode_pcm16(flac, "flac16"), ints)
        loud += int((np.abs(ints.astype(np.int32)) > 16384).sum())
    assert loud  # samples where a 32767 / 32768 mismatch would change the rounding


def test_every_product_but_the_container_is_byte_identical(roots):
    digests = {codec: file_digests(root) for codec, root in roots.items()}
    container = layout.normalized_audio(SHARD)
    assert container in digests["flac16"] and container in digests["pcm16"]
    assert digests["flac16"][container] != digests["pcm16"][container]
    # The two roots are different folders: every reject (a missing file among them) names files
    # relative to its root, so even the rejects written before any audio is stored are identical.
    assert layout.rejects(SHARD, "raw_shards") in digests["flac16"]
    flac = {path: digest for path, digest in digests["flac16"].items() if path != container}
    pcm = {path: digest for path, digest in digests["pcm16"].items() if path != container}
    assert sorted(flac) == sorted(pcm)
    assert any(path.endswith(".tar") for path in flac) and any("wavlm" in path for path in flac)
    assert {path for path in flac if flac[path] != pcm[path]} == set()
    assert read_state(roots["flac16"]) == read_state(roots["pcm16"])
