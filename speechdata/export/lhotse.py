"""Lhotse Shar of the published samples: cuts, recordings and the 12.5 Hz bridge arrays.

``DIR/shar/`` holds Lhotse's own Shar layout (``lhotse.shar.SharWriter``), one set per shard of
``samples_per_shard`` cuts (``DIR/export.json`` records the export beside it: ``from_shar(in_dir=)``
takes every file of its directory for a field)::

    cuts.000000.jsonl.gz      MonoCut per sample: id <shard>__<key>, one supervision with text,
                              language and the word alignment (supervision.alignment["word"])
    recording.000000.tar      the bridge WAV (24 kHz mono 16-bit), bytes as published
    qwen.000000.tar           float16 [T, H]  (cut.load_qwen())   one row per text token
    tokens.000000.tar         int32 [T]       (cut.load_tokens())
    dur.000000.tar            int32 [T]       (cut.load_dur())    Mimi frames owned by each token
    wavlm.000000.tar          float16 [F, D]  (cut.load_wavlm())  one row per Mimi frame (80 ms)
    grid.000000.tar           int32 [F]       (cut.load_grid())   token index per frame, -1 = silence

Read with ``CutSet.from_shar(in_dir="DIR/shar")``; the arrays load through Lhotse's own
``cut.load_<field>()`` exactly as published. All five are plain ``Array`` fields, not
``TemporalArray``: Mimi has ``F = ceil(n_samples / 1920)`` frames (causal padding) while Lhotse
counts a temporal array's frames by rounding ``duration / frame_shift``, so as a ``TemporalArray``
the last partial frame would be dropped on load. Frame ``k`` of ``wavlm``/``grid`` covers
``[80k, 80k + 80)`` ms of the cut's audio; cut the arrays yourself when you truncate a cut.
Cut ``custom`` carries ``shard``, ``key``, ``country`` and ``alignment_score``.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from speechdata.audio.clock import FRAME_RATE_HZ
from speechdata.export.output import ExportError, Progress, staged_directory, write_record
from speechdata.export.selection import SampleFilter, iter_published_samples, select_published_samples
from speechdata.io.storage import DataRoot

TOKEN_ARRAYS = ("qwen", "tokens", "dur")
FRAME_ARRAYS = ("wavlm", "grid")
SHAR_FIELDS = {"recording": "original", **{name: "numpy" for name in (*TOKEN_ARRAYS, *FRAME_ARRAYS)}}
DEFAULT_SAMPLES_PER_SHARD = 1000
SHAR_DIR = "shar"


@dataclass(frozen=True)
class LhotseExport:
    out_dir: str
    samples: int
    audio_s: float
    shards: int


def sample_to_cut(sample):
    """A ``MonoCut`` for one published sample, with its recording in memory and its arrays attached."""
    from lhotse import Recording, SupervisionSegment
    from lhotse.supervision import AlignmentItem

    cut_id = sample.export_id
    recording = Recording.from_bytes(sample.members["wav"], recording_id=cut_id)
    info = json.loads(sample.members["json"])
    words = [
        AlignmentItem(symbol=w["word"], start=w["start_ms"] / 1000.0, duration=(w["end_ms"] - w["start_ms"]) / 1000.0)
        for w in info.get("words", [])
    ]
    cut = recording.to_cut()
    cut.supervisions = [
        SupervisionSegment(
            id=cut_id,
            recording_id=cut_id,
            start=0.0,
            duration=recording.duration,
            text=sample.row["text"],
            language=sample.row["language"],
            alignment={"word": words},
        )
    ]
    cut.custom = {
        "shard": sample.shard,
        "key": sample.key,
        "country": sample.row["country"],
        "alignment_score": sample.row["alignment_score"],
        "text_source": sample.row["text_source"] or "landed",
        "asr_confidence": sample.row["asr_confidence"],
        "frame_rate_hz": FRAME_RATE_HZ,
    }
    for name in (*TOKEN_ARRAYS, *FRAME_ARRAYS):
        cut = cut.attach_tensor(name, _npy(sample.members[f"{name}.npy"]))
    return cut


def _npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def export_lhotse(
    root: DataRoot,
    out_dir: str,
    selection: SampleFilter = SampleFilter(),
    *,
    samples_per_shard: int = DEFAULT_SAMPLES_PER_SHARD,
    progress: bool = True,
) -> LhotseExport:
    """Write the selected samples as Lhotse Shar in ``out_dir`` (replaced atomically)."""
    from lhotse.shar import SharWriter

    if isinstance(samples_per_shard, bool) or not isinstance(samples_per_shard, int) or samples_per_shard < 1:
        raise ValueError(f"samples_per_shard must be a positive integer, got {samples_per_shard!r}")
    selected = select_published_samples(root, selection)
    if selected.num_rows == 0:
        raise ExportError(f"no published sample in {root.url} matches {selection.as_dict()}")
    meter = Progress("export lhotse", selected.num_rows, interval_s=1.0 if progress else float("inf"))
    with staged_directory(out_dir) as staging:
        (staging / SHAR_DIR).mkdir()
        with SharWriter(str(staging / SHAR_DIR), fields=SHAR_FIELDS, shard_size=samples_per_shard) as writer:
            for sample in iter_published_samples(root, selected):
                writer.write(sample_to_cut(sample))
                meter.advance(sample.row["duration_s"])
            shards = len(writer.output_paths["cuts"])
        write_record(
            staging,
            {
                "format": "lhotse-shar",
                "data_root": root.url,
                "selection": selection.as_dict(),
                "samples": meter.samples,
                "audio_hours": meter.audio_s / 3600,
                "shards": shards,
                "fields": SHAR_FIELDS,
                "shar_dir": SHAR_DIR,
            },
        )
    if progress:
        meter.done()
    return LhotseExport(str(Path(out_dir).absolute()), meter.samples, meter.audio_s, shards)
