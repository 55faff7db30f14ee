"""The feature stages' own reads and writes for one shard, with the model's work taken out.

A shard of ``utterances`` utterances of ``seconds`` s is written by
:func:`speechdata.testing.packing_inputs.write_packing_inputs` (frame grids and the 24 kHz audio
container at production sizes, audio stored pcm16 as ingest stores it). Then, each from a dropped
page cache (the files were just written; a GPU node reads them from storage):

* ``read_s``: the stage's input reads alone, through the calls the stage makes: Qwen reads the
  frame grids' ``utt_id, tokens, n_samples``; WavLM the grids' ``utt_id, n_frames`` and decodes every
  utterance of the audio container (``iter_container_audio``);
* ``stage_s``: the real stage function (``run_qwen_hidden_states`` / ``run_wavlm_features``) with
  the model call replaced by a stand-in that returns float16 matrices of the full models' shapes
  (Qwen ``[tokens, 2048]``, WavLM ``[frames, 1024]``), so the stage's batching, its array store
  writes and its rejects file are real; the stand-in's own time is subtracted;
* ``write_s = stage_s - read_s``: everything the stage does besides reading and computing (the
  array store and rejects writes, atomic renames); 0 where noise puts the stage under its reads.

Each is the median of ``repeats`` (every pass from a dropped page cache); reported per shard and
per audio hour.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

SECONDS_PER_HOUR = 3600.0
QWEN_HIDDEN_SIZE = 2048
WAVLM_HIDDEN_SIZE = 1024
SHARD_ID = "io-probe"


class StandInModelCall:
    """Full-size float16 outputs without a model; counts its own seconds so they can be taken out."""

    def __init__(self, width: int):
        self.width = width
        self.seconds = 0.0
        self._pool = np.random.default_rng(0).standard_normal((4096, width), dtype=np.float32).astype(np.float16)

    def rows(self, count: int) -> np.ndarray:
        reps = -(-count // self._pool.shape[0])
        return np.tile(self._pool, (reps, 1))[:count] if reps > 1 else self._pool[:count].copy()

    def qwen(self, model, token_lists, **kwargs):
        started = time.perf_counter()
        out = [self.rows(len(tokens)) for tokens in token_lists]
        self.seconds += time.perf_counter() - started
        return out

    def wavlm(self, model, audios, n_frames, **kwargs):
        started = time.perf_counter()
        out = [self.rows(n) for n in n_frames]
        self.seconds += time.perf_counter() - started
        return out


@contextmanager
def model_calls_replaced(qwen: StandInModelCall, wavlm: StandInModelCall):
    from speechdata.features import stage

    saved = stage.qwen_hidden_states, stage.wavlm_features
    stage.qwen_hidden_states, stage.wavlm_features = qwen.qwen, wavlm.wavlm
    try:
        yield
    finally:
        stage.qwen_hidden_states, stage.wavlm_features = saved


def _timed(run) -> float:
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def measure_stage_io(work_dir: Path, utterances: int, seconds: float = 8.0, repeats: int = 1) -> dict:
    import torch

    from benchmarks.bench_packing import evict_from_page_cache
    from speechdata.audio.container import iter_container_audio
    from speechdata.features.stage import run_qwen_hidden_states, run_wavlm_features
    from speechdata.io import layout
    from speechdata.io.storage import DataRoot
    from speechdata.testing.packing_inputs import write_packing_inputs

    root = DataRoot(str(work_dir))
    write_packing_inputs(root, SHARD_ID, utterances, seconds=seconds, qwen_dim=QWEN_HIDDEN_SIZE)
    audio_hours = utterances * seconds / SECONDS_PER_HOUR
    grids = layout.frame_grids(SHARD_ID)

    def read_qwen_inputs():
        root.read_parquet(grids, columns=["utt_id", "tokens", "n_samples"])

    def read_wavlm_inputs():
        root.read_parquet(grids, columns=["utt_id", "n_frames"])
        for _ in iter_container_audio(root, layout.normalized_audio(SHARD_ID)):
            pass

    qwen_call, wavlm_call = StandInModelCall(QWEN_HIDDEN_SIZE), StandInModelCall(WAVLM_HIDDEN_SIZE)
    figures = {}
    with model_calls_replaced(qwen_call, wavlm_call):
        for name, read, run, call in (
            ("qwen_hidden_states", read_qwen_inputs,
             lambda: run_qwen_hidden_states(root, SHARD_ID, None, device="cpu", max_batch_tokens=16_384), qwen_call),
            ("wavlm_features", read_wavlm_inputs,
             lambda: run_wavlm_features(root, SHARD_ID, None, device="cpu", dtype=torch.bfloat16, max_batch_s=200.0),
             wavlm_call),
        ):  # fmt: skip
            reads, stages = [], []
            for _ in range(repeats):
                evict_from_page_cache(work_dir)
                reads.append(_timed(read))
                evict_from_page_cache(work_dir)
                call.seconds = 0.0
                stages.append(_timed(run) - call.seconds)
            read_s, stage_s = statistics.median(reads), statistics.median(stages)
            write_s = max(stage_s - read_s, 0.0)
            figures[name] = {
                "read_s": round(read_s, 4),
                "all_read_s": [round(r, 4) for r in reads],
                "all_stage_s_without_model": [round(r, 4) for r in stages],
                "stage_s_without_model": round(stage_s, 4),
                "write_s": round(write_s, 4),
                "read_s_per_audio_hour": round(read_s / audio_hours, 4),
                "write_s_per_audio_hour": round(write_s / audio_hours, 4),
            }
    return {"utterances": utterances, "utterance_s": seconds, "audio_hours": round(audio_hours, 4), **figures}
