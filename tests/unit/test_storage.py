import pyarrow as pa
import pytest

from speechdata.io.storage import TEMP_PREFIX, DataRoot, atomic_open


@pytest.fixture(params=["local", "s3"])
def data_root(request, tmp_path) -> DataRoot:
    """Every storage contract holds on a local directory and on S3 (moto's server, through s3fs)."""
    if request.param == "s3":
        return DataRoot(f"{request.getfixturevalue('s3_bucket')}/root")
    return DataRoot(str(tmp_path / "data"))


def test_atomic_write_replaces_the_previous_file(data_root):
    data_root.write_bytes("a/b.bin", b"first")
    data_root.write_bytes("a/b.bin", b"second")
    with data_root.fs.open(data_root.path("a/b.bin"), "rb") as handle:
        assert handle.read() == b"second"
    assert data_root.fs.ls(data_root.path("a"), detail=False) == [data_root.path("a/b.bin")]


def test_failed_write_leaves_neither_the_file_nor_a_temp(data_root):
    with pytest.raises(RuntimeError), atomic_open(data_root.fs, data_root.path("x/out.bin")) as handle:
        handle.write(b"partial")
        raise RuntimeError("crash mid-write")
    assert not data_root.exists("x/out.bin")
    # (an object store has no empty directories: list everything under the root)
    assert not [p for p in data_root.fs.find(data_root.root) if TEMP_PREFIX in p]


def test_failed_write_keeps_the_previous_version(data_root):
    data_root.write_bytes("x/out.bin", b"good")
    with pytest.raises(RuntimeError), atomic_open(data_root.fs, data_root.path("x/out.bin")) as handle:
        handle.write(b"half")
        raise RuntimeError
    with data_root.fs.open(data_root.path("x/out.bin"), "rb") as handle:
        assert handle.read() == b"good"


def test_parquet_round_trip_and_uri(data_root):
    table = pa.table({"a": [1, 2]})
    data_root.write_parquet("t/p.parquet", table)
    assert data_root.read_parquet("t/p.parquet").equals(table)
    assert data_root.uri("t/p.parquet").startswith("file://" if data_root.is_local else "s3://")


def test_data_root_pickles_as_its_url(data_root):
    import pickle

    clone = pickle.loads(pickle.dumps(data_root))
    assert isinstance(clone, DataRoot) and clone.url == data_root.url and clone.root == data_root.root


def test_atomic_open_refuses_read_modes(data_root):
    with pytest.raises(ValueError), atomic_open(data_root.fs, data_root.path("r"), "rb"):
        pass


def test_a_killed_writers_temp_is_never_read_and_goes_at_the_next_write(data_root):
    import pyarrow as pa

    from speechdata.accounting.ledgers import product_ledger
    from speechdata.accounting.rejects import Reject, rejects_table
    from speechdata.io import layout
    from speechdata.io.storage import TEMP_PREFIX

    data_root.write_parquet(layout.landing_metadata("s"), pa.table({"utt_id": ["a"], "audio_path": ["a.wav"]}))
    orphan = f"{layout.rejects_dir('s')}/{TEMP_PREFIX}0123456789ab-raw_shards.parquet"
    other = f"{layout.rejects_dir('s')}/{TEMP_PREFIX}0123456789ab-alignments.parquet"
    data_root.write_bytes(orphan, b"")  # what kill -9 leaves: a 0-byte temp
    data_root.write_bytes(other, b"")
    table = rejects_table([Reject("a", "raw_shards", "audio_not_found", "x")])
    data_root.write_parquet(layout.rejects("s", "raw_shards"), table)
    assert not data_root.exists(orphan)  # this file's own orphan is gone
    assert data_root.exists(other)  # another writer's temp is never touched
    assert product_ledger(data_root, "s", "bridge", set()).balanced


def test_temp_names_of_long_file_names_stay_under_255_bytes(data_root):
    from speechdata.landing.contract import MAX_UTT_ID_LENGTH

    name = "x" * MAX_UTT_ID_LENGTH + ".flac"
    data_root.write_bytes(f"d/{name}", b"ok")
    assert data_root.fs.cat_file(data_root.path(f"d/{name}")) == b"ok"
    data_root.write_bytes(f"d/{'y' * 250}", b"ok")  # longer than any id allows: the temp name still fits


