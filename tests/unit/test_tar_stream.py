"""TarStream writes the very bytes tarfile writes for the same members, and hashes them."""

import hashlib
import io
import tarfile

import numpy as np
import pytest

from speechdata.bridge.tar_stream import TarStream, member_header
from speechdata.io.audio_tars import deterministic_tar_info


@pytest.mark.parametrize("name", ["a", "k.wav", "x" * 99, "x" * 100, "x" * 180, "clé.json"])
@pytest.mark.parametrize("size", [0, 1, 511, 512, 513, 384_044, 8**11 - 1, 8**11])
def test_member_header_is_tarfiles_gnu_header(name, size):
    expected = deterministic_tar_info(name, size).tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    assert member_header(name, size) == expected


def tarfile_bytes(samples) -> tuple[bytes, list[int]]:
    buffer = io.BytesIO()
    offsets = []
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for members in samples:
            offsets.append(tar.offset)
            for name, payload in members:
                data = b"".join(
                    np.ascontiguousarray(p).tobytes() if isinstance(p, np.ndarray) else bytes(p) for p in payload
                )
                tar.addfile(deterministic_tar_info(name, len(data)), io.BytesIO(data))
        offsets.append(tar.offset)
    return buffer.getvalue(), offsets


def test_samples_of_views_and_bytes_give_tarfiles_bytes_and_hash():
    rng = np.random.default_rng(0)
    samples = []
    for n in range(40):
        array = rng.standard_normal((n % 5, 7)).astype(np.float16)
        samples.append(
            [
                (f"k{n:03d}.a.npy", (b"header", array)),
                (f"k{n:03d}.json", (b'{"n": %d}' % n,)),
                (f"k{n:03d}.wav", (rng.integers(-32768, 32767, n * 97, dtype=np.int16),)),
                (f"k{n:03d}." + "long" * 30, ()),  # a GNU long name and an empty payload
            ]
        )
    expected, expected_offsets = tarfile_bytes(samples)
    buffer = io.BytesIO()
    stream = TarStream(buffer)
    offsets = []
    for members in samples:
        offsets.append(stream.offset)
        stream.add_sample(members)
    offsets.append(stream.offset)
    stream.close()
    assert buffer.getvalue() == expected
    assert offsets[:-1] == expected_offsets[:-1]
    assert stream.offset == len(expected) and len(expected) % tarfile.RECORDSIZE == 0
    assert stream.hexdigest() == hashlib.sha256(expected).hexdigest()


def test_a_failing_write_is_raised_to_the_caller():
    class Broken(io.RawIOBase):
        def writable(self):
            return True

        def write(self, data):
            raise OSError("disk full")

    stream = TarStream(Broken())
    with pytest.raises(OSError, match="disk full"):
        for n in range(100):
            stream.add_sample([(f"k{n}.bin", (bytes(1000),))])
        stream.close()
