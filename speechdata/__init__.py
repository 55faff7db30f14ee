"""speechdata: the Dagster-free core of the speech data platform.

Pure functions and small classes for the landing contract, audio, alignment, the 12.5 Hz
frame grid, features, packaging, manifests, splits, samplers and loaders. Training code
imports this package without Dagster installed.

The training API is exported here, as Lhotse's package ``__init__`` does::

    import speechdata

    ds = speechdata.bridge_dataset(urls, languages=["en"], shuffle=100)

Names resolve lazily (PEP 562): ``import speechdata`` imports neither torch nor DuckDB; the first
use of a name imports its module. The domain packages (``speechdata.bridge``, ``speechdata.asr``...)
hold the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it.
_EXPORTS = {
    # Bridge tuples (docs/bridge-tuples.md): the WebDataset reader and random access by byte range.
    "bridge_dataset": "speechdata.bridge.reader",
    "read_sample_at": "speechdata.bridge.reader",
    "decode_sample": "speechdata.bridge.reader",
    # The Mimi clock.
    "SAMPLE_RATE": "speechdata.audio.clock",
    "FRAME_RATE_HZ": "speechdata.audio.clock",
    "SAMPLES_PER_FRAME": "speechdata.audio.clock",
    # ASR fine-tuning: dataset, bucketed sampler, collate.
    "AsrManifestDataset": "speechdata.asr.dataset",
    "collate_asr_batch": "speechdata.asr.dataset",
    "DurationBucketBatchSampler": "speechdata.asr.sampler",
    # VAD-chunked streaming loader.
    "build_urls": "speechdata.vad.language_index",
    "VadChunkDataset": "speechdata.vad.loader",
    "vad_chunk_loader": "speechdata.vad.loader",
    "collate_chunks": "speechdata.vad.loader",
    # The data root every product lives under.
    "DataRoot": "speechdata.io.storage",
}

__all__ = [
    "AsrManifestDataset",
    "DataRoot",
    "DurationBucketBatchSampler",
    "FRAME_RATE_HZ",
    "SAMPLES_PER_FRAME",
    "SAMPLE_RATE",
    "VadChunkDataset",
    "bridge_dataset",
    "build_urls",
    "collate_asr_batch",
    "collate_chunks",
    "decode_sample",
    "read_sample_at",
    "vad_chunk_loader",
]

assert set(__all__) == set(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'speechdata' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:  # static analysers see the real names
    from speechdata.asr.dataset import AsrManifestDataset, collate_asr_batch
    from speechdata.asr.sampler import DurationBucketBatchSampler
    from speechdata.audio.clock import FRAME_RATE_HZ, SAMPLE_RATE, SAMPLES_PER_FRAME
    from speechdata.bridge.reader import bridge_dataset, decode_sample, read_sample_at
    from speechdata.io.storage import DataRoot
    from speechdata.vad.language_index import build_urls
    from speechdata.vad.loader import VadChunkDataset, collate_chunks, vad_chunk_loader
