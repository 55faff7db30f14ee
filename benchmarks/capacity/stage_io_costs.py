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
* ``write_s``: inside that stage run, the seconds spent writing: the array store's ``add`` and
  ``flush`` (where row groups go to disk), opening and closing its parquet writer (the atomic
  rename), and the rejects file.

Each is the median of ``repeats`` (every pass from a dropped page cache); reported per shard and
per audio hour.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from benchmarks.report import timed_call

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


class WriteClock:
    """Seconds the stage spends writing: its array store's ``add``/``flush`` (row groups go to disk
    there), opening and closing (atomic rename) its parquet writer, and its whole-table writes."""

    def __init__(self):
        self.seconds = 0.0

    @contextmanager
    def timing(self):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - started

    def timed_data_root(self, root: str):
        from speechdata.io.storage import DataRoot

        clock = self

        class WriteTimedDataRoot(DataRoot):
            @contextmanager
            def parquet_writer(self, relative, schema, **options):
                with clock.timing():
                    writer = super().parquet_writer(relative, schema, **options)
                    handle = writer.__enter__()
                try:
                    yield handle
                except BaseException as error:
                    writer.__exit__(type(error), error, error.__traceback__)
                    raise
                with clock.timing():
                    writer.__exit__(None, None, None)

            def write_parquet(self, relative, table, **options):
                with clock.timing():
                    super().write_parquet(relative, table, **options)

        return WriteTimedDataRoot(root)

    def store_writer_class(self):
        from speechdata.features.array_store import ArrayStoreWriter

        clock = self

        class WriteTimedArrayStoreWriter(ArrayStoreWriter):
            def add(self, utt_id, matrix):
                with clock.timing():
                    super().add(utt_id, matrix)

            def flush(self):
                with clock.timing():
                    super().flush()

        return WriteTimedArrayStoreWriter


@contextmanager
def stage_instrumented(qwen: StandInModelCall, wavlm: StandInModelCall, clock: WriteClock):
    """The stage module's model calls replaced by the stand-ins, and its store writer timed.

    The stage imports its model calls when it runs (so the code location loads no torch): they are
    replaced in the modules it imports them from."""
    from speechdata.features import speech, stage, text

    saved = text.qwen_hidden_states, speech.wavlm_features, stage.ArrayStoreWriter
    text.qwen_hidden_states, speech.wavlm_features = qwen.qwen, wavlm.wavlm
    stage.ArrayStoreWriter = clock.store_writer_class()
    try:
        yield
    finally:
        text.qwen_hidden_states, speech.wavlm_features, stage.ArrayStoreWriter = saved


def measure_stage_io(work_dir: Path, utterances: int, seconds: float = 8.0, repeats: int = 1) -> dict:
    import torch

    from benchmarks.stages.bench_packing import evict_from_page_cache
    from speechdata.audio.container import iter_container_audio
    from speechdata.features.stage import run_qwen_hidden_states, run_wavlm_features
    from speechdata.io import layout
    from speechdata.testing.packing_inputs import write_packing_inputs

    clock = WriteClock()
    root = clock.timed_data_root(str(work_dir))
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
    with stage_instrumented(qwen_call, wavlm_call, clock):
        for name, read, run, call in (
            ("qwen_hidden_states", read_qwen_inputs,
             lambda: run_qwen_hidden_states(root, SHARD_ID, None, device="cpu", max_batch_tokens=16_384), qwen_call),
            ("wavlm_features", read_wavlm_inputs,
             lambda: run_wavlm_features(root, SHARD_ID, None, device="cpu", dtype=torch.bfloat16, max_batch_s=200.0),
             wavlm_call),
        ):  # fmt: skip
            reads, stages, writes = [], [], []
            for _ in range(repeats):
                evict_from_page_cache(work_dir)
                reads.append(timed_call(read)[0])
                evict_from_page_cache(work_dir)
                call.seconds = clock.seconds = 0.0
                stages.append(timed_call(run)[0] - call.seconds)
                writes.append(clock.seconds)
            read_s, stage_s, write_s = (statistics.median(x) for x in (reads, stages, writes))
            figures[name] = {
                "read_s": round(read_s, 4),
                "all_read_s": [round(r, 4) for r in reads],
                "all_stage_s_without_model": [round(r, 4) for r in stages],
                "all_write_s": [round(r, 4) for r in writes],
                "stage_s_without_model": round(stage_s, 4),
                "write_s": round(write_s, 4),
                "read_s_per_audio_hour": round(read_s / audio_hours, 4),
                "write_s_per_audio_hour": round(write_s / audio_hours, 4),
            }
    return {"utterances": utterances, "utterance_s": seconds, "audio_hours": round(audio_hours, 4), **figures}
