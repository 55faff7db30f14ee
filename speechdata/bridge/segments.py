"""Segment samples: a long recording is packed as one bridge sample per aligned segment.

A recording longer than :data:`~speechdata.alignment.segmentation.MAX_SEGMENT_MS` (a lecture, a
podcast, a 2-hour audiobook chapter) is one utterance up to the frame grids, but no trainer should
load it as one sample. The ``alignments`` stage cuts it into training-sized ``segment`` rows at its
pauses (:mod:`speechdata.alignment.segmentation`); the bridge packs each segment as a sample of its
own, cut on the Mimi clock from the utterance's stored audio, frame grid and feature matrices
(docs/bridge-tuples.md, "Segment samples"):

* frames ``[first_frame, end_frame)``: the 80 ms frames the segment's ``[start_ms, end_ms)`` touches;
  the audio is their samples (``1920 x first_frame`` on), ``wavlm`` their rows;
* tokens ``[first_token, end_token)``: those whose span's centre lies in those frames; ``qwen`` their
  rows, ``grid`` renumbered from the first (a frame owned by a token outside is silence), ``dur``
  counted again within the segment;
* key ``<utt_id>+<index, 4 digits>``: ``+`` is not a character of an utterance id, and it sorts below
  every one of them, so a recording's segment keys sort together where its own key would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from speechdata.alignment.segmentation import MAX_SEGMENT_MS
from speechdata.audio.clock import FRAME_MS, SAMPLES_PER_FRAME
from speechdata.bridge.frame_grid import SILENCE
from speechdata.io import layout
from speechdata.io.storage import DataRoot

SEGMENT_KEY_SEPARATOR = "+"


def segment_key(utt_id: str, index: int) -> str:
    return f"{utt_id}{SEGMENT_KEY_SEPARATOR}{index:04d}"


def utterance_of_key(key: str) -> str:
    """The landed utterance a bridge key belongs to (itself for an ordinary sample)."""
    return key.split(SEGMENT_KEY_SEPARATOR, 1)[0]


@dataclass(frozen=True)
class SegmentCut:
    """One segment sample of a long utterance, on the Mimi clock."""

    utt_id: str
    index: int
    text: str
    start_ms: int
    end_ms: int
    """The segment's own span (the aligner's: its words padded into the pauses around them)."""
    first_frame: int
    end_frame: int
    first_token: int
    end_token: int

    @property
    def key(self) -> str:
        return segment_key(self.utt_id, self.index)

    @property
    def n_frames(self) -> int:
        return self.end_frame - self.first_frame

    @property
    def n_tokens(self) -> int:
        return self.end_token - self.first_token

    @property
    def offset_ms(self) -> int:
        """Where the sample's audio starts in the utterance's: its times are relative to this."""
        return self.first_frame * FRAME_MS

    def samples(self, n_samples: int) -> slice:
        return slice(self.first_frame * SAMPLES_PER_FRAME, min(self.end_frame * SAMPLES_PER_FRAME, n_samples))


def segment_spans(data_root: DataRoot, shard_id: str) -> dict[str, list[tuple[int, str, int, int]]]:
    """``{utt_id: [(index, text, start_ms, end_ms), ...]}`` of the ``segment`` rows of utterances
    longer than one training sample, in index order."""
    table = data_root.read_parquet(
        layout.alignments(shard_id), columns=["utt_id", "level", "index", "text", "start_ms", "end_ms"]
    )
    table = table.filter(pc.equal(table["level"], "segment"))
    spans: dict[str, list[tuple[int, str, int, int]]] = {}
    for row in table.sort_by([("utt_id", "ascending"), ("index", "ascending")]).to_pylist():
        spans.setdefault(row["utt_id"], []).append((row["index"], row["text"], row["start_ms"], row["end_ms"]))
    return spans


def is_long_form(n_samples: int) -> bool:
    """Packed as segments: longer than the longest training sample the aligner cuts."""
    return n_samples * 1000 > MAX_SEGMENT_MS * (SAMPLES_PER_FRAME * 1000 // FRAME_MS)


def cut_segments_on_the_clock(
    utt_id: str,
    spans: list[tuple[int, str, int, int]],
    n_frames: int,
    token_start_ms: np.ndarray,
    token_end_ms: np.ndarray,
) -> list[SegmentCut]:
    """Each segment's frames and tokens (module docstring); a segment that holds no frame is left out."""
    centres_x2 = np.maximum.accumulate(np.asarray(token_start_ms, np.int64) + np.asarray(token_end_ms, np.int64))
    cuts = []
    for index, text, start_ms, end_ms in spans:
        first_frame = min(max(start_ms, 0) // FRAME_MS, n_frames)
        end_frame = min(-(-end_ms // FRAME_MS), n_frames)
        if end_frame <= first_frame:
            continue
        first_token, end_token = np.searchsorted(
            centres_x2, [2 * first_frame * FRAME_MS, 2 * end_frame * FRAME_MS], side="left"
        ).tolist()
        cuts.append(SegmentCut(utt_id, index, text, start_ms, end_ms, first_frame, end_frame, first_token, end_token))
    return cuts


def cut_grid(cut: SegmentCut, tokens: np.ndarray, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens, grid, dur)`` of the segment: the utterance's, cut and renumbered."""
    owners = np.asarray(grid[cut.first_frame : cut.end_frame], np.int32)
    inside = (owners >= cut.first_token) & (owners < cut.end_token)
    segment_grid = np.where(inside, owners - cut.first_token, SILENCE).astype(np.int32)
    dur = np.bincount(segment_grid[segment_grid >= 0], minlength=cut.n_tokens).astype(np.int32)
    return np.asarray(tokens[cut.first_token : cut.end_token], np.int32), segment_grid, dur


def words_of(cut: SegmentCut, words: list[dict]) -> list[dict]:
    """The utterance's aligned words inside the segment, timed from the sample's first frame."""
    return [
        {"word": w["word"], "start_ms": w["start_ms"] - cut.offset_ms, "end_ms": w["end_ms"] - cut.offset_ms}
        for w in words
        if w["start_ms"] >= cut.start_ms and w["end_ms"] <= cut.end_ms
    ]


def long_form_cuts(data_root: DataRoot, shard_id: str, grids: pa.Table) -> dict[str, list[SegmentCut]]:
    """The segment cuts of every long utterance among ``grids`` (frame-grid rows with ``utt_id``,
    ``n_samples``, ``n_frames``, ``token_start_ms``, ``token_end_ms``)."""
    spans = segment_spans(data_root, shard_id)
    if not spans:
        return {}
    cuts: dict[str, list[SegmentCut]] = {}
    for position, (utt_id, n_samples) in enumerate(
        zip(grids["utt_id"].to_pylist(), grids["n_samples"].to_pylist(), strict=True)
    ):
        if utt_id in spans and is_long_form(n_samples):
            row = grids.slice(position, 1)
            cuts[utt_id] = cut_segments_on_the_clock(
                utt_id,
                spans[utt_id],
                row["n_frames"][0].as_py(),
                row["token_start_ms"][0].values.to_numpy(),
                row["token_end_ms"][0].values.to_numpy(),
            )
    return cuts
