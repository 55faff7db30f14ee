"""Paced write-back starts each window's trip to disk, waits for the one before, and never changes the bytes."""

import errno
import hashlib
import io
import os
import sys

import numpy as np
import pytest

from speechdata.bridge.tar_stream import TarStream
from speechdata.bridge.tars import iter_bridge_samples, pack_samples
from speechdata.io import layout, write_back
from speechdata.io.storage import DataRoot
from speechdata.io.write_back import (
    SYNC_FILE_RANGE_WAIT_AFTER,
    SYNC_FILE_RANGE_WAIT_BEFORE,
    SYNC_FILE_RANGE_WRITE,
    StreamingWriteBack,
    file_descriptor,
)
from speechdata.testing.packing_inputs import write_packing_inputs

WAIT = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER


class Recorder:
    def __init__(self, fail_with: int | None = None):
        self.calls: list[tuple[int, int, int]] = []
        self.fail_with = fail_with

    def __call__(self, fd: int, offset_bytes: int, length_bytes: int, flags: int) -> None:
        assert os.fstat(fd).st_size >= 0  # a live descriptor
        self.calls.append((offset_bytes, length_bytes, flags))
        if self.fail_with is not None:
            raise OSError(self.fail_with, os.strerror(self.fail_with))


def write_chunks(handle, pacer: StreamingWriteBack, sizes: list[int]) -> bytes:
    data = b""
    for n, size in enumerate(sizes):
        chunk = bytes([n % 251]) * size
        handle.write(chunk)
        pacer.wrote(size)
        data += chunk
    pacer.finish()
    return data


def test_each_full_window_is_started_and_the_one_before_waited_for(tmp_path):
    recorder = Recorder()
    with open(tmp_path / "f.bin", "wb") as handle:
        pacer = StreamingWriteBack(handle, window_bytes=4096, sync_file_range=recorder)
        data = write_chunks(handle, pacer, [3000] * 10)  # 30 000 bytes: 7 full windows
    assert (tmp_path / "f.bin").read_bytes() == data
    expected = [(0, 4096, SYNC_FILE_RANGE_WRITE)]
    for window in range(1, 7):
        expected += [(window * 4096, 4096, SYNC_FILE_RANGE_WRITE), ((window - 1) * 4096, 4096, WAIT)]
    assert recorder.calls == expected
    assert pacer.pacing


def test_windows_are_counted_from_where_the_handle_started(tmp_path):
    recorder = Recorder()
    with open(tmp_path / "f.bin", "wb") as handle:
        handle.write(b"x" * 100)
        pacer = StreamingWriteBack(handle, window_bytes=1000, sync_file_range=recorder)
        write_chunks(handle, pacer, [2500])
    assert recorder.calls == [
        (100, 1000, SYNC_FILE_RANGE_WRITE),
        (1100, 1000, SYNC_FILE_RANGE_WRITE),
        (100, 1000, WAIT),
    ]


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EINVAL, errno.ESPIPE, errno.EOPNOTSUPP])
def test_a_filesystem_that_refuses_sync_file_range_gets_plain_writes(tmp_path, code):
    recorder = Recorder(fail_with=code)
    with open(tmp_path / "f.bin", "wb") as handle:
        pacer = StreamingWriteBack(handle, window_bytes=1000, sync_file_range=recorder)
        data = write_chunks(handle, pacer, [1500] * 4)
    assert len(recorder.calls) == 1 and not pacer.pacing  # tried once, then left alone
    assert (tmp_path / "f.bin").read_bytes() == data


def test_a_refusal_after_paced_windows_falls_back_without_waiting_on_it(tmp_path):
    class RefusesThird(Recorder):
        def __call__(self, fd, offset_bytes, length_bytes, flags):
            super().__call__(fd, offset_bytes, length_bytes, flags)
            if len(self.calls) == 2:
                raise OSError(errno.EINVAL, "refused")

    recorder = RefusesThird()
    with open(tmp_path / "f.bin", "wb") as handle:
        pacer = StreamingWriteBack(handle, window_bytes=1000, sync_file_range=recorder)
        data = write_chunks(handle, pacer, [1000] * 5)
    assert recorder.calls == [(0, 1000, SYNC_FILE_RANGE_WRITE), (1000, 1000, SYNC_FILE_RANGE_WRITE)]
    assert not pacer.pacing and (tmp_path / "f.bin").read_bytes() == data


def test_a_failed_write_back_is_the_writes_failure(tmp_path):
    with open(tmp_path / "f.bin", "wb") as handle:
        pacer = StreamingWriteBack(handle, window_bytes=1000, sync_file_range=Recorder(fail_with=errno.EIO))
        handle.write(bytes(1000))
        with pytest.raises(OSError) as raised:
            pacer.wrote(1000)
    assert raised.value.errno == errno.EIO


