"""A re-segmented shard never leaves a published VAD table or language index pointing at other bytes.

Each test publishes an old version of a shard (tar, ``vad_segments.parquet``, language index),
re-lands it with other audio, other segments and a file withdrawn, and runs ``vad_segments`` again,
failing it at one step. Every published segments row must then describe the bytes its tar holds,
every language index row must name a tar that holds its keys, and every chunk the real loader
(:func:`speechdata.vad.loader.vad_chunk_loader`) yields must lie inside a speech segment of the
audio it was cut from, with exactly its samples. A re-run reaches the clean result.
"""

import hashlib
import io
import tarfile

import numpy as np
import pyarrow as pa
import pytest
import soundfile as sf

import speechdata.vad.stage as stage_module
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_raw_shards
from speechdata.vad.language_index import build_language_shard_index, build_urls
from speechdata.vad.loader import normalize_chunk, read_chunks, vad_chunk_loader
from speechdata.vad.stage import run_vad_segments
from speechdata.vad.tar_retention import remove_unreferenced_packed_tars
from tests.conftest import land_shard

SHARD, RATE, CHUNK_S = "d1", 16_000, 1.0

# Each version: audio_path -> (noise seed, speech segments). The segments of the two versions of
# a.wav do not overlap, so a chunk cut with one version's segments from the other's audio shows.
OLD = {"a.wav": (1, [(0.0, 1.5)]), "b.wav": (2, [(0.5, 2.5)]), "c.wav": (3, [(1.0, 3.0)])}
NEW = {"a.wav": (4, [(2.0, 3.9)]), "b.wav": (2, [(0.5, 2.5)])}  # a changed, b the same, c withdrawn


def wav(seed: int) -> bytes:
    samples = (np.random.default_rng(seed).standard_normal(4 * RATE) * 0.1).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, samples, RATE, format="WAV")
    return buffer.getvalue()


SEGMENTS_OF_BYTES = {
    hashlib.sha1(wav(seed)).hexdigest(): spans for version in (OLD, NEW) for seed, spans in version.values()
}


def land(data_root: DataRoot, version: dict, *, as_tar: bool) -> None:
    rows = [{"utt_id": path.removesuffix(".wav"), "audio_path": path, "language": "en"} for path in version]
    land_shard(data_root, SHARD, rows, {path: wav(seed) for path, (seed, _) in version.items()}, as_tar=as_tar)
    segments = [
        {"audio_path": path, "start_s": [s for s, _ in spans], "end_s": [e for _, e in spans]}
        for path, (_, spans) in version.items()
    ]
    data_root.write_parquet(layout.landing_vad_segments(SHARD), pa.Table.from_pylist(segments))
    run_raw_shards(data_root, SHARD)


def build_language_index(data_root: DataRoot) -> None:
    data_root.write_parquet(layout.language_shard_index("en"), build_language_shard_index(data_root, "en"))
    remove_unreferenced_packed_tars(data_root)


def publish_old_and_land_new(data_root: DataRoot, *, as_tar: bool = False) -> None:
    land(data_root, OLD, as_tar=as_tar)
    run_vad_segments(data_root, SHARD, model=None)
    build_language_index(data_root)
    land(data_root, NEW, as_tar=as_tar)


def tar_members(data_root: DataRoot, tar_path: str) -> dict[str, bytes]:
    with data_root.fs.open(data_root.path(tar_path), "rb") as handle, tarfile.open(fileobj=handle) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def assert_published_tables_read_back(data_root: DataRoot) -> int:
    """Every published row against the bytes it names, then every loader chunk; the chunks read."""
    table = data_root.read_parquet(layout.vad_segments(SHARD)).to_pylist()
    for row in table:
        members = tar_members(data_root, row["tar_path"])
        assert row["audio_path"] in members, f"{row['tar_path']} lacks {row['audio_path']}"
        spans = SEGMENTS_OF_BYTES[hashlib.sha1(members[row["audio_path"]]).hexdigest()]
        assert list(zip(row["start_s"], row["end_s"])) == spans, f"{row['audio_path']}: segments of other audio"
    for row in data_root.read_parquet(layout.language_shard_index("en")).to_pylist():
        assert data_root.exists(row["tar_path"]), f"the language index names {row['tar_path']}, which is gone"
        keys = {name.removesuffix(".wav") for name in tar_members(data_root, row["tar_path"])}
        assert set(row["tar_keys"]) <= keys

    urls = sorted(set(build_urls(["en"], data_root)) | {data_root.uri(row["tar_path"]) for row in table})
    chunks = 0
    for url in urls:  # one loader per tar, so each chunk's tar is known
        members = tar_members(data_root, url.removeprefix(data_root.uri("")))
        for batch in vad_chunk_loader([url], data_root, chunk_s=CHUNK_S, num_chunks=2, batch_size=1):
            for key, start_s, values in zip(batch["keys"], batch["chunk_start_s"], batch["input_values"]):
                data = members[f"{key}.wav"]
                expected = normalize_chunk(read_chunks(data, [start_s], CHUNK_S, RATE)[0])
                assert np.allclose(values.numpy(), expected, atol=1e-5)
                spans = SEGMENTS_OF_BYTES[hashlib.sha1(data).hexdigest()]
                assert any(s <= start_s and start_s + CHUNK_S <= e + 1e-9 for s, e in spans), (
                    f"{url} {key}: a chunk at {start_s} s lies outside the speech of its audio ({spans})"
                )
                chunks += 1
    return chunks


