"""The ``alignments`` shard job for the GPU workers: the CTC models stay loaded on the worker.

The job's "model" is the aligner resource rebuilt from its fields; each language's CTC model is
loaded the first time a shard needs it and kept for the worker process's life
(``resources.aligner``'s per-process cache), so later shards and runs on that worker load nothing.
"""

from __future__ import annotations

import json
from functools import partial

from resources.aligner import CtcAlignerResource
from resources.gpu_worker import Progress, ShardJob, inputs_unchanged, no_inputs
from speechdata.alignment.log_probs import CTC_FRAME_S
from speechdata.alignment.stage import run_alignments
from speechdata.io.storage import DataRoot
from speechdata.stage import StageSummary


def alignment_shard_job(data_root: DataRoot, aligner: CtcAlignerResource, write_ctm_files: bool) -> ShardJob:
    fields = aligner.model_dump()
    return ShardJob(
        model_key=f"alignments:{json.dumps(fields, sort_keys=True)}",
        load_model=partial(build_aligner, fields),
        read_inputs=no_inputs,
        inputs_current=inputs_unchanged,
        run=partial(align_shard, data_root, write_ctm_files),
    )


def build_aligner(fields: dict) -> CtcAlignerResource:
    return CtcAlignerResource(**fields)


def align_shard(
    data_root: DataRoot,
    write_ctm_files: bool,
    aligner: CtcAlignerResource,
    shard_id: str,
    _inputs: None,
    on_progress: Progress | None,
) -> StageSummary:
    return run_alignments(
        data_root,
        shard_id,
        aligner.aligner_for,
        settings=aligner.log_prob_settings(CTC_FRAME_S),
        write_ctm_files=write_ctm_files,
        on_progress=on_progress,
    )
