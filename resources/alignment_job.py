"""The ``alignments`` shard job for the GPU workers: the CTC models stay loaded on the worker.

The job's "model" is the aligner resource rebuilt from its fields; each language's CTC model is
loaded the first time a shard needs it and kept for the worker process's life
(``resources.aligner``'s per-process cache), so later shards and runs on that worker load nothing.
The worker reads the next shard's transcripts and 16 kHz audio while the current shard aligns
(``speechdata.alignment.shard_inputs``).
"""

from __future__ import annotations

import json
from functools import partial

from resources.aligner import CtcAlignerResource
from resources.gpu_worker import Progress, ShardJob
from speechdata.accounting.stage import StageSummary
from speechdata.alignment.log_probs import CTC_FRAME_S
from speechdata.alignment.shard_inputs import (
    AlignmentShardInputs,
    alignment_inputs_are_current,
    read_alignment_inputs,
)
from speechdata.alignment.stage import run_alignments
from speechdata.io.storage import DataRoot


def alignment_shard_job(data_root: DataRoot, aligner: CtcAlignerResource, write_ctm_files: bool) -> ShardJob:
    fields = aligner.model_dump()
    return ShardJob(
        model_key=f"alignments:{json.dumps(fields, sort_keys=True)}",
        load_model=partial(build_aligner, fields),
        # Only the configured languages' audio is decoded: the others are rejects without a model.
        read_inputs=partial(read_alignment_shard_inputs, data_root, tuple(sorted(aligner.models))),
        inputs_current=partial(alignment_inputs_are_current, data_root),
        run=partial(align_shard, data_root, write_ctm_files),
    )


def build_aligner(fields: dict) -> CtcAlignerResource:
    return CtcAlignerResource(**fields)


def read_alignment_shard_inputs(data_root: DataRoot, languages: tuple[str, ...], shard_id: str) -> AlignmentShardInputs:
    return read_alignment_inputs(data_root, shard_id, frozenset(languages))


def align_shard(
    data_root: DataRoot,
    write_ctm_files: bool,
    aligner: CtcAlignerResource,
    shard_id: str,
    inputs: AlignmentShardInputs | None,
    on_progress: Progress | None,
) -> StageSummary:
    return run_alignments(
        data_root,
        shard_id,
        aligner.aligner_for,
        settings=aligner.log_prob_settings(CTC_FRAME_S),
        write_ctm_files=write_ctm_files,
        on_progress=on_progress,
        inputs=inputs,
        wildcard=aligner.wildcard_settings(),
    )