def test_handles_without_a_file_are_not_paced():
    recorder = Recorder()
    buffer = io.BytesIO()
    pacer = StreamingWriteBack(buffer, window_bytes=10, sync_file_range=recorder)
    assert file_descriptor(buffer) is None and not pacer.pacing
    assert write_chunks(buffer, pacer, [25, 25]) == buffer.getvalue()
    assert recorder.calls == []


def test_a_pipe_is_not_paced():
    read_end, write_end = os.pipe()
    try:
        with open(write_end, "wb", closefd=False) as handle:
            assert file_descriptor(handle) is None
            assert not StreamingWriteBack(handle, sync_file_range=Recorder()).pacing
    finally:
        os.close(read_end)
        os.close(write_end)


def test_window_must_be_positive(tmp_path):
    with open(tmp_path / "f.bin", "wb") as handle, pytest.raises(ValueError, match="window_bytes"):
        StreamingWriteBack(handle, window_bytes=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_the_c_librarys_sync_file_range_is_found_and_accepted_on_linux(tmp_path):
    assert write_back.SYNC_FILE_RANGE is not None
    with open(tmp_path / "f.bin", "wb") as handle:
        pacer = StreamingWriteBack(handle, window_bytes=8192, drop_written=True)
        data = write_chunks(handle, pacer, [5000] * 20)
        assert pacer.pacing  # every real call succeeded: no fallback
    assert (tmp_path / "f.bin").read_bytes() == data


def sample_members(count: int):
    rng = np.random.default_rng(1)
    return [
        [
            (f"k{n:04d}.npy", (b"head", rng.standard_normal((n % 9, 33)).astype(np.float16))),
            (f"k{n:04d}.json", (b"{}",)),
        ]
        for n in range(count)
    ]


@pytest.mark.parametrize("paced", [True, False])
def test_a_tar_written_to_a_file_is_the_in_memory_tars_bytes_paced_or_not(tmp_path, monkeypatch, paced):
    if not paced:
        monkeypatch.setattr(write_back, "SYNC_FILE_RANGE", None)
    samples = sample_members(300)
    buffer = io.BytesIO()
    in_memory = TarStream(buffer)
    for members in samples:
        in_memory.add_sample(members)
    in_memory.close()
    with open(tmp_path / "t.tar", "wb") as handle:
        on_disk = TarStream(handle, write_back_window_bytes=4096)
        for members in samples:
            on_disk.add_sample(members)
        on_disk.close()
        assert on_disk.write_back.pacing == (paced and sys.platform.startswith("linux"))
    assert (tmp_path / "t.tar").read_bytes() == buffer.getvalue()
    assert on_disk.hexdigest() == in_memory.hexdigest() == hashlib.sha256(buffer.getvalue()).hexdigest()


def packed(root: DataRoot) -> list[bytes]:
    tars, index = pack_samples(root, "s1", iter_bridge_samples(root, "s1"), max_tar_bytes=400_000)
    return [open(root.path(t.relative), "rb").read() for t in tars] + [str(index.to_pylist()).encode()]


def test_pack_samples_gives_the_same_tars_paced_in_small_windows_and_unpaced(tmp_path, monkeypatch):
    root = DataRoot(str(tmp_path))
    write_packing_inputs(root, "s1", 40, seconds=1.0, qwen_dim=16, wavlm_dim=8)
    monkeypatch.setattr(write_back, "WRITE_BACK_WINDOW_BYTES", 8192)
    calls: list[tuple[int, int]] = []
    real = write_back.SYNC_FILE_RANGE or (lambda *args: None)

    def watched(fd: int, offset_bytes: int, length_bytes: int, flags: int) -> None:
        calls.append((offset_bytes, flags))
        real(fd, offset_bytes, length_bytes, flags)

    monkeypatch.setattr(write_back, "SYNC_FILE_RANGE", watched)
    paced = packed(root)
    assert calls.count((0, SYNC_FILE_RANGE_WRITE)) == len(paced) - 1  # each tar paced from its own start
    monkeypatch.setattr(write_back, "SYNC_FILE_RANGE", None)
    assert packed(root) == paced
    assert len(paced) > 2


def test_a_write_back_failure_mid_tar_leaves_no_tar_nor_temp(tmp_path, monkeypatch):
    root = DataRoot(str(tmp_path))
    write_packing_inputs(root, "s1", 40, seconds=1.0, qwen_dim=16, wavlm_dim=8)
    monkeypatch.setattr(write_back, "WRITE_BACK_WINDOW_BYTES", 8192)
    monkeypatch.setattr(write_back, "SYNC_FILE_RANGE", Recorder(fail_with=errno.EIO))
    with pytest.raises(OSError) as raised:
        pack_samples(root, "s1", iter_bridge_samples(root, "s1"))
    assert raised.value.errno == errno.EIO
    staging = tmp_path / layout.bridge_staging_dir("s1")
    assert not staging.exists() or not [p for p in staging.rglob("*") if p.is_file()]
