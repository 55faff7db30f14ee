"""Land a long recording with its transcript and its aligner's word and segment rows, in seconds.

The products that publish a long recording as its aligned segments (the ASR FLACs and manifests, the
Hugging Face dataset) read only the landed file, the utterance index and the ``alignments`` stage's
``segment`` rows. This writes exactly those, without running a model: each "word" is a short tone
burst at a known time (louder and higher for later words, so a segment cut at the wrong offset holds
other samples), and the word and segment rows are what the aligner would record for them
(:func:`speechdata.alignment.segmentation.cut_segments`). Seeded: the same arguments write the same
bytes.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pyarrow as pa
import soundfile as sf

from speechdata.alignment.segmentation import MAX_SEGMENT_MS, cut_segments
from speechdata.alignment.table import TimedUnit, alignment_rows, alignments_table
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.mark import mark_landed
from speechdata.testing.shards import load_clips

SOURCE_RATE = 22_050
"""Not the products' rates: every cut is resampled."""

ALIGNED_JSON_COLUMNS = {
    "human_text": pa.string(),
    "asr_text": pa.string(),
    "cer": pa.float64(),
    "video_id": pa.string(),
    "transcript_id": pa.string(),
    "transcript_start_idx": pa.int32(),
    "transcript_end_idx": pa.int32(),
}
"""The aligned-JSON fields a shard meant for the Hugging Face dataset lands (its ``extra`` columns)."""


def timed_words(seconds: float, seed: int) -> list[TimedUnit]:
    """Words of 0.3-0.5 s, 0.1-0.3 s apart, with a 1 s pause every 12 to 20 words (a sentence)."""
    rng = np.random.default_rng(seed)
    words, position_ms, until_pause = [], 500, int(rng.integers(12, 21))
    while position_ms < seconds * 1000 - 1500:
        length = int(rng.integers(300, 501))
        words.append(TimedUnit(f"w{len(words)}", position_ms, position_ms + length))
        until_pause -= 1
        gap = 1000 if until_pause == 0 else int(rng.integers(100, 301))
        until_pause = until_pause or int(rng.integers(12, 21))
        position_ms += length + gap
    return words


def tone_bursts(words: list[TimedUnit], seconds: float, rate: int = SOURCE_RATE, seed: int = 0) -> np.ndarray:
    """Mono float32: each word a tone (its own pitch and level) over low noise."""
    rng = np.random.default_rng(seed)
    samples = (0.002 * rng.standard_normal(int(seconds * rate))).astype(np.float32)
    for i, word in enumerate(words):
        first, last = word.start_ms * rate // 1000, word.end_ms * rate // 1000
        t = np.arange(last - first) / rate
        pitch, level = 150 + 3 * (i % 200), 0.05 + 0.4 * ((i * 37) % 100) / 100
        samples[first:last] += (level * np.sin(2 * np.pi * pitch * t)).astype(np.float32)
    return samples


