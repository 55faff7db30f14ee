"""The map-style ASR training dataset and its collate function.

    dataset = AsrManifestDataset("/data/asr/manifests/train.parquet", tokenizer=model.tokenizer)
    sampler = DurationBucketBatchSampler(dataset.durations_s, dataset.languages, world_size=8,
                                         rank=rank, grad_accum=4, temperature=0.3)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_asr_batch, num_workers=12)

Each item reads one extracted FLAC, averages channels to mono, resamples to 16 kHz when needed,
tokenizes the (already cleaned, language-tagged) text and truncates it to ``max_token_len``. A file
that cannot be read returns ``None`` and logs the file: ``collate_asr_batch`` drops it, so a broken
file never becomes a fake silence/text pair. The manifest is held as numpy/Arrow columns, not a
pandas frame: workers fork it copy-on-write without touching per-row Python objects.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import soundfile as sf
import torch

from speechdata.asr.flac import ASR_SAMPLE_RATE
from speechdata.audio.codec import downmix_to_mono, resample
from speechdata.io.storage import _is_local, filesystem_for, read_parquet

log = logging.getLogger(__name__)

MAX_TOKEN_LEN = 512


def _empty_manifest() -> pa.Table:
    return pa.table(
        {
            "audio_filepath": pa.array([], pa.string()),
            "text": pa.array([], pa.string()),
            "duration": pa.array([], pa.float64()),
            "lang": pa.array([], pa.string()),
        }
    )


def _tokenize_with(tokenizer: Any) -> Callable[[str], list[int]]:
    """NeMo tokenizers expose ``text_to_ids``; a plain callable works too."""
    if hasattr(tokenizer, "text_to_ids"):
        return tokenizer.text_to_ids
    if callable(tokenizer):
        return tokenizer
    raise TypeError(f"tokenizer must have text_to_ids() or be callable, got {type(tokenizer).__name__}")


class AsrManifestDataset(torch.utils.data.Dataset):
    """One item per manifest row: ``{"signal", "tokens", "duration", "lang"}`` or ``None``.

    ``manifest`` is a parquet path/URL written by the ``asr_manifest`` asset, a directory of its
    per-shard parts (``asr/manifests/parts/train/``: every part, in shard order), or an Arrow table with
    ``audio_filepath``, ``text``, ``duration`` and ``lang``. A relative ``audio_filepath`` is taken
    from the manifest's directory (NeMo's rule; ``base_dir`` for a table), so a moved root reads.
    """

    def __init__(
        self,
        manifest: str | pa.Table,
        tokenizer: Any,
        *,
        sample_rate: int = ASR_SAMPLE_RATE,
        max_token_len: int = MAX_TOKEN_LEN,
        base_dir: str | None = None,
    ):
        if isinstance(manifest, str):
            fs, path = filesystem_for(manifest)
            columns = ["audio_filepath", "text", "duration", "lang"]
            if fs.isdir(path):
                # A directory of per-shard parts (asr/manifests/parts/<split>/), in shard order.
                parts = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".parquet"))
                tables = [read_parquet(fs, part, columns) for part in parts]
                manifest = pa.concat_tables(tables) if tables else _empty_manifest()
                directory = path
            else:
                manifest = read_parquet(fs, path, columns)
                directory = posixpath.dirname(path)
            base_dir = fs.unstrip_protocol(directory) if not _is_local(fs) else directory
        self._paths = manifest["audio_filepath"].combine_chunks()
        self._base_dir = base_dir
        self._texts = manifest["text"].combine_chunks()
        self.durations_s = manifest["duration"].to_numpy().astype(np.float64)
        self.languages = np.asarray(manifest["lang"].to_numpy(zero_copy_only=False)).astype(str)
        self.sample_rate = sample_rate
        self.max_token_len = max_token_len
        self._tokenize = _tokenize_with(tokenizer)

    def __len__(self) -> int:
        return len(self._paths)

    def __getitem__(self, index: int) -> dict | None:
        path = _resolve(self._paths[index].as_py(), self._base_dir)
        try:
            samples, rate = _read_audio(path)
        except Exception as exc:  # libsndfile, fsspec and OS errors all mean the same: skip this item
            log.warning(f"Bad audio: {path}: {exc}")
            return None
        mono = downmix_to_mono(samples)
        if rate != self.sample_rate:
            mono = resample(mono, rate, self.sample_rate)
        if mono.shape[0] == 0:
            log.warning(f"Bad audio: {path}: no samples")
            return None
        tokens = list(self._tokenize(self._texts[index].as_py()))[: self.max_token_len]
        return {
            "signal": torch.from_numpy(np.ascontiguousarray(mono, dtype=np.float32)),
            "tokens": torch.tensor(tokens, dtype=torch.long),
            "duration": float(self.durations_s[index]),
            "lang": str(self.languages[index]),
        }


def _resolve(path: str, base_dir: str | None) -> str:
    if "://" in path or path.startswith("/") or base_dir is None:
        return path
    scheme, sep, rest = base_dir.rpartition("://")
    joined = posixpath.normpath(posixpath.join(rest if sep else base_dir, path))
    return f"{scheme}://{joined}" if sep else joined


def _read_audio(path: str) -> tuple[np.ndarray, int]:
    if "://" in path and not path.startswith("file://"):
        fs, inner = filesystem_for(path)
        with fs.open(inner, "rb") as handle:
            return sf.read(handle, dtype="float32", always_2d=True)
    return sf.read(path.removeprefix("file://"), dtype="float32", always_2d=True)


def collate_asr_batch(batch: Sequence[dict | None]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(signal [B, T] float32, signal_len [B] long, tokens [B, U] long, token_len [B] long)``,
    zero-padded, the tuple NeMo's RNNT/TDT ``training_step`` unpacks. ``None`` items are dropped; a
    batch with nothing left is one 1-sample silent item with no tokens (the original ASR pipeline's
    placeholder)."""
    items = [item for item in batch if item is not None]
    if not items:
        return (
            torch.zeros(1, 1),
            torch.tensor([1], dtype=torch.long),
            torch.zeros(1, 1, dtype=torch.long),
            torch.tensor([0], dtype=torch.long),
        )
    signal_lens = torch.tensor([item["signal"].shape[0] for item in items], dtype=torch.long)
    token_lens = torch.tensor([item["tokens"].shape[0] for item in items], dtype=torch.long)
    signals = torch.zeros(len(items), int(signal_lens.max()), dtype=torch.float32)
    tokens = torch.zeros(len(items), max(int(token_lens.max()), 1), dtype=torch.long)
    for row, item in enumerate(items):
        signals[row, : item["signal"].shape[0]] = item["signal"]
        tokens[row, : item["tokens"].shape[0]] = item["tokens"]
    return signals, signal_lens, tokens, token_lens
