"""Synthetic inputs of the packing stage at any size: index, audio container, feature stores, grids.

For tests (exactness of the one-pass reader against whole-file reads) and ``bench_packing`` (cost
per utterance at production sizes). Audio and feature payloads come from a small pool reused
across keys, so building 20 000 utterances costs writing their bytes, not encoding them; each
payload gets the utterance's number stamped into its first samples (or its first bytes), since
parquet's dictionary encoding would otherwise store the pool once and the files would be a
fraction of a real shard's size. FLAC payloads are encoded per utterance (a stamp would break the
stream). The audio container can be written out of key order, as ingest writes it (by source file
and start time).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from speechdata.alignment.table import TimedUnit, alignment_rows, alignments_table
from speechdata.audio.clock import SAMPLE_RATE, n_frames_for
from speechdata.audio.codec import encode_audio
from speechdata.audio.container import (
    AUDIO_CONTAINER_SCHEMA,
    CONTAINER_PARQUET_OPTIONS,
    AudioContainerWriter,
    EncodedUtterance,
)
from speechdata.bridge.grid_stage import FRAME_GRIDS_SCHEMA
from speechdata.features.array_store import ARRAY_STORE_PARQUET_OPTIONS, ARRAY_STORE_SCHEMA, ArrayStoreWriter
from speechdata.io import layout
from speechdata.io.storage import DataRoot

TOKENS_PER_S = 3.0


def utterance_key(shard_id: str, n: int) -> str:
    return f"{shard_id}-{n:07d}"


def write_packing_inputs(
    data_root: DataRoot,
    shard_id: str,
    count: int,
    *,
    seconds: float = 8.0,
    qwen_dim: int = 2048,
    wavlm_dim: int = 1024,
    codec: str = "pcm16",
    audio_order: str = "sorted",
    amplitude: float = 0.3,
    pool: int = 16,
    seed: int = 0,
) -> list[str]:
    """Write the five inputs of ``iter_bridge_samples`` for ``count`` utterances; return the keys.

    ``audio_order``: ``sorted`` (key order), ``blocks`` (keys reversed within blocks of 50, like
    segment numbers that do not sort as strings), or ``shuffled`` (any order). ``amplitude``: of the
    tones under the noise (0.9 puts samples past half scale, where 16-bit rounding conventions differ).
    """
    rng = np.random.default_rng(seed)
    keys = [utterance_key(shard_id, n) for n in range(count)]
    n_samples = int(seconds * SAMPLE_RATE)
    n_frames = n_frames_for(n_samples)
    n_tokens = max(1, round(seconds * TOKENS_PER_S))
    t = np.arange(n_samples) / SAMPLE_RATE
    audio_pool = [
        (amplitude * np.sin(2 * np.pi * (150 + 40 * p) * t) + 0.02 * rng.standard_normal(n_samples)).astype(np.float32)
        for p in range(pool)
    ]
    pcm_pool = [encode_audio(samples, SAMPLE_RATE, "pcm16") for samples in audio_pool]

    def audio_of(n: int) -> bytes:
        if codec == "pcm16":
            return _stamped(pcm_pool[n % pool], n)
        samples = audio_pool[n % pool].copy()
        samples[:2] = np.frombuffer(n.to_bytes(4, "little"), "<i2") / 32768.0
        return encode_audio(samples, SAMPLE_RATE, codec)

    qwen_pool = [rng.standard_normal((n_tokens, qwen_dim), dtype=np.float32).astype(np.float16) for _ in range(pool)]
    wavlm_pool = [rng.standard_normal((n_frames, wavlm_dim), dtype=np.float32).astype(np.float16) for _ in range(pool)]

    texts = [f"utterance number {n} of the synthetic shard" for n in range(count)]
    data_root.write_parquet(layout.alignments(shard_id), _even_word_alignments(keys, texts, n_samples))
    data_root.write_parquet(
        layout.utterance_index(shard_id),
        pa.table(
            {
                "utt_id": keys,
                "text": texts,
                "language": ["en"] * count,
                "country": ["us"] * count,
                "source": ["synthetic"] * count,
            }
        ),
    )
    order = list(range(count))
    if audio_order == "blocks":
        order = [i for start in range(0, count, 50) for i in reversed(range(start, min(start + 50, count)))]
    elif audio_order == "shuffled":
        order = [int(i) for i in rng.permutation(count)]
    with data_root.parquet_writer(
        layout.normalized_audio(shard_id), AUDIO_CONTAINER_SCHEMA, **CONTAINER_PARQUET_OPTIONS
    ) as parquet:
        container = AudioContainerWriter(parquet)
        for i in order:
            container.add(EncodedUtterance(keys[i], SAMPLE_RATE, n_samples, codec, audio_of(i)))
        container.flush()
    for relative, matrices, key_order in (
        (layout.qwen_hidden_states(shard_id), qwen_pool, range(count)),
        (layout.wavlm_features(shard_id), wavlm_pool, order),  # the WavLM stage follows the container
    ):
        with data_root.parquet_writer(relative, ARRAY_STORE_SCHEMA, **ARRAY_STORE_PARQUET_OPTIONS) as parquet:
            store = ArrayStoreWriter(parquet)
            for i in key_order:
                store.add(keys[i], _stamped(matrices[i % pool], i))
            store.flush()
    grid = np.minimum(np.arange(n_frames) * n_tokens // n_frames, n_tokens - 1).astype(np.int32)
    dur = np.bincount(grid, minlength=n_tokens).astype(np.int32)
    spans = (np.arange(n_tokens) * 1000 * seconds / n_tokens).astype(np.int32)
    data_root.write_parquet(
        layout.frame_grids(shard_id),
        pa.table(
            {
                "utt_id": keys,
                "n_samples": [n_samples] * count,
                "n_frames": [n_frames] * count,
                "n_tokens": [n_tokens] * count,
                "silence_frames": [0] * count,
                "zero_duration_tokens": [0] * count,
                "tokens": [((np.arange(n_tokens) + n) % 151_936).astype(np.int32) for n in range(count)],
                "grid": [grid] * count,
                "dur": [dur] * count,
                "token_start_ms": [spans] * count,
                "token_end_ms": [spans + 1] * count,
            },
            schema=FRAME_GRIDS_SCHEMA,
        ),
    )
    return keys


def _stamped(payload, n: int):
    """``payload`` (bytes or an array) with ``n`` written over its first four bytes: unique per utterance."""
    stamped = bytearray(payload) if isinstance(payload, bytes) else payload.copy()
    view = memoryview(stamped).cast("B") if isinstance(stamped, np.ndarray) else stamped
    view[:4] = n.to_bytes(4, "little")
    return bytes(stamped) if isinstance(payload, bytes) else stamped


def _even_word_alignments(keys: list[str], texts: list[str], n_samples: int) -> pa.Table:
    """Each transcript's words spread evenly over the utterance: what the bridge ``.json`` publishes."""
    duration_ms = n_samples * 1000 // SAMPLE_RATE
    rows: list[dict] = []
    for key, text in zip(keys, texts, strict=True):
        words = text.split()
        step = duration_ms // len(words)
        units = [TimedUnit(word, i * step, (i + 1) * step, 0.0) for i, word in enumerate(words)]
        rows.extend(alignment_rows(key, "word", units))
    return alignments_table(rows)
