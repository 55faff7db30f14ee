"""The ``streaming_segments`` stage for one shard: aligned words + LLM chunks -> bilingual segments.

Reads the shard's alignments table (NeMo alignments, or MFA TextGrids imported by the
``alignments`` stage), its utterance index (transcripts) and the segmentation JSONs landed at
``landing/<shard>/segmentation/<utt_id>.json``. Writes one bilingual segment document (JSON) per utterance,
one segments table for the shard, and the ``streaming_segments`` rejects ledger. Every aligned
utterance ends up in exactly one of: segments written, or rejected with a reason.
"""

from __future__ import annotations

import json
import posixpath
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.accounting.stage import StageSummary
from speechdata.alignment.pseudo_labels import TEXT_SOURCE_LANDED, with_text_sources
from speechdata.alignment.table import words_by_utterance
from speechdata.audio.container import read_container_index
from speechdata.io import layout
from speechdata.io.bounded_json import JsonBoundsError, read_bounded_json_bytes
from speechdata.io.storage import DataRoot
from speechdata.translation.segmentation_input import LATENCY_LEVELS, SegmentationError, read_segmentation
from speechdata.translation.segments import (
    DEFAULT_MAX_SKIP_WORDS,
    DEFAULT_STEP_MS,
    LevelSegments,
    utterance_document,
    utterance_segments,
)

STAGE = "streaming_segments"

