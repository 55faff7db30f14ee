"""The VAD-chunked training loader: stream audio tars, cut random speech chunks, normalize, batch.

::

    from speechdata.vad.language_index import build_urls
    from speechdata.vad.loader import vad_chunk_loader

    urls = build_urls(["es", "fr"], "s3://bucket/data")
    loader = vad_chunk_loader(urls, "s3://bucket/data", languages=["es", "fr"], batch_size=8, num_workers=4)
    for batch in loader:
        batch["input_values"]   # float32 [sum of chunks, chunk_s * sample_rate], zero mean, unit variance
        batch["languages"]      # one language per chunk
        batch["skipped"]        # files skipped since the previous batch, by reason

A ``webdataset`` pipeline reads each tar front to back (no listing, no extraction), shuffles the tar
order (``shardshuffle``, deterministic per seed and epoch) and gives each DataLoader worker its own
tars. Each file's segments, language and tar key come from its shard's ``vad_segments.parquet``
(read once per tar); a file whose bytes' SHA-1 is not the row's ``audio_sha1`` is skipped, since
those segments were found in other audio. From segments at least ``chunk_s`` long the file yields up to ``num_chunks``
chunks (:mod:`speechdata.vad.chunks`); only those frames are decoded (a seek, then a short read),
each chunk is resampled to ``sample_rate`` and normalized like a wav2vec2/WavLM feature extractor
with ``do_normalize`` (``(x - mean) / sqrt(var + 1e-7)``).

Every file that yields nothing is counted under one of :data:`SKIP_REASONS`; the counts travel with
the samples (``skipped``: counts since the worker's previous sample, and a last chunk-less sample
carries any remainder), so summing ``batch["skipped"]`` over an epoch counts every skip exactly,
in any number of workers.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import soundfile as sf
import torch

from speechdata.audio.codec import downmix_to_mono, resample
from speechdata.io import layout
from speechdata.io.audio_tars import audio_extension
from speechdata.io.storage import DataRoot
from speechdata.io.webdataset_fsspec import register_fsspec_schemes
from speechdata.vad.chunks import DEFAULT_CHUNK_S, DEFAULT_NUM_CHUNKS, chunk_rng, draw_chunk_starts

SKIP_REASONS = (
    "no_audio_member",
    "no_vad_data",
    "language_not_wanted",
    "no_speech",
    "no_long_segment",
    "decode_error",
    "audio_changed",
)
"""Why a file yields no chunk; the first five are the original loader's checks, in their order.
``audio_changed``: the tar's bytes are not those the segments were found in (a landed tar replaced
by a re-landing before ``vad_segments`` ran again); their segments would point at other audio."""

NORMALIZE_EPSILON = 1e-7
"""``transformers``' ``Wav2Vec2FeatureExtractor.zero_mean_unit_var_norm`` adds this to the variance."""

SEEK_PREROLL_S = 0.5
"""Decode this much before a chunk in a lossy file and drop it. After a seek, an MP3 frame may need
bits from up to 511 bytes of earlier frames (its bit reservoir): at 16 kHz and low bit rates that is
~0.3 s, and 0.1 s left audible glitches. With 0.5 s every chunk equals the same samples of a whole-file
decode (``tests/unit/test_vad_streaming.py``), at the cost of decoding 5 % more of a 10 s chunk."""

LOSSLESS_CONTAINERS = frozenset({"WAV", "WAVEX", "FLAC", "AIFF", "W64", "RF64", "CAF"})
"""Formats whose seek lands on the exact sample: no preroll."""

_TAR_URL = re.compile(r"/(?:landing/([^/]+)/audio|shards/([^/]+)/audio(?:-[0-9a-f]{16})?)\.tar$")


def shard_of_tar_url(url: str) -> str:
    match = _TAR_URL.search(url)
    if not match:
        raise ValueError(
            f"{url}: not a shard's audio tar (landing/<shard>/audio.tar or shards/<shard>/audio-<sha16>.tar)"
        )
    return match.group(1) or match.group(2)


