"""The language-ID tar layout (mixed-language mp3 tars, lid_index.pkl, cached VAD pickles) -> landing shards."""

import io
import pickle
import tarfile

import numpy as np
import pytest
import soundfile as sf

from speechdata.importers.language_tars import (
    import_language_tars,
    load_language_index,
    lookup_names,
    pickled_vad_cache,
    tar_number_of,
)
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.raw_shard import validate_landed_shard


def mp3(seconds: float, seed: int) -> bytes:
    buffer = io.BytesIO()
    samples = (np.random.default_rng(seed).standard_normal(int(seconds * 16_000)) * 0.1).astype(np.float32)
    sf.write(buffer, samples, 16_000, format="MP3")
    return buffer.getvalue()


def write_source_tar(path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture
def source(tmp_path):
    """Two source tars in the language-ID layout; the index misses one file and has a bad code for another."""
    (tmp_path / "tars").mkdir()
    write_source_tar(
        tmp_path / "tars" / "000007.tar",
        {
            "clips/a1.mp3": mp3(1.0, 1),
            "clips/b2.mp3": mp3(1.0, 2),
            "clips/c.3.mp3": mp3(1.0, 3),
            "clips/readme.txt": b"not audio",
        },
    )
    write_source_tar(tmp_path / "tars" / "000012.tar", {"x.mp3": mp3(1.0, 4), "y.mp3": mp3(1.0, 5)})
    index = {(7, "clips/a1"): "es", (7, "clips/b2"): "AR", (7, "c.3.mp3"): "French", (12, "x"): "fr"}
    (tmp_path / "lid_index.pkl").write_bytes(pickle.dumps(index))
    (tmp_path / "vad").mkdir()
    (tmp_path / "vad" / "7.pkl").write_bytes(
        pickle.dumps({"clips/a1": {"segments": [(0.5, 0.9), (0.1, 0.4)]}, "clips/b2": {"segments": []}})
    )
    return tmp_path


def test_tars_land_as_contract_shards_with_languages_and_cached_segments(source, tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    tars = [str(source / "tars" / "000012.tar"), str(source / "tars" / "000007.tar")]
    cache = pickled_vad_cache(lambda n: str(source / "vad" / f"{n}.pkl"))
    shards = import_language_tars(root, tars, load_language_index(str(source / "lid_index.pkl")), vad_cache=cache)

    assert [s.shard_id for s in shards] == ["lid-000007", "lid-000012"]
    first, second = shards
    assert (first.files, first.unknown_language, first.skipped_members, first.vad_files) == (3, 1, 1, 2)
    assert (second.files, second.unknown_language, second.vad_files) == (2, 1, 0)

    for shard in shards:
        assert root.exists(layout.landing_success_marker(shard.shard_id))
        validation = validate_landed_shard(root, shard.shard_id)  # the real landing contract
        assert not validation.rejects and validation.index.num_rows == shard.files
    metadata = root.read_parquet(layout.landing_metadata("lid-000007")).to_pylist()
    by_member = {row["source_member"]: row for row in metadata}
    assert by_member["clips/a1.mp3"]["language"] == "es"
    assert by_member["clips/b2.mp3"]["language"] == "ar"  # lower-cased
    assert by_member["clips/c.3.mp3"]["language"] is None  # "French" is no ISO 639-1 code: kept, counted
    assert by_member["clips/c.3.mp3"]["source_language"] == "French"
    assert all("." not in row["utt_id"] for row in metadata)
    with tarfile.open(root.path(layout.landing_audio_tar("lid-000007"))) as tar:
        assert sorted(tar.getnames()) == sorted(row["audio_path"] for row in metadata)
        assert {m.mtime for m in tar.getmembers()} == {0}

    segments = {r["audio_path"]: r for r in root.read_parquet(layout.landing_vad_segments("lid-000007")).to_pylist()}
    a1 = by_member["clips/a1.mp3"]["audio_path"]
    assert segments[a1]["start_s"] == [0.1, 0.5] and segments[a1]["end_s"] == [0.4, 0.9]  # sorted
    assert segments[by_member["clips/b2.mp3"]["audio_path"]]["start_s"] == []
    assert not root.exists(layout.landing_vad_segments("lid-000012"))


def test_reimport_replaces_the_shard(source, tmp_path):
    root = DataRoot(str(tmp_path / "data"))
    index = load_language_index(str(source / "lid_index.pkl"))
    tar = [str(source / "tars" / "000007.tar")]
    import_language_tars(root, tar, index)
    before = root.fs.cat(root.path(layout.landing_audio_tar("lid-000007")))
    import_language_tars(root, tar, index)
    assert root.fs.cat(root.path(layout.landing_audio_tar("lid-000007"))) == before  # deterministic


def test_names_and_numbers():
    assert tar_number_of("s3://b/shards/part-000123.tar") == 123
    with pytest.raises(ValueError):
        tar_number_of("shards/latest.tar")
    assert lookup_names("dir/a.b.mp3") == ["dir/a", "dir/a.b.mp3", "a.b.mp3", "a"]


def test_language_index_from_a_table(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"tar_number": [1], "filename": ["k"], "language": ["de"]}), tmp_path / "i.parquet")
    assert load_language_index(str(tmp_path / "i.parquet")) == {(1, "k"): "de"}
