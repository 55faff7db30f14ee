"""A named pipe, a socket or a device where a landed or imported file is read is refused by name, never opened.

Opening a FIFO for reading blocks until a writer comes: one planted as ``_SUCCESS`` or
``metadata.parquet`` would hang the landing sensor's tick (no shard of the corpus lands) and
``speechdata land``. Every FIFO here is watched: a thread notices any reader that opens it, counts
it, and releases it (a writer opens and closes: the reader sees the end of the file), so a
regression fails its assertion instead of hanging the suite.
"""

import os
import re
import socket
import threading

import dagster as dg
import pytest

from sensors.landing import build_landing_sensor
from speechdata.cli import run as speechdata_main
from speechdata.importers.language_tars import import_language_tar
from speechdata.io import layout
from speechdata.io.regular_files import NotARegularFile, open_regular, read_regular, require_regular
from speechdata.landing.contract import ContractError
from speechdata.landing.fingerprint import shard_content_fingerprint
from speechdata.landing.raw_shard import validate_landed_shard
from tests.conftest import encode, land_shard, tone
from tests.tiny_resources import tiny_resources_for

WAV = encode(tone(1.0, 16_000), 16_000)


class WatchedFifo:
    """A named pipe that counts the readers that open it and lets each one go."""

    def __init__(self, path: str):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)
        os.mkfifo(path)
        self.path, self.readers = path, 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._release_readers, daemon=True)
        self._thread.start()

    def _release_readers(self) -> None:
        while not self._stopped.wait(0.01):
            try:
                # Succeeds only while a reader has it open (or waits in open): a blocked reader wakes,
                # and reads the end of the file once this writer is gone.
                descriptor = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                continue
            self.readers += 1
            os.close(descriptor)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)


@pytest.fixture
def fifo():
    made: list[WatchedFifo] = []

    def make(path: str) -> WatchedFifo:
        made.append(WatchedFifo(path))
        return made[-1]

    yield make
    for watched in made:
        watched.stop()


def test_only_regular_files_are_opened_and_the_others_are_refused_naming_their_kind(tmp_path, fifo, data_root):
    regular = tmp_path / "regular.bin"
    regular.write_bytes(b"bytes")
    pipe = fifo(str(tmp_path / "pipe"))
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(tmp_path / "socket"))
    try:
        fs = data_root.fs
        assert read_regular(fs, str(regular)) == b"bytes"
        with fs.open(str(regular), "rb") as handle:  # the data root's own filesystem, as every stage reads
            assert handle.read() == b"bytes"
        for path, kind in [
            (pipe.path, "named pipe (FIFO)"),
            (str(tmp_path / "socket"), "socket"),
            ("/dev/null", "character device"),
            (str(tmp_path), "directory"),
        ]:
            for read in (
                lambda p: open_regular(fs, p),
                lambda p: require_regular(fs, p),
                fs.cat_file,
                lambda p: fs.open(p, "rb"),
            ):
                with pytest.raises(NotARegularFile, match=re.escape(f"{path}: is a {kind},")):
                    read(path)
    finally:
        listening.close()
    assert pipe.readers == 0


def test_a_fifo_as_success_or_metadata_never_blocks_the_landing_tick_and_the_other_shards_land(data_root, fifo):
    for shard_id in ("good", "pipe-success", "pipe-metadata"):
        land_shard(data_root, shard_id, [{"utt_id": "a", "audio_path": "a.wav"}], {"a.wav": WAV})
    success = fifo(data_root.path(layout.landing_success_marker("pipe-success")))
    metadata = fifo(data_root.path(layout.landing_metadata("pipe-metadata")))

    with dg.instance_for_test() as instance:
        context = dg.build_sensor_context(instance=instance, resources=tiny_resources_for(data_root.url))
        result = build_landing_sensor(batch_shards=1)(context)
    # Every shard is registered and requested: the one whose metadata is a FIFO fails its run by name.
    assert sorted(request.run_key for request in result.run_requests) == ["good", "pipe-metadata", "pipe-success"]
    assert success.readers == 0 and metadata.readers == 0

    # The fingerprint tells a FIFO apart without reading it, so a FIFO replaced by a file is a change.
    planted = shard_content_fingerprint(data_root, "pipe-success")
    success.stop()
    os.unlink(success.path)
    data_root.write_bytes(layout.landing_success_marker("pipe-success"), b"")
    assert shard_content_fingerprint(data_root, "pipe-success") != planted


def test_speechdata_land_refuses_a_fifo_metadata_naming_it(data_root, fifo, capsys):
    land_shard(data_root, "s1", [{"utt_id": "a", "audio_path": "a.wav"}], {"a.wav": WAV})
    metadata = fifo(data_root.path(layout.landing_metadata("s1")))
    assert speechdata_main(["land", data_root.path(layout.landing_dir("s1"))]) != 0
    error = capsys.readouterr().err
    assert f"{metadata.path}: metadata.parquet must be a regular file, not a named pipe (FIFO)" in error
    assert metadata.readers == 0


def test_a_fifo_as_an_audio_file_is_one_rejected_row_and_as_audio_tar_fails_the_shard_by_name(data_root, fifo):
    rows = [{"utt_id": "a", "audio_path": "a.wav"}, {"utt_id": "b", "audio_path": "b.wav"}]
    land_shard(data_root, "s1", rows, {"a.wav": WAV, "b.wav": WAV})
    audio = fifo(data_root.path(f"{layout.landing_audio_dir('s1')}/b.wav"))
    validation = validate_landed_shard(data_root, "s1")
    assert validation.index["utt_id"].to_pylist() == ["a"]
    [reject] = validation.rejects
    assert (reject.utt_id, reject.reason) == ("b", "audio_not_a_regular_file")
    assert "landing/s1/audio/b.wav is a named pipe (FIFO), not a regular file" in reject.detail
    assert audio.readers == 0

    land_shard(data_root, "s2", rows, {"a.wav": WAV, "b.wav": WAV}, as_tar=True)
    tar = fifo(data_root.path(layout.landing_audio_tar("s2")))
    with pytest.raises(ContractError, match="audio.tar must be a regular file, not a named pipe"):
        validate_landed_shard(data_root, "s2")
    assert tar.readers == 0


def test_an_importer_refuses_a_fifo_source_naming_it(data_root, tmp_path, fifo):
    source = fifo(str(tmp_path / "sources" / "000001.tar"))
    with pytest.raises(NotARegularFile, match=r"000001\.tar: is a named pipe \(FIFO\)"):
        import_language_tar(data_root, source.path, {})
    assert source.readers == 0
    assert not data_root.exists(layout.landing_success_marker("lid-000001"))
