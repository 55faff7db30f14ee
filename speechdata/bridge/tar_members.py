"""How a bridge sample's members are encoded in the tar: ``.npy`` arrays and 16-bit mono WAV, written as
(header, buffer) pieces so the packer streams the arrays' own memory without copying it."""

from __future__ import annotations

import functools
import io
import struct

import numpy as np

from speechdata.audio.clock import SAMPLE_RATE
from speechdata.bridge.tar_stream import byte_view


def npy_pieces(array: np.ndarray, dtype) -> tuple:
    """What ``np.save`` writes, as (header, the array's own buffer)."""
    array = np.ascontiguousarray(array, dtype=dtype)
    return _npy_header(array.dtype.str, array.shape), byte_view(array)


@functools.lru_cache(maxsize=4096)
def _npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    """``np.save``'s header (format 1.0) for a C-ordered array: shapes repeat, so each is built once."""
    buffer = io.BytesIO()
    header = {"descr": descr, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buffer, header)
    return buffer.getvalue()


def wav_pieces(samples: np.ndarray) -> tuple:
    """A 16-bit mono WAV: the 44-byte canonical header libsndfile writes, then the PCM (no soundfile round trip).

    int16 samples (the stored audio) go in untouched; floats are quantized as ingest quantizes them.
    """
    if samples.dtype != np.int16:
        samples = np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2")
    pcm = byte_view(np.ascontiguousarray(samples, dtype="<i2"))
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + pcm.nbytes, b"WAVE", b"fmt ", 16, 1, 1, SAMPLE_RATE, 2 * SAMPLE_RATE, 2, 16,
        b"data", pcm.nbytes,
    )  # fmt: skip
    return header, pcm


def wav_bytes(samples: np.ndarray) -> bytes:
    return b"".join(bytes(piece) for piece in wav_pieces(samples))