def land_long_recording_shard(
    data_root: DataRoot,
    shard_id: str,
    *,
    seconds: float = 150.0,
    unaligned_seconds: float = 90.0,
    short_utterances: int = 2,
    country: str | None = None,
    language: str = "en",
    aligned_json: bool = False,
    seed: int = 0,
) -> dict[str, list[TimedUnit]]:
    """Land ``shard_id``: ``talk`` (``seconds`` long, aligned: word and segment rows), ``lecture``
    (``unaligned_seconds``, no alignment) and ``short_utterances`` clips of 4 s (aligned words, no
    segments: no longer than one training sample). ``aligned_json``: also the aligned-JSON fields
    (one ``video_id`` per file), so the shard feeds the Hugging Face dataset. Returns the words of
    every aligned utterance. ``raw_shards`` is left to the caller."""
    files: dict[str, np.ndarray] = {}
    words: dict[str, list[TimedUnit]] = {}
    plan = [("talk", seconds, True), ("lecture", unaligned_seconds, False)]
    plan += [(f"clip{i:02d}", 4.0, True) for i in range(short_utterances)]
    rows = []
    for k, (utt_id, length, aligned) in enumerate(plan):
        spoken = timed_words(length, seed + k)
        files[f"{utt_id}.flac"] = tone_bursts(spoken, length, seed=seed + k)
        text = " ".join(w.text for w in spoken)
        row = {
            "utt_id": utt_id,
            "audio_path": f"{utt_id}.flac",
            "text": text,
            "language": language,
            "country": country,
            "start_s": None,
            "end_s": None,
            "source": "long-recording-fixture",
            "recording_id": f"rec-{utt_id}",
        }
        if aligned_json:
            row.update(
                human_text=text,
                asr_text=text,
                cer=0.0,
                video_id=f"vid-{utt_id}",
                transcript_id="t0",
                transcript_start_idx=0,
                transcript_end_idx=len(text),
            )
        rows.append(row)
        if aligned:
            words[utt_id] = spoken
    for path, samples in files.items():
        buffer = io.BytesIO()
        sf.write(buffer, samples, SOURCE_RATE, format="FLAC", subtype="PCM_16")
        data_root.write_bytes(f"{layout.landing_audio_dir(shard_id)}/{path}", buffer.getvalue())
    schema = pa.schema(
        [
            ("utt_id", pa.string()),
            ("audio_path", pa.string()),
            ("text", pa.string()),
            ("language", pa.string()),
            ("country", pa.string()),
            ("start_s", pa.float64()),
            ("end_s", pa.float64()),
            ("source", pa.string()),
            ("recording_id", pa.string()),
            *(ALIGNED_JSON_COLUMNS.items() if aligned_json else []),
        ]
    )
    data_root.write_parquet(layout.landing_metadata(shard_id), pa.Table.from_pylist(rows, schema=schema))
    mark_landed(data_root, shard_id)
    write_alignments(data_root, shard_id, words, {utt_id: length for utt_id, length, _ in plan})
    return words


def write_alignments(
    data_root: DataRoot, shard_id: str, words: dict[str, list[TimedUnit]], seconds: dict[str, float]
) -> None:
    """The ``alignments`` stage's rows for ``words``: every word, and the segments of an utterance
    longer than one training sample, cut as the stage cuts them."""
    rows = []
    for utt_id, spoken in sorted(words.items()):
        rows += alignment_rows(utt_id, "word", spoken)
        duration_ms = int(seconds[utt_id] * 1000)
        if duration_ms > MAX_SEGMENT_MS:
            rows += alignment_rows(utt_id, "segment", cut_segments(spoken, duration_ms))
    data_root.write_parquet(layout.alignments(shard_id), alignments_table(rows))


@dataclasses.dataclass(frozen=True)
class ClipTalk:
    """A recording of the English sample clips one after another: what each clip says, where it lies
    (first and last sample), and the recording's rate and length in samples."""

    texts: list[str]
    spans: list[tuple[int, int]]
    sample_rate: int
    n_samples: int

    @property
    def transcript(self) -> str:
        return " ".join(self.texts)

    def timed_words(self) -> list[TimedUnit]:
        """Each clip's words spread evenly over the clip (a benchmark's reference times)."""
        timed = []
        for text, (first, last) in zip(self.texts, self.spans, strict=True):
            spoken = text.split()
            step = (last - first) / len(spoken)
            timed += [
                TimedUnit(
                    word,
                    int((first + i * step) * 1000 / self.sample_rate),
                    int((first + (i + 1) * step) * 1000 / self.sample_rate),
                )
                for i, word in enumerate(spoken)
            ]
        return timed


def write_clip_talk(path: str, seconds: float, gap_s: float = 0.4) -> ClipTalk:
    """Write, as 16-bit WAV at ``path``, real speech at least ``seconds`` long: the English sample clips
    of one rate in turn, each after ``gap_s`` of silence, written a clip at a time (hours of it never
    sit in memory)."""
    english = [c for c in load_clips() if c.language == "en"]
    rate = english[0].sample_rate
    clips = [c for c in english if c.sample_rate == rate and c.samples.ndim == 1]
    gap = np.zeros(int(gap_s * rate), np.float32)
    texts, spans, frames = [], [], 0
    with sf.SoundFile(path, "w", rate, 1, "PCM_16") as out:
        while frames < seconds * rate:
            clip = clips[len(texts) % len(clips)]
            out.write(gap)
            out.write(clip.samples)
            spans.append((frames + gap.size, frames + gap.size + clip.samples.shape[0]))
            frames += gap.size + clip.samples.shape[0]
            texts.append(clip.text)
    return ClipTalk(texts, spans, rate, frames)
