"""The ``frame_grids`` stage for one shard: text tokens, their spans and the 12.5 Hz grid.

Reads the utterance index (transcripts), the alignments table (word spans) and the audio container
(sample counts), and writes one row per utterance with ``tokens``, ``grid`` and ``dur`` as int32
lists. Utterances without a word alignment were rejected upstream and are not repeated here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.accounting.stage import StageSummary
from speechdata.alignment.pseudo_labels import with_text_sources
from speechdata.alignment.table import words_by_utterance
from speechdata.audio.clock import SAMPLE_RATE
from speechdata.bridge.frame_grid import GridError, build_frame_grid, n_frames_for
from speechdata.bridge.text_tokens import tokenize_many
from speechdata.io import layout
from speechdata.io.storage import DataRoot

STAGE = "frame_grids"

FRAME_GRIDS_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("n_samples", pa.int64(), nullable=False),
        pa.field("n_frames", pa.int32(), nullable=False),
        pa.field("n_tokens", pa.int32(), nullable=False),
        pa.field("silence_frames", pa.int32(), nullable=False),
        pa.field("zero_duration_tokens", pa.int32(), nullable=False),
        pa.field("tokens", pa.list_(pa.int32()), nullable=False),
        pa.field("grid", pa.list_(pa.int32()), nullable=False),
        pa.field("dur", pa.list_(pa.int32()), nullable=False),
        pa.field("token_start_ms", pa.list_(pa.int32()), nullable=False),
        pa.field("token_end_ms", pa.list_(pa.int32()), nullable=False),
    ]
)


@dataclass(frozen=True, kw_only=True)
class FrameGridSummary(StageSummary):
    """The stage's summary, with the shard's token and frame totals over the grids written."""

    tokens: int
    zero_duration_tokens: int
    frames: int
    silence_frames: int

    @property
    def zero_duration_token_share(self) -> float:
        return self.zero_duration_tokens / self.tokens if self.tokens else 0.0

    @property
    def silence_frame_share(self) -> float:
        return self.silence_frames / self.frames if self.frames else 0.0


def run_frame_grids(data_root: DataRoot, shard_id: str, tokenizer) -> FrameGridSummary:
    started = time.perf_counter()
    # An utterance landed without text was aligned to the aligner's pseudo-label: its grid spells that.
    index = with_text_sources(
        data_root, shard_id, data_root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id", "text"])
    )
    texts = dict(zip(index["utt_id"].to_pylist(), index["text"].to_pylist(), strict=True))
    words = words_by_utterance(data_root.read_parquet(layout.alignments(shard_id)))
    audio = data_root.read_parquet(layout.normalized_audio(shard_id), columns=["utt_id", "n_samples"])
    samples = dict(zip(audio["utt_id"].to_pylist(), audio["n_samples"].to_pylist(), strict=True))
    scored = data_root.read_parquet(layout.alignment_scores(shard_id), columns=["utt_id"])["utt_id"].to_pylist()

    utt_ids = sorted(scored)
    tokenized = tokenize_many(tokenizer, [texts.get(u) or "" for u in utt_ids])
    rows: list[dict] = []
    rejects: list[Reject] = []
    for utt_id, tokens in zip(utt_ids, tokenized, strict=True):
        if utt_id not in samples:
            rejects.append(Reject(utt_id, STAGE, "no_normalized_audio", "aligned but missing from audio_24k.parquet"))
            continue
        try:
            grid = build_frame_grid(
                texts.get(utt_id) or "", words.get(utt_id, []), tokens.ids, tokens.offsets, samples[utt_id]
            )
        except GridError as exc:
            rejects.append(Reject(utt_id, STAGE, exc.reason, str(exc)))
            continue
        rows.append(
            {
                "utt_id": utt_id,
                "n_samples": samples[utt_id],
                "n_frames": grid.n_frames,
                "n_tokens": grid.n_tokens,
                "silence_frames": grid.silence_frames,
                "zero_duration_tokens": grid.zero_duration_tokens,
                "tokens": grid.tokens.tolist(),
                "grid": grid.grid.tolist(),
                "dur": grid.dur.tolist(),
                "token_start_ms": grid.spans_ms[:, 0].tolist(),
                "token_end_ms": grid.spans_ms[:, 1].tolist(),
            }
        )
    table = pa.Table.from_pylist(rows, schema=FRAME_GRIDS_SCHEMA)
    data_root.write_parquet(layout.frame_grids(shard_id), table)
    data_root.write_parquet(layout.rejects(shard_id, STAGE), rejects_table(rejects))
    return FrameGridSummary(
        shard_id=shard_id,
        rows_in=len(utt_ids),
        rows_out=len(rows),
        rejects=rejects,
        audio_seconds=sum(r["n_samples"] for r in rows) / SAMPLE_RATE,
        compute_seconds=time.perf_counter() - started,
        outputs={
            "frame_grids": data_root.uri(layout.frame_grids(shard_id)),
            "rejects": data_root.uri(layout.rejects(shard_id, STAGE)),
        },
        tokens=sum(r["n_tokens"] for r in rows),
        zero_duration_tokens=sum(r["zero_duration_tokens"] for r in rows),
        frames=sum(r["n_frames"] for r in rows),
        silence_frames=sum(r["silence_frames"] for r in rows),
    )


@dataclass(frozen=True)
class GridCheckFailures:
    """Utterance ids failing each of the blocking frame-grid checks."""

    frames_accounted: list[str]
    monotone: list[str]
    frame_count: list[str]
    token_count: list[str]


def verify_frame_grids(table: pa.Table, texts: dict[str, str], tokenizer) -> GridCheckFailures:
    """Re-check a written frame-grid table: invariants, ``F == ceil(samples/1920)``, ``T`` = tokenizer's."""
    rows = table.to_pylist()
    retokenized = tokenize_many(tokenizer, [texts.get(r["utt_id"]) or "" for r in rows])
    failures = GridCheckFailures([], [], [], [])
    for row, tokens in zip(rows, retokenized, strict=True):
        grid = np.asarray(row["grid"], dtype=np.int64)
        dur = np.asarray(row["dur"], dtype=np.int64)
        if int(dur.sum()) + int(np.count_nonzero(grid == -1)) != grid.size:
            failures.frames_accounted.append(row["utt_id"])
        owned = grid[grid != -1]
        if owned.size and np.any(np.diff(owned) < 0):
            failures.monotone.append(row["utt_id"])
        if grid.size != n_frames_for(row["n_samples"]) or grid.size != row["n_frames"]:
            failures.frame_count.append(row["utt_id"])
        if len(row["tokens"]) != len(tokens.ids) or row["tokens"] != tokens.ids:
            failures.token_count.append(row["utt_id"])
    return failures
