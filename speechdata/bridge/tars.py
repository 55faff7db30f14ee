"""Pack a shard's bridge tuples into deterministic WebDataset tars.

One sample per utterance: ``<key>.wav`` (24 kHz mono 16-bit), ``<key>.qwen.npy``,
``<key>.wavlm.npy``, ``<key>.dur.npy``, ``<key>.grid.npy``, ``<key>.tokens.npy`` and ``<key>.json`` (text, language, ..., and ``words``: the word alignment as
``{"word", "start_ms", "end_ms"}`` dicts).
Samples are sorted by key and members by name; every header has mtime 0, uid/gid 0, empty owner
names and mode 0644, so packing the same inputs again gives byte-identical tars. A tar rolls over
to the next number before it would pass ``max_tar_bytes`` or ``max_samples``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tarfile
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from speechdata.audio.codec import decode_audio
from speechdata.bridge.clock import FRAME_RATE_HZ, SAMPLE_RATE
from speechdata.io import layout
from speechdata.io.audio_tars import deterministic_tar_info
from speechdata.io.keyed_stream import KeyedRows, read_keys
from speechdata.io.storage import DataRoot, atomic_open

DEFAULT_MAX_TAR_BYTES = 1_000_000_000
DEFAULT_MAX_SAMPLES = 10_000
COPY_BYTES = 64 * 1024 * 1024

BRIDGE_INDEX_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("tar_url", pa.string(), nullable=False),
        pa.field("tar_sha256", pa.string(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
    ]
)


@dataclass(frozen=True)
class BridgeSample:
    key: str
    wav: np.ndarray
    qwen: np.ndarray
    wavlm: np.ndarray
    tokens: np.ndarray
    grid: np.ndarray
    dur: np.ndarray
    info: dict

    def members(self) -> list[tuple[str, bytes]]:
        """(name, bytes) of the sample's files, sorted by name (encoded once, then cached)."""
        cached = self.__dict__.get("_members")
        if cached is None:
            files = {
                f"{self.key}.wav": _wav_bytes(self.wav),
                f"{self.key}.qwen.npy": _npy_bytes(self.qwen, np.float16),
                f"{self.key}.wavlm.npy": _npy_bytes(self.wavlm, np.float16),
                f"{self.key}.tokens.npy": _npy_bytes(self.tokens, np.int32),
                f"{self.key}.grid.npy": _npy_bytes(self.grid, np.int32),
                f"{self.key}.dur.npy": _npy_bytes(self.dur, np.int32),
                f"{self.key}.json": json.dumps(self.info, sort_keys=True, ensure_ascii=False).encode(),
            }
            cached = sorted(files.items())
            object.__setattr__(self, "_members", cached)  # frozen dataclass: set once, bypassing __setattr__
        return cached


def _npy_bytes(array: np.ndarray, dtype) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=dtype), allow_pickle=False)
    return buffer.getvalue()


def _wav_bytes(samples: np.ndarray) -> bytes:
    """A 16-bit mono WAV: the 44-byte canonical header libsndfile writes, then the PCM (no soundfile round trip)."""
    pcm = np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + len(pcm), b"WAVE", b"fmt ", 16, 1, 1, SAMPLE_RATE, 2 * SAMPLE_RATE, 2, 16,
        b"data", len(pcm),
    )  # fmt: skip
    return header + pcm


class _HashingWriter(io.RawIOBase):
    """Counts and hashes everything written through it to the real handle."""

    def __init__(self, handle):
        self.handle, self.sha256, self.position = handle, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.handle.write(data)
        self.sha256.update(data)
        self.position += len(data)
        return len(data)

    def tell(self) -> int:
        return self.position


@dataclass(frozen=True)
class PackedTar:
    relative: str
    """Where :func:`pack_samples` wrote it: the shard's staging folder."""
    url: str
    """Where it lives once committed (what the index and the manifest name)."""
    sha256: str
    samples: int
    bytes: int


