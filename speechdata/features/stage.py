"""The feature stages for one shard: Qwen3 hidden states and pooled WavLM features.

Both read the shard's frame grids (which utterances, their tokens and ``F``), process utterances
in bounded chunks, and stream float16 matrices into the shard's array stores. An utterance that
does not fit on the device even alone is a ``gpu_out_of_memory`` reject, never a failed shard.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.accounting.stage import StageSummary
from speechdata.audio.clock import SAMPLE_RATE
from speechdata.audio.container import iter_container_utterances
from speechdata.audio.streamed import StreamedAudio
from speechdata.features.array_store import ARRAY_STORE_PARQUET_OPTIONS, ARRAY_STORE_SCHEMA, ArrayStoreWriter
from speechdata.features.background_writes import BackgroundArrayWrites
from speechdata.features.gpu_batching import ItemTooLarge
from speechdata.features.shard_inputs import QwenShardInputs, WavlmShardInputs, read_qwen_inputs
from speechdata.io import layout
from speechdata.io.faults import fault_point
from speechdata.io.storage import DataRoot

if TYPE_CHECKING:
    import torch

QWEN_STAGE = "qwen_hidden_states"
WAVLM_STAGE = "wavlm_features"
CHUNK_UTTERANCES = 1024
CHUNK_AUDIO_S = 1800.0

Progress = Callable[[int, int, float], None]
"""``(utterances done, total, audio seconds done)``."""

Exclusions = Mapping[str, tuple[str, str]]
"""``{utt_id: (reason, detail)}``: utterances the bridge leaves out before any model sees them
(``speechdata.quality.decisions.excluded_utterances(root, shard, "bridge")``, read by the shard job)."""


def _without_excluded(utt_ids: list[str], excluded: Exclusions, stage: str) -> tuple[list[bool], list[Reject]]:
    """Which grid rows to encode, and a reject (the exclusion's reason) for each row left out."""
    keep = [u not in excluded for u in utt_ids]
    return keep, [Reject(u, stage, *excluded[u]) for u in utt_ids if u in excluded]


def _one_by_one(items, compute, stage: str, rejects: list[Reject]):
    """Retry a chunk item by item after :class:`ItemTooLarge`, so only the item itself is lost."""
    results = []
    for utt_id, item in items:
        try:
            [result] = compute([item])
        except ItemTooLarge as exc:
            rejects.append(Reject(utt_id, stage, "gpu_out_of_memory", str(exc)[:500]))
            result = None
        results.append(result)
    return results


def run_qwen_hidden_states(
    data_root: DataRoot,
    shard_id: str,
    model,
    *,
    device,
    max_batch_tokens: int,
    on_progress: Progress | None = None,
    inputs: QwenShardInputs | None = None,
    excluded: Exclusions | None = None,
) -> StageSummary:
    """Hidden states of every frame-grid utterance not in ``excluded`` (each excluded one a reject).

    ``inputs``: the shard's frame grids already read (a GPU worker's read-ahead); read here when None."""
    # torch loads here, in the step that runs the model, never when the code location is imported.
    from speechdata.features.text import qwen_hidden_states

    started = time.perf_counter()
    grids = (inputs or read_qwen_inputs(data_root, shard_id)).grids
    keep, rejects = _without_excluded(grids["utt_id"].to_pylist(), excluded or {}, QWEN_STAGE)
    utt_ids = [u for u, k in zip(grids["utt_id"].to_pylist(), keep, strict=True) if k]
    tokens = [t for t, k in zip(grids["tokens"].to_pylist(), keep, strict=True) if k]
    seconds = [n / SAMPLE_RATE for n, k in zip(grids["n_samples"].to_pylist(), keep, strict=True) if k]
    done, audio_done = 0, 0.0

    def compute(token_lists):
        return qwen_hidden_states(model, token_lists, device=device, max_batch_tokens=max_batch_tokens)

    with data_root.parquet_writer(
        layout.qwen_hidden_states(shard_id), ARRAY_STORE_SCHEMA, **ARRAY_STORE_PARQUET_OPTIONS
    ) as parquet:
        store = ArrayStoreWriter(parquet)
        with BackgroundArrayWrites(store) as writes:
            for start in range(0, len(utt_ids), CHUNK_UTTERANCES):
                chunk = slice(start, start + CHUNK_UTTERANCES)
                try:
                    states = compute(tokens[chunk])
                except ItemTooLarge:
                    states = _one_by_one(
                        list(zip(utt_ids[chunk], tokens[chunk], strict=True)), compute, QWEN_STAGE, rejects
                    )
                writes.submit([(u, m) for u, m in zip(utt_ids[chunk], states, strict=True) if m is not None])
                fault_point("features")
                done += len(states)
                audio_done += sum(seconds[chunk])
                if on_progress:
                    on_progress(done, len(utt_ids), audio_done)
    data_root.write_parquet(layout.rejects(shard_id, QWEN_STAGE), rejects_table(rejects))
    return StageSummary(
        shard_id,
        grids.num_rows,
        store.count,
        rejects,
        sum(seconds),
        time.perf_counter() - started,
        {
            "hidden_states": data_root.uri(layout.qwen_hidden_states(shard_id)),
            "rejects": data_root.uri(layout.rejects(shard_id, QWEN_STAGE)),
        },
    )


def run_wavlm_features(
    data_root: DataRoot,
    shard_id: str,
    model,
    *,
    device,
    dtype: torch.dtype,
    max_batch_s: float,
    layer: int | None = None,
    layer_weights: list[float] | None = None,
    on_progress: Progress | None = None,
    inputs: WavlmShardInputs | None = None,
    excluded: Exclusions | None = None,
) -> StageSummary:
    """Pooled features of every frame-grid utterance not in ``excluded`` (each excluded one a reject).

    ``inputs``: the shard's frame counts and encoded audio already read (a GPU worker's read-ahead);
    when None the audio streams from the container row group by row group."""
    from speechdata.features.speech import wavlm_features, wavlm_features_streamed

    started = time.perf_counter()
    if inputs is None:
        grids = data_root.read_parquet(layout.frame_grids(shard_id), columns=["utt_id", "n_frames"])
        all_frames = dict(zip(grids["utt_id"].to_pylist(), grids["n_frames"].to_pylist(), strict=True))
    else:
        all_frames = inputs.n_frames
    keep, rejects = _without_excluded(list(all_frames), excluded or {}, WAVLM_STAGE)
    n_frames = {u: f for (u, f), k in zip(all_frames.items(), keep, strict=True) if k}
    audio = _wavlm_audio(data_root, shard_id, inputs, set(n_frames))
    done, audio_done = 0, 0.0

    def compute(items):
        return wavlm_features(
            model,
            [a for a, _ in items],
            [f for _, f in items],
            device=device,
            dtype=dtype,
            layer=layer,
            layer_weights=layer_weights,
            max_batch_s=max_batch_s,
        )

    with data_root.parquet_writer(
        layout.wavlm_features(shard_id), ARRAY_STORE_SCHEMA, **ARRAY_STORE_PARQUET_OPTIONS
    ) as parquet:
        store = ArrayStoreWriter(parquet)
        writes = BackgroundArrayWrites(store)

        def flush(pending: list[tuple[str, np.ndarray]]) -> None:
            nonlocal done, audio_done
            items = [(audio, n_frames[utt_id]) for utt_id, audio in pending]
            try:
                features = compute(items)
            except ItemTooLarge:
                features = _one_by_one(
                    [(u, item) for (u, _), item in zip(pending, items, strict=True)], compute, WAVLM_STAGE, rejects
                )
            writes.submit([(u, m) for (u, _), m in zip(pending, features, strict=True) if m is not None])
            done += len(pending)
            audio_done += sum(a.shape[0] for _, a in pending) / SAMPLE_RATE
            if on_progress:
                on_progress(done, len(n_frames), audio_done)

        def encode_long(utt_id: str, samples: StreamedAudio) -> None:
            """A recording past the whole-decode budget: alone, in windows with context (never whole)."""
            nonlocal done, audio_done
            features = wavlm_features_streamed(
                model, samples, n_frames[utt_id], device=device, dtype=dtype, layer=layer, layer_weights=layer_weights
            )
            writes.submit([(utt_id, features)])
            done += 1
            audio_done += samples.shape[0] / SAMPLE_RATE
            if on_progress:
                on_progress(done, len(n_frames), audio_done)

        pending: list[tuple[str, np.ndarray]] = []
        pending_s = 0.0
        with writes:
            for utt_id, samples, _rate in audio:
                if isinstance(samples, StreamedAudio):
                    encode_long(utt_id, samples)
                    continue
                pending.append((utt_id, samples))
                pending_s += samples.shape[0] / SAMPLE_RATE
                if pending_s >= CHUNK_AUDIO_S:
                    flush(pending)
                    pending, pending_s = [], 0.0
            if pending:
                flush(pending)
    data_root.write_parquet(layout.rejects(shard_id, WAVLM_STAGE), rejects_table(rejects))
    return StageSummary(
        shard_id,
        len(all_frames),
        store.count,
        rejects,
        audio_done,
        time.perf_counter() - started,
        {
            "features": data_root.uri(layout.wavlm_features(shard_id)),
            "rejects": data_root.uri(layout.rejects(shard_id, WAVLM_STAGE)),
        },
    )


def _wavlm_audio(data_root: DataRoot, shard_id: str, inputs: WavlmShardInputs | None, wanted: set[str]):
    """``(utt_id, samples or StreamedAudio, rate)`` of the utterances to encode: streamed from the
    container row group by row group, or from a GPU worker's read-ahead."""
    if inputs is None:
        return iter_container_utterances(data_root, layout.normalized_audio(shard_id), wanted)
    # The read-ahead holds every utterance's audio; an excluded one never reaches the model.
    return (item for item in inputs.iter_audio() if item[0] in wanted)


def check_feature_shapes(
    data_root: DataRoot, relative: str, expected_rows: dict[str, int], dim: int
) -> dict[str, list[str]]:
    """Utterances failing each feature check: row count, width, finiteness (dtype is float16 by construction)."""
    from speechdata.features.array_store import iter_arrays

    failures: dict[str, list[str]] = {"shape_matches_frame_grid": [], "finite": [], "float16": []}
    for utt_id, matrix in iter_arrays(data_root, relative):
        if matrix.shape != (expected_rows.get(utt_id, -1), dim):
            failures["shape_matches_frame_grid"].append(utt_id)
        if matrix.dtype != np.float16:
            failures["float16"].append(utt_id)
        if not np.isfinite(matrix).all():
            failures["finite"].append(utt_id)
    return failures