def shard_outputs(data_root: DataRoot) -> dict[str, str]:
    paths = data_root.fs.find(data_root.path(layout.shard_dir(SHARD)))
    return {p[len(data_root.root) + 1 :]: hashlib.sha256(data_root.fs.cat_file(p)).hexdigest() for p in paths}


@pytest.fixture
def clean(tmp_path) -> dict[str, str]:
    data_root = DataRoot(str(tmp_path / "reference"))
    publish_old_and_land_new(data_root)
    run_vad_segments(data_root, SHARD, model=None)
    assert assert_published_tables_read_back(data_root) > 0
    return shard_outputs(data_root)


def test_a_failed_segments_write_leaves_the_published_table_describing_its_tar(tmp_path, monkeypatch, clean):
    data_root = DataRoot(str(tmp_path / "full-disk"))
    publish_old_and_land_new(data_root)
    real_write = DataRoot.write_parquet

    def disk_full_for_segments(self, relative, table, **options):
        if relative == layout.vad_segments(SHARD):
            raise OSError("no space left on device")
        return real_write(self, relative, table, **options)

    monkeypatch.setattr(DataRoot, "write_parquet", disk_full_for_segments)
    with pytest.raises(OSError, match="no space left"):
        run_vad_segments(data_root, SHARD, model=None)
    monkeypatch.undo()
    assert assert_published_tables_read_back(data_root) > 0
    run_vad_segments(data_root, SHARD, model=None)
    assert assert_published_tables_read_back(data_root) > 0
    assert shard_outputs(data_root) == clean


def test_a_commit_failing_at_any_step_publishes_tables_that_read_their_bytes(tmp_path, monkeypatch, clean):
    counted = DataRoot(str(tmp_path / "counted"))
    publish_old_and_land_new(counted)
    points: list[str] = []
    monkeypatch.setattr(stage_module, "fault_point", points.append)
    run_vad_segments(counted, SHARD, model=None)
    monkeypatch.undo()
    assert points == ["vad-tar", "vad-segments"]
    for failing_call, point in enumerate(points):
        data_root = DataRoot(str(tmp_path / f"fails-at-{point}"))
        publish_old_and_land_new(data_root)

        def fail_at_step(name, calls=[], failing_call=failing_call):
            calls.append(name)
            if len(calls) == failing_call + 1:
                raise OSError(f"no space left on device (after {name})")

        monkeypatch.setattr(stage_module, "fault_point", fail_at_step)
        with pytest.raises(OSError, match="no space left"):
            run_vad_segments(data_root, SHARD, model=None)
        monkeypatch.undo()
        assert assert_published_tables_read_back(data_root) > 0

        run_vad_segments(data_root, SHARD, model=None)
        assert assert_published_tables_read_back(data_root) > 0
        assert shard_outputs(data_root) == clean, point


def test_the_old_tar_goes_only_when_no_language_index_names_it(tmp_path):
    data_root = DataRoot(str(tmp_path / "retention"))
    publish_old_and_land_new(data_root)
    [old_tar] = data_root.read_parquet(layout.language_shard_index("en"))["tar_path"].to_pylist()
    run_vad_segments(data_root, SHARD, model=None)
    [new_tar] = set(data_root.read_parquet(layout.vad_segments(SHARD))["tar_path"].to_pylist())
    assert new_tar != old_tar and data_root.exists(old_tar)  # the language index still names it
    build_language_index(data_root)
    assert not data_root.exists(old_tar) and data_root.exists(new_tar)
    assert assert_published_tables_read_back(data_root) > 0


def test_a_relanded_tar_is_never_read_with_the_segments_of_the_audio_it_replaced(tmp_path):
    data_root = DataRoot(str(tmp_path / "relanded"))
    publish_old_and_land_new(data_root, as_tar=True)  # the landed tar itself is replaced, VAD not yet re-run
    urls = build_urls(["en"], data_root)
    assert urls == [data_root.uri(layout.landing_audio_tar(SHARD))]
    skipped: dict[str, int] = {}
    keys = []
    for batch in vad_chunk_loader(urls, data_root, chunk_s=CHUNK_S, num_chunks=2, batch_size=1):
        keys += batch["keys"]
        for reason, n in batch["skipped"].items():
            skipped[reason] = skipped.get(reason, 0) + n
    assert set(keys) == {"b"} and skipped == {"audio_changed": 1}  # a's bytes changed; b's did not
    run_vad_segments(data_root, SHARD, model=None)
    build_language_index(data_root)
    assert assert_published_tables_read_back(data_root) > 0