SEGMENTS_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("latency", pa.string(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=False),
        pa.field("emit_ms", pa.int32(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("target", pa.string(), nullable=False),
        pa.field("first_chunk", pa.int32(), nullable=False),
        pa.field("last_chunk", pa.int32(), nullable=False),
        pa.field("n_unmatched_chunks", pa.int32(), nullable=False),
        pa.field("text_source", pa.string()),
    ]
)
"""One row per emitted segment; ``emit_ms`` is the start of the second it is emitted at; ``text_source``
says whether the utterance's text (and so its aligned words) landed or is the aligner's pseudo-label."""


@dataclass(frozen=True)
class SegmentSettings:
    """How segments are built and which utterances are used.

    ``allowed_ids``: only these utterances (None: all). ``min_alignment_score``: only utterances
    whose alignment score (mean frame log-prob, ``alignment_scores.parquet``) is at least this;
    imported alignments have no score and do not pass a threshold.
    """

    step_ms: int = DEFAULT_STEP_MS
    max_skip_words: int = DEFAULT_MAX_SKIP_WORDS
    allowed_ids: frozenset[str] | None = None
    min_alignment_score: float | None = None


@dataclass
class LevelTotals:
    """Per latency level: chunks, chunks without times, segments."""

    chunks: Counter = field(default_factory=Counter)
    unmatched: Counter = field(default_factory=Counter)
    segments: Counter = field(default_factory=Counter)

    def add(self, level: str, result: LevelSegments) -> None:
        self.chunks[level] += len(result.timings)
        self.unmatched[level] += result.n_unmatched
        self.segments[level] += len(result.segments)

    def unmatched_share(self) -> dict[str, float]:
        return {
            lvl: round(self.unmatched[lvl] / self.chunks[lvl], 6) if self.chunks[lvl] else 0.0 for lvl in LATENCY_LEVELS
        }


def segment_rows(utt_id: str, levels: dict[str, LevelSegments]) -> list[dict]:
    return [
        {
            "utt_id": utt_id,
            "latency": level,
            "segment_index": k,
            "emit_ms": s.emit_ms,
            "source": s.source,
            "target": s.target,
            "first_chunk": s.first_chunk,
            "last_chunk": s.last_chunk,
            "n_unmatched_chunks": s.n_unmatched,
        }
        for level, result in levels.items()
        for k, s in enumerate(result.segments)
    ]


def _filter_reject(utt_id: str, score: float | None, settings: SegmentSettings) -> Reject | None:
    if settings.allowed_ids is not None and utt_id not in settings.allowed_ids:
        return Reject(utt_id, STAGE, "not_in_allowed_ids", "the utterance is not in the configured allowed_ids")
    threshold = settings.min_alignment_score
    if threshold is not None and (score is None or score < threshold):
        return Reject(utt_id, STAGE, "alignment_score_below_threshold", f"alignment score {score} < {threshold}")
    return None


def _landed_segmentation_files(data_root: DataRoot, shard_id: str) -> set[str]:
    """File names in the segmentation directory, listed once (not one existence check per utterance)."""
    directory = layout.landing_segmentation_dir(shard_id)
    if not data_root.exists(directory):
        return set()
    return {posixpath.basename(p) for p in data_root.fs.find(data_root.path(directory))}


@dataclass(frozen=True, kw_only=True)
class StreamingSegmentsSummary(StageSummary):
    """The stage's summary, with its chunk and segment counts per latency level."""

    level_totals: LevelTotals


def _remove_json_of_others(data_root: DataRoot, shard_id: str, kept_utt_ids: set[str]) -> None:
    """A re-run replaces the shard's JSONs: none of an utterance it no longer writes may linger."""
    json_dir = data_root.path(posixpath.dirname(layout.streaming_segments_json(shard_id, "x")))
    if not data_root.fs.exists(json_dir):
        return
    for path in data_root.fs.ls(json_dir, detail=False):
        if path.rsplit("/", 1)[-1].removesuffix(".json") not in kept_utt_ids:
            data_root.fs.rm(path)


def run_streaming_segments(
    data_root: DataRoot,
    shard_id: str,
    settings: SegmentSettings = SegmentSettings(),
    excluded: Mapping[str, tuple[str, str]] | None = None,
) -> StreamingSegmentsSummary:
    """Build, write and account for the streaming segments of every aligned utterance of the shard.

    ``excluded``: ``{utt_id: (reason, detail)}`` the translation product leaves out (its quality policy
    and near duplicates, ``speechdata.quality.decisions.excluded_utterances``), each a reject with that reason."""
    started = time.perf_counter()
    scores = data_root.read_parquet(layout.alignment_scores(shard_id), columns=["utt_id", "score"])
    words = words_by_utterance(data_root.read_parquet(layout.alignments(shard_id)))
    # The aligned words of an utterance landed without text spell the aligner's pseudo-label.
    index = with_text_sources(
        data_root, shard_id, data_root.read_parquet(layout.utterance_index(shard_id), columns=["utt_id", "text"])
    )
    texts = dict(zip(index["utt_id"].to_pylist(), index["text"].to_pylist(), strict=True))
    sources = dict(zip(index["utt_id"].to_pylist(), index["text_source"].to_pylist(), strict=True))
    container = read_container_index(data_root, layout.normalized_audio(shard_id))
    durations = dict(zip(container["utt_id"].to_pylist(), container["duration_s"].to_pylist(), strict=True))
    landed = _landed_segmentation_files(data_root, shard_id)
    directory = layout.landing_segmentation_dir(shard_id)
    json_dir = posixpath.dirname(layout.streaming_segments_json(shard_id, "x"))

    rows: list[dict] = []
    rejects: list[Reject] = []
    totals = LevelTotals()
    audio_seconds = 0.0
    written: set[str] = set()
    excluded = excluded or {}
    for utt_id, score in zip(scores["utt_id"].to_pylist(), scores["score"].to_pylist(), strict=True):
        reject = Reject(utt_id, STAGE, *excluded[utt_id]) if utt_id in excluded else None
        reject = reject or _filter_reject(utt_id, score, settings)
        if reject is None and f"{utt_id}.json" not in landed:
            reject = Reject(utt_id, STAGE, "no_segmentation", f"{directory}/{utt_id}.json does not exist")
        if reject is not None:
            rejects.append(reject)
            continue
        path = f"{directory}/{utt_id}.json"
        try:
            with data_root.fs.open(data_root.path(path), "rb") as handle:
                data = read_bounded_json_bytes(handle, data_root.uri(path))  # never a huge file read whole
            segmentation = read_segmentation(data, data_root.uri(path))
        except JsonBoundsError as exc:
            rejects.append(Reject(utt_id, STAGE, "segmentation_over_json_limits", str(exc)))
            continue
        except SegmentationError as exc:
            rejects.append(Reject(utt_id, STAGE, exc.reason, str(exc)))
            continue
        utt_words = words.get(utt_id, [])
        levels = utterance_segments(segmentation, utt_words, settings.step_ms, settings.max_skip_words)
        n_chunks = sum(len(r.timings) for r in levels.values())
        if n_chunks and all(r.n_unmatched == len(r.timings) for r in levels.values()):
            rejects.append(
                Reject(
                    utt_id,
                    STAGE,
                    "no_chunk_matched",
                    f"none of {n_chunks} chunks matches the {len(utt_words)} aligned words",
                )
            )
            continue
        document = utterance_document(utt_id, texts.get(utt_id) or "", levels, settings.step_ms)
        source = sources.get(utt_id, TEXT_SOURCE_LANDED)
        document["text_source"] = source
        data_root.write_bytes(
            layout.streaming_segments_json(shard_id, utt_id), json.dumps(document, ensure_ascii=False).encode()
        )
        rows += [{**row, "text_source": source} for row in segment_rows(utt_id, levels)]
        for level, result in levels.items():
            totals.add(level, result)
        audio_seconds += durations.get(utt_id, 0.0)
        written.add(utt_id)

    data_root.write_parquet(layout.streaming_segments(shard_id), pa.Table.from_pylist(rows, schema=SEGMENTS_SCHEMA))
    # Only once the new table is published: a run that fails earlier leaves every JSON it names in place.
    _remove_json_of_others(data_root, shard_id, written)
    data_root.write_parquet(layout.rejects(shard_id, STAGE), rejects_table(rejects))
    return StreamingSegmentsSummary(
        shard_id=shard_id,
        rows_in=scores.num_rows,
        rows_out=len(written),
        rejects=rejects,
        audio_seconds=audio_seconds,
        compute_seconds=time.perf_counter() - started,
        outputs={
            "segments": data_root.uri(layout.streaming_segments(shard_id)),
            "json_dir": data_root.uri(json_dir),
            "rejects": data_root.uri(layout.rejects(shard_id, STAGE)),
        },
        level_totals=totals,
    )
