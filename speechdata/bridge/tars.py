"""Pack a shard's bridge tuples into deterministic WebDataset tars.

One sample per utterance: ``<key>.wav`` (24 kHz mono 16-bit), ``<key>.qwen.npy``,
``<key>.wavlm.npy``, ``<key>.dur.npy``, ``<key>.grid.npy``, ``<key>.tokens.npy`` and ``<key>.json``.
Samples are sorted by key and members by name; every header has mtime 0, uid/gid 0, empty owner
names and mode 0644, so packing the same inputs again gives byte-identical tars. A tar rolls over
to the next number before it would pass ``max_tar_bytes`` or ``max_samples``.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import soundfile as sf

from speechdata.audio.container import iter_container_audio
from speechdata.bridge.clock import FRAME_RATE_HZ, SAMPLE_RATE
from speechdata.features.array_store import iter_arrays
from speechdata.io import layout
from speechdata.io.storage import DataRoot, atomic_open

DEFAULT_MAX_TAR_BYTES = 1_000_000_000
DEFAULT_MAX_SAMPLES = 10_000

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
        """(name, bytes) of the sample's files, sorted by name."""
        files = {
            f"{self.key}.wav": _wav_bytes(self.wav),
            f"{self.key}.qwen.npy": _npy_bytes(self.qwen, np.float16),
            f"{self.key}.wavlm.npy": _npy_bytes(self.wavlm, np.float16),
            f"{self.key}.tokens.npy": _npy_bytes(self.tokens, np.int32),
            f"{self.key}.grid.npy": _npy_bytes(self.grid, np.int32),
            f"{self.key}.dur.npy": _npy_bytes(self.dur, np.int32),
            f"{self.key}.json": json.dumps(self.info, sort_keys=True, ensure_ascii=False).encode(),
        }
        return sorted(files.items())


def _npy_bytes(array: np.ndarray, dtype) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array, dtype=dtype), allow_pickle=False)
    return buffer.getvalue()


def _wav_bytes(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    pcm = np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
    sf.write(buffer, pcm, SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return buffer.getvalue()


def deterministic_tar_info(name: str, size: int) -> tarfile.TarInfo:
    """A member header with mtime 0, root owner, no owner names, mode 0644: same bytes in, same tar out."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


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
    index names their final URLs: nothing a reader sees changes until
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
        url = data_root.uri(layout.bridge_tar(shard_id, number))
        tar_rows: list[dict] = []
        with atomic_open(data_root.fs, data_root.path(relative)) as handle:
            writer = _HashingWriter(handle)
            # Plain "w" mode writes each member straight through; stream mode ("w|") re-buffers in 10 KiB pieces.
            with tarfile.open(fileobj=writer, mode="w", format=tarfile.GNU_FORMAT) as tar:
                while sample is not None:
                    members = sample.members()
                    size = sum(512 + -(-len(data) // 512) * 512 for _, data in members)
                    full = tar_rows and (writer.position + size > max_tar_bytes or len(tar_rows) >= max_samples)
                    if full:
                        break
                    offset = tar.offset
                    for name, data in members:
                        tar.addfile(deterministic_tar_info(name, len(data)), io.BytesIO(data))
                    tar_rows.append({"key": sample.key, "tar_url": url, "offset": offset, "size": tar.offset - offset})
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


def iter_bridge_samples(data_root: DataRoot, shard_id: str) -> Iterator[BridgeSample]:
    """Every utterance with a grid and both feature matrices, sorted by utt_id."""
    grids = data_root.read_parquet(layout.frame_grids(shard_id))
    index = data_root.read_parquet(
        layout.utterance_index(shard_id), columns=["utt_id", "text", "language", "country", "source"]
    )
    info = {row["utt_id"]: row for row in index.to_pylist()}
    qwen_keys = set(
        data_root.read_parquet(layout.qwen_hidden_states(shard_id), columns=["utt_id"])["utt_id"].to_pylist()
    )
    wavlm_keys = set(data_root.read_parquet(layout.wavlm_features(shard_id), columns=["utt_id"])["utt_id"].to_pylist())
    packable = sorted(set(grids["utt_id"].to_pylist()) & qwen_keys & wavlm_keys)
    grid_rows = {
        row["utt_id"]: row
        for row in grids.select(["utt_id", "tokens", "grid", "dur", "n_frames", "n_tokens"]).to_pylist()
    }
    # Tars are written in key order; load one batch of keys at a time to bound memory.
    for start in range(0, len(packable), 256):
        keys = set(packable[start : start + 256])
        audio = {u: s for u, s, _ in iter_container_audio(data_root, layout.normalized_audio(shard_id), keys)}
        qwen = dict(iter_arrays(data_root, layout.qwen_hidden_states(shard_id), keys))
        wavlm = dict(iter_arrays(data_root, layout.wavlm_features(shard_id), keys))
        for key in sorted(keys):
            grid = grid_rows[key]
            meta = info[key]
            yield BridgeSample(
                key=key,
                wav=audio[key],
                qwen=qwen[key],
                wavlm=wavlm[key],
                tokens=np.asarray(grid["tokens"]),
                grid=np.asarray(grid["grid"]),
                dur=np.asarray(grid["dur"]),
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
                },
            )