def test_a_parquet_writer_that_fails_leaves_the_previous_file_and_no_temp(data_root):
    from speechdata.io.storage import atomic_parquet_writer

    schema = pa.schema([("a", pa.int64())])
    path = data_root.path("p/stream.parquet")
    with atomic_parquet_writer(data_root.fs, path, schema) as writer:
        writer.write_table(pa.table({"a": [1, 2]}, schema=schema))
    with pytest.raises(RuntimeError), atomic_parquet_writer(data_root.fs, path, schema) as writer:
        writer.write_table(pa.table({"a": [3]}, schema=schema))
        raise RuntimeError("crash mid-write")
    assert data_root.read_parquet("p/stream.parquet")["a"].to_pylist() == [1, 2]
    assert not [p for p in data_root.fs.find(data_root.root) if TEMP_PREFIX in p]


def test_an_owner_removes_its_killed_runs_temps_and_never_another_writers(data_root):
    from speechdata.io.storage import owned_temps, temp_owner_tag

    tag = temp_owner_tag("s/vad_segments")
    assert len(tag) == 6 and not set(tag) & set("0123456789abcdef")  # never an untagged temp's name
    data_root.write_bytes("shards/s/keep.bin", b"x")
    killed = f"shards/s/{TEMP_PREFIX}{tag}0a1b2c-audio-staged.tar"  # what a killed run of the owner left
    others = [
        f"shards/s/{TEMP_PREFIX}0123456789ab-audio_24k.parquet",  # an untagged writer's, maybe alive
        f"shards/s/{TEMP_PREFIX}{temp_owner_tag('s/normalized_audio')}0a1b2c-audio_24k.parquet",
        f"shards/t/{TEMP_PREFIX}{tag}0a1b2c-audio-staged.tar",  # a folder this run never wrote to
    ]
    for name in [killed, *others]:
        data_root.fs.makedirs(data_root.path(name.rsplit("/", 1)[0]), exist_ok=True)
        data_root.fs.pipe(data_root.path(name), b"half")

    with owned_temps(data_root.fs, "s/vad_segments") as owner:
        data_root.write_bytes("shards/s/vad_segments.parquet", b"new")
        assert owner.folders == {data_root.path("shards/s")}

    assert not data_root.exists(killed)
    assert all(data_root.exists(name) for name in others)
    assert data_root.exists("shards/s/vad_segments.parquet") and data_root.exists("shards/s/keep.bin")


def test_an_owner_whose_block_fails_removes_nothing_but_its_own_failed_write(data_root):
    from speechdata.io.storage import owned_temps, temp_owner_tag

    killed = f"shards/s/{TEMP_PREFIX}{temp_owner_tag('s/p')}0a1b2c-out.bin"
    data_root.fs.makedirs(data_root.path("shards/s"), exist_ok=True)
    data_root.fs.pipe(data_root.path(killed), b"half")
    with (
        pytest.raises(RuntimeError),
        owned_temps(data_root.fs, "s/p"),
        atomic_open(data_root.fs, data_root.path("shards/s/out.bin")) as handle,
    ):
        handle.write(b"partial")
        raise RuntimeError("crash mid-write")
    assert [p for p in data_root.fs.find(data_root.root) if TEMP_PREFIX in p] == [data_root.path(killed)]


def test_the_storage_layer_knows_a_rejects_ledger_by_the_ledgers_own_columns(data_root):
    from speechdata.accounting.rejects import REJECTS_SCHEMA, Reject, rejects_table
    from speechdata.io.storage import REJECTS_LEDGER_COLUMNS

    assert REJECTS_SCHEMA.names == REJECTS_LEDGER_COLUMNS
    # A ledger's detail names a file under the root: stored without the root, not refused.
    absolute = data_root.path("landing/s/audio/a.wav")
    ledger = rejects_table([Reject("a", "raw_shards", "unreadable_audio", f"cannot read {absolute}")])
    stored = data_root.without_root_paths("shards/s/rejects/raw_shards.parquet", ledger)
    assert stored["detail"].to_pylist() == ["cannot read landing/s/audio/a.wav"]


def test_a_long_recordings_segment_samples_account_for_the_recording_in_the_bridge_ledger(data_root):
    import pyarrow as pa

    from speechdata.accounting.ledgers import product_ledger
    from speechdata.io import layout

    data_root.write_parquet(
        layout.landing_metadata("s"), pa.table({"utt_id": ["talk", "short"], "audio_path": ["t.wav", "s.wav"]})
    )
    # the keys shard_manifest packs: a recording's segments and an ordinary utterance
    ledger = product_ledger(data_root, "s", "bridge", {"talk+0000", "talk+0001", "short"})
    assert ledger.balanced and ledger.produced == 2 and ledger.unaccounted == []
    assert product_ledger(data_root, "s", "bridge", {"talk+0000"}).unaccounted == ["short"]