def normalize_chunk(samples: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance, exactly as a feature extractor with ``do_normalize=True``."""
    return ((samples - samples.mean()) / np.sqrt(samples.var() + NORMALIZE_EPSILON)).astype(np.float32)


@dataclass(frozen=True)
class FileVad:
    language: str | None
    start_s: list[float]
    end_s: list[float]
    audio_sha1: str | None = None
    """SHA-1 of the bytes the segments were found in; None (older tables) skips the check."""


def read_chunks(data: bytes, starts_s: list[float], chunk_s: float, sample_rate: int) -> np.ndarray:
    """Decode only ``[start, start + chunk_s)`` of each start; ``[len(starts), chunk_s * sample_rate]``."""
    target = int(round(chunk_s * sample_rate))
    out = np.zeros((len(starts_s), target), np.float32)
    with sf.SoundFile(io.BytesIO(data)) as sound:
        rate = sound.samplerate
        frames = int(round(chunk_s * rate))
        preroll = 0 if sound.format in LOSSLESS_CONTAINERS else int(round(SEEK_PREROLL_S * rate))
        for row, start_s in enumerate(starts_s):
            first = int(round(start_s * rate))
            seek_to = max(first - preroll, 0)
            sound.seek(seek_to)
            block = sound.read(first - seek_to + frames, dtype="float32", always_2d=True)[first - seek_to :]
            mono = resample(downmix_to_mono(block), rate, sample_rate)[:target]
            # A segment that ends within a few ms of a file's last frame may come up a few samples short.
            out[row, : mono.shape[0]] = mono
    return out


class VadChunkDataset(torch.utils.data.IterableDataset):
    """Streams ``{"input_values" [n, samples], "language", "key", "url", "chunk_start_s", "skipped"}``.

    ``languages=None`` keeps every file (files of unknown language too). ``set_epoch`` changes the
    tar order and the chunks; the same (seed, epoch) gives the same chunks for every file.
    """

    def __init__(
        self,
        urls: Iterable[str],
        data_root: DataRoot | str,
        *,
        languages: Iterable[str] | None = None,
        chunk_s: float = DEFAULT_CHUNK_S,
        num_chunks: int = DEFAULT_NUM_CHUNKS,
        sample_rate: int = 16_000,
        seed: int = 0,
        shardshuffle: int | bool = 1000,
    ):
        super().__init__()
        self.urls = list(urls)
        self.data_root = DataRoot(data_root) if isinstance(data_root, str) else data_root
        self.languages = frozenset(languages) if languages is not None else None
        self.chunk_s, self.num_chunks, self.sample_rate = chunk_s, num_chunks, sample_rate
        self.seed, self.shardshuffle, self.epoch = seed, shardshuffle, 0
        self.skips: Counter = Counter()
        """Skips seen by this process's iterations (a DataLoader's workers count in their copies)."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _pipeline(self):
        import webdataset as wds

        register_fsspec_schemes()  # in the worker: object-store tar URLs stream through fsspec

        return wds.WebDataset(
            self.urls,
            shardshuffle=self.shardshuffle or False,
            detshuffle=True,
            seed=self.seed + self.epoch,
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
            empty_check=False,
        )

    def _vad_table(self, shard_id: str) -> dict[str, FileVad]:
        table = self.data_root.read_parquet(layout.vad_segments(shard_id))  # older tables lack audio_sha1
        table = table.select(
            [c for c in ("tar_key", "language", "start_s", "end_s", "audio_sha1") if c in table.column_names]
        )
        return {
            row["tar_key"]: FileVad(row["language"], row["start_s"], row["end_s"], row.get("audio_sha1"))
            for row in table.to_pylist()
            if row["tar_key"] is not None
        }

    def __iter__(self) -> Iterator[dict]:
        pending: Counter = Counter()
        tables: dict[str, dict[str, FileVad]] = {}
        for sample in self._pipeline():
            url = sample["__url__"]
            shard_id = shard_of_tar_url(url)
            if shard_id not in tables:
                tables = {shard_id: self._vad_table(shard_id)}  # tars are read one after another
            result = self._chunks_of(sample, shard_id, tables[shard_id])
            if isinstance(result, str):
                pending[result] += 1
                self.skips[result] += 1
                continue
            result["skipped"], pending = dict(pending), Counter()
            yield result
        if pending:
            yield {
                "input_values": torch.zeros(0, int(round(self.chunk_s * self.sample_rate))),
                "language": None,
                "key": None,
                "url": None,
                "chunk_start_s": [],
                "skipped": dict(pending),
            }

    def _chunks_of(self, sample: dict, shard_id: str, vad: dict[str, FileVad]) -> dict | str:
        """The file's chunks, or the reason it has none."""
        key = sample["__key__"]
        member = next((ext for ext in sample if not ext.startswith("__") and audio_extension(ext)), None)
        if member is None:
            return "no_audio_member"
        info = vad.get(key)
        if info is None:
            return "no_vad_data"
        if self.languages is not None and info.language not in self.languages:
            return "language_not_wanted"
        if not info.start_s:
            return "no_speech"
        if info.audio_sha1 is not None and hashlib.sha1(sample[member]).hexdigest() != info.audio_sha1:
            return "audio_changed"
        rng = chunk_rng(self.seed, self.epoch, shard_id, key)
        starts = sorted(draw_chunk_starts(info.start_s, info.end_s, self.chunk_s, self.num_chunks, rng))
        if not starts:
            return "no_long_segment"
        try:
            chunks = read_chunks(sample[member], starts, self.chunk_s, self.sample_rate)
        except Exception:  # a corrupt file costs itself only, and is counted
            return "decode_error"
        normalized = np.stack([normalize_chunk(chunk) for chunk in chunks])
        return {
            "input_values": torch.from_numpy(normalized),
            "language": info.language,
            "key": key,
            "url": sample["__url__"],
            "chunk_start_s": starts,
        }


def collate_chunks(batch: list[dict]) -> dict:
    """Concatenate the chunks of a batch of files; one language, key and start per chunk."""
    languages, keys, starts = [], [], []
    skipped: Counter = Counter()
    for sample in batch:
        n = sample["input_values"].shape[0]
        languages += [sample["language"]] * n
        keys += [sample["key"]] * n
        starts += list(sample["chunk_start_s"])
        skipped.update(sample["skipped"])
    return {
        "input_values": torch.cat([sample["input_values"] for sample in batch], dim=0),
        "languages": languages,
        "keys": keys,
        "chunk_start_s": starts,
        "skipped": dict(skipped),
    }


def vad_chunk_loader(
    urls: Iterable[str], data_root: DataRoot | str, *, batch_size: int = 8, num_workers: int = 0, **options
) -> torch.utils.data.DataLoader:
    """A DataLoader over :class:`VadChunkDataset` (``batch_size`` files per batch) with :func:`collate_chunks`.

    Each worker streams its own tars (``urls[worker::num_workers]``), so use at least as many tars as workers.
    """
    dataset = VadChunkDataset(urls, data_root, **options)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=num_workers,
        collate_fn=collate_chunks,
        persistent_workers=False,
    )