def pack_samples(
    data_root: DataRoot,
    shard_id: str,
    samples: Iterator[BridgeSample],
    *,
    max_tar_bytes: int = DEFAULT_MAX_TAR_BYTES,
    max_samples: int = DEFAULT_MAX_SAMPLES,
) -> tuple[list[PackedTar], pa.Table]:
    """Write the samples (already sorted by key) into rolling tars; return the tars and the index.

    The tars are written to the shard's staging folder (:func:`layout.staged_bridge_tar`) while the
    index names their final paths, relative to the data root: nothing a reader sees changes until
    :func:`speechdata.bridge.commit.commit_bridge` swaps tars, index and manifest together. No sample
    means no tar and an empty index (an empty shard is a valid size).
    """
    staging = data_root.path(layout.bridge_staging_dir(shard_id))
    if data_root.fs.exists(staging):  # what a killed run left half-staged is never committed
        data_root.fs.rm(staging, recursive=True)
    tars: list[PackedTar] = []
    rows: list[dict] = []
    pending = iter(samples)
    sample = next(pending, None)
    number = 0
    while sample is not None:
        relative = layout.staged_bridge_tar(shard_id, number)
        final = layout.bridge_tar(shard_id, number)
        url = data_root.uri(final)
        tar_rows: list[dict] = []
        with atomic_open(data_root.fs, data_root.path(relative)) as handle:
            writer = _HashingWriter(handle)
            # Plain "w" mode writes each member straight through; stream mode ("w|") re-buffers in 10 KiB pieces.
            # copybufsize: copy each member in one write, not 16 KiB pieces (each one hashed separately).
            with tarfile.open(fileobj=writer, mode="w", format=tarfile.GNU_FORMAT, copybufsize=COPY_BYTES) as tar:
                while sample is not None:
                    members = sample.members()
                    size = sum(512 + -(-len(data) // 512) * 512 for _, data in members)
                    full = tar_rows and (writer.position + size > max_tar_bytes or len(tar_rows) >= max_samples)
                    if full:
                        break
                    offset = tar.offset
                    for name, data in members:
                        tar.addfile(deterministic_tar_info(name, len(data)), io.BytesIO(data))
                    tar.members.clear()  # TarFile keeps every header; nothing here reads them back
                    tar_rows.append(
                        {"key": sample.key, "tar_url": final, "offset": offset, "size": tar.offset - offset}
                    )
                    sample = next(pending, None)
        digest = writer.sha256.hexdigest()
        for row in tar_rows:
            row["tar_sha256"] = digest
        rows += tar_rows
        tars.append(PackedTar(relative, url, digest, len(tar_rows), writer.position))
        number += 1
    return tars, pa.Table.from_pylist(rows, schema=BRIDGE_INDEX_SCHEMA)


def remove_stale_tars(data_root: DataRoot, shard_id: str, keep: int) -> None:
    """A re-run that packs fewer tars must not leave the old run's extra tars behind."""
    wanted = {data_root.path(layout.bridge_tar(shard_id, n)) for n in range(keep)}
    for path in data_root.glob(f"{layout.BRIDGE}/{shard_id}-*.tar"):
        if path not in wanted and path.rsplit("-", 1)[-1][:-4].isdigit():
            data_root.fs.rm(path)


def word_alignments(data_root: DataRoot, shard_id: str) -> dict[str, list[dict]]:
    """Per utterance, its aligned words in order: ``{"word", "start_ms", "end_ms"}`` (ms from the
    start of the utterance's own audio), published in each sample's ``.json`` so that readers
    (and the moshi export) need no internal file."""
    table = data_root.read_parquet(
        layout.alignments(shard_id), columns=["utt_id", "level", "index", "text", "start_ms", "end_ms"]
    )
    by_utt: dict[str, list[tuple]] = {}
    for row in table.filter(pc.equal(table["level"], "word")).to_pylist():
        by_utt.setdefault(row["utt_id"], []).append((row["index"], row["text"], row["start_ms"], row["end_ms"]))
    return {
        utt: [{"word": w, "start_ms": s, "end_ms": e} for _, w, s, e in sorted(rows)] for utt, rows in by_utt.items()
    }


def iter_bridge_samples(data_root: DataRoot, shard_id: str) -> Iterator[BridgeSample]:
    """Every utterance with a grid and both feature matrices, sorted by utt_id.

    One pass over each input (:class:`~speechdata.io.keyed_stream.KeyedRows`): cost per utterance
    does not grow with the shard, and memory holds a row group per file, not the shard.
    """
    qwen_keys = set(read_keys(data_root, layout.qwen_hidden_states(shard_id)))
    wavlm_keys = set(read_keys(data_root, layout.wavlm_features(shard_id)))
    packable = sorted(set(read_keys(data_root, layout.frame_grids(shard_id))) & qwen_keys & wavlm_keys)
    del qwen_keys, wavlm_keys
    words = word_alignments(data_root, shard_id)
    streams = zip(
        KeyedRows(data_root, layout.frame_grids(shard_id), GRID_COLUMNS, packable),
        KeyedRows(data_root, layout.utterance_index(shard_id), INFO_COLUMNS, packable),
        KeyedRows(data_root, layout.normalized_audio(shard_id), ["codec", "audio"], packable),
        KeyedRows(data_root, layout.qwen_hidden_states(shard_id), ARRAY_COLUMNS, packable),
        KeyedRows(data_root, layout.wavlm_features(shard_id), ARRAY_COLUMNS, packable),
    )

    def build(key: str, grid: dict, meta: dict, audio: dict, qwen: dict, wavlm: dict) -> BridgeSample:
        sample = BridgeSample(
            key=key,
            wav=decode_audio(audio["audio"], audio["codec"]),
            qwen=_array(qwen),
            wavlm=_array(wavlm),
            tokens=grid["tokens"],
            grid=grid["grid"],
            dur=grid["dur"],
            info={
                "text": meta["text"],
                "language": meta["language"],
                "country": meta["country"],
                "source": meta["source"],
                "shard": shard_id,
                "sample_rate": SAMPLE_RATE,
                "frame_rate": FRAME_RATE_HZ,
                "n_frames": grid["n_frames"],
                "n_tokens": grid["n_tokens"],
                "words": words.get(key, []),
            },
        )
        sample.members()  # encode here, in the worker thread
        return sample

    # Decoding FLAC (libsndfile) and encoding members (numpy) mostly release the GIL: run them
    # in threads a bounded number of samples ahead, and hand samples on in key order.
    with ThreadPoolExecutor(DECODE_THREADS) as pool:
        ahead: deque = deque()
        for key, rows in zip(packable, streams):
            ahead.append(pool.submit(build, key, *rows))
            if len(ahead) > 2 * DECODE_THREADS:
                yield ahead.popleft().result()
        while ahead:
            yield ahead.popleft().result()


DECODE_THREADS = min(4, os.cpu_count() or 1)
GRID_COLUMNS = ["tokens", "grid", "dur", "n_frames", "n_tokens"]
INFO_COLUMNS = ["text", "language", "country", "source"]
ARRAY_COLUMNS = ["n_rows", "dim", "dtype", "data"]


def _array(row: dict) -> np.ndarray:
    return np.frombuffer(row["data"], dtype=row["dtype"]).reshape(row["n_rows"], row["dim"])
