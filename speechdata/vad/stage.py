"""The per-shard VAD step: speech segments for every audio file of a shard, as one table.

Files come from the shard's utterance index (so only audio ``raw_shards`` accepted), one row per
file however many utterances it holds. Segments come from the landing zone when the shard brought
them (``landing/<shard>/vad_segments.parquet``: ``audio_path``, ``start_s`` and ``end_s`` lists) and
from Silero VAD for every other file. A file that cannot be decoded becomes one reject per
utterance (stage ``vad_segments``). A shard that landed an ``audio/`` directory gets its files packed
as they are into ``shards/<shard>/audio-<sha16>.tar`` so that every shard has a tar to stream.

The commit keeps every published table pointing at the bytes it describes: the packed tar is named
by its content (a re-pack writes a new name beside the old tar), the segments table that names it
is swapped after it, and a packed tar is removed only when neither the shard's table nor any
language index names it (:mod:`speechdata.vad.tar_retention`). Each row also carries the SHA-1 of
its file's bytes, which the loader checks, so a landed tar replaced by a re-landing is never read
with the segments of the audio it replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
import soundfile as sf

from speechdata.accounting.rejects import Reject, rejects_table
from speechdata.accounting.stage import StageSummary
from speechdata.audio import budget
from speechdata.audio.budget import OVER_BUDGET_REASON, audio_budget_problem
from speechdata.io import faults, layout
from speechdata.io.audio_tars import deterministic_tar_writer, webdataset_key
from speechdata.io.faults import fault_point
from speechdata.io.storage import DataRoot
from speechdata.landing.landed_audio import LandedAudio
from speechdata.vad.chunks import DEFAULT_CHUNK_S, DEFAULT_NUM_CHUNKS, usable_chunk_seconds
from speechdata.vad.long_form import long_file_speech
from speechdata.vad.silero import SpeechSegments, VadParams, detect_speech, to_vad_input
from speechdata.vad.tar_retention import remove_unreferenced_packed_tars

STAGE = "vad_segments"

VAD_SEGMENTS_SCHEMA = pa.schema(
    [
        pa.field("shard", pa.string(), nullable=False),
        pa.field("audio_path", pa.string(), nullable=False),
        pa.field("tar_path", pa.string(), nullable=False),
        pa.field("tar_key", pa.string()),  # null: the file's WebDataset key is taken by another file
        pa.field("language", pa.string()),
        pa.field("utt_ids", pa.list_(pa.string())),
        pa.field("duration_s", pa.float64(), nullable=False),
        pa.field("speech_s", pa.float64(), nullable=False),
        pa.field("n_segments", pa.int32(), nullable=False),
        pa.field("start_s", pa.list_(pa.float64())),
        pa.field("end_s", pa.list_(pa.float64())),
        pa.field("segments_source", pa.string(), nullable=False),  # "silero" or "import"
        pa.field("audio_sha1", pa.string()),  # of the file's bytes, as the tar holds them (null: older tables)
    ]
)


@dataclass(frozen=True)
class AudioFile:
    audio_path: str
    utt_ids: list[str]
    language: str | None
    duration_s: float
    budget_problem: str | None = None
    """Why decoding the whole file would break the per-utterance memory budget (VAD reads a file
    whole), or None; from the index's header figures, so such a file is never read."""


@dataclass(frozen=True, kw_only=True)
class VadSummary(StageSummary):
    """What the VAD step did for one shard. Rows are utterances (in: the index; out: those whose file
    was segmented); ``table`` holds one row per audio file, and ``audio_seconds`` is their length."""

    table: pa.Table
    imported_files: int
    dropped_imported_segments: int

    @property
    def speech_seconds(self) -> float:
        return float(sum(self.table["speech_s"].to_pylist()))

    @property
    def files_not_streamable(self) -> int:
        return self.table["tar_key"].null_count

    def usable_chunk_hours_by_language(
        self, chunk_s: float = DEFAULT_CHUNK_S, num_chunks: int = DEFAULT_NUM_CHUNKS
    ) -> dict[str, float]:
        hours: Counter = Counter()
        for row in self.table.select(["language", "start_s", "end_s"]).to_pylist():
            seconds = usable_chunk_seconds(row["start_s"], row["end_s"], chunk_s, num_chunks)
            hours[row["language"] or "unknown"] += seconds / 3600.0
        return {language: round(h, 6) for language, h in sorted(hours.items())}


def files_of_index(index: pa.Table) -> list[AudioFile]:
    """One entry per distinct ``audio_path``, sorted by path; the language its utterances mostly have."""
    rows: dict[str, dict] = {}
    columns = ["utt_id", "audio_path", "language", "source_frames", "source_sample_rate"]
    columns += ["source_channels"] if "source_channels" in index.column_names else []
    for row in index.select(columns).to_pylist():
        frames, rate = row["source_frames"], row["source_sample_rate"]
        entry = rows.setdefault(
            row["audio_path"],
            {
                "utt_ids": [],
                "languages": Counter(),
                "duration_s": frames / rate,
                "budget_problem": audio_budget_problem(frames, rate, row.get("source_channels") or 1),
            },
        )
        entry["utt_ids"].append(row["utt_id"])
        if row["language"] is not None:
            entry["languages"][row["language"]] += 1
    return [
        AudioFile(
            path,
            sorted(e["utt_ids"]),
            e["languages"].most_common(1)[0][0] if e["languages"] else None,
            e["duration_s"],
            e["budget_problem"],
        )
        for path, e in sorted(rows.items())
    ]


def read_imported_segments(
    data_root: DataRoot, shard_id: str, durations: dict[str, float]
) -> tuple[dict[str, SpeechSegments], int]:
    """Landed segments per known file, cleaned: sorted, clamped to the file, empty ones dropped."""
    if not data_root.exists(layout.landing_vad_segments(shard_id)):
        return {}, 0
    table = data_root.read_parquet(layout.landing_vad_segments(shard_id), columns=["audio_path", "start_s", "end_s"])
    imported: dict[str, SpeechSegments] = {}
    dropped = 0
    for row in table.to_pylist():
        duration = durations.get(row["audio_path"])
        if duration is None:
            continue
        starts, ends = row["start_s"] or [], row["end_s"] or []
        if len(starts) != len(ends):
            raise ValueError(
                f"{data_root.uri(layout.landing_vad_segments(shard_id))}: audio_path {row['audio_path']!r} has "
                f"{len(starts)} start_s and {len(ends)} end_s values: each segment needs both"
            )
        kept = []
        for start, end in zip(starts, ends, strict=True):
            start, end = max(float(start), 0.0), min(float(end), duration)
            if start < end:
                kept.append((start, end))
            else:
                dropped += 1
        kept.sort()
        imported[row["audio_path"]] = SpeechSegments(tuple(s for s, _ in kept), tuple(e for _, e in kept))
    return imported, dropped


def run_vad_segments(
    data_root: DataRoot,
    shard_id: str,
    model,
    params: VadParams = VadParams(),
    *,
    batch_files: int = 64,
    on_progress: Callable[[int, int, float], None] | None = None,
) -> VadSummary:
    """Write ``shards/<shard>/vad_segments.parquet`` and the stage's rejects; pack a tar if needed.

    Order: the packed tar under its content name, then the segments table (the pointer readers
    follow), then the rejects, then packed tars nothing names any more are removed.
    """
    started = time.perf_counter()
    index = data_root.read_parquet(layout.utterance_index(shard_id))
    files = files_of_index(index)
    imported, dropped = read_imported_segments(data_root, shard_id, {f.audio_path: f.duration_s for f in files})
    pack = not data_root.exists(layout.landing_audio_tar(shard_id))
    tar_path = layout.packed_audio_tar_staging(shard_id) if pack else layout.landing_audio_tar(shard_id)

    segments: dict[str, SpeechSegments] = {}
    sha1s: dict[str, str] = {}
    rejects: list[Reject] = []
    done_files, done_s = 0, 0.0
    with contextlib.ExitStack() as stack:
        audio = stack.enter_context(LandedAudio(data_root, shard_id))
        add_to_tar = stack.enter_context(deterministic_tar_writer(data_root, tar_path)) if pack else None
        for batch in _batches(files, batch_files):
            signals, waiting = [], []
            for file in batch:
                long_form = file.budget_problem is not None  # never decoded whole: window by window
                # Past the landed long-form limit ingest stores nothing of it: never read at all.
                limit = min(budget.MAX_LANDED_LONG_FORM_SECONDS, budget.MAX_LONG_FORM_SECONDS)
                if long_form and file.duration_s > limit:
                    detail = (
                        f"{file.audio_path}: {file.duration_s:.1f} s of audio, over the landed long-form limit of "
                        f"{limit:.0f} s (SPEECHDATA_MAX_LANDED_LONG_FORM_SECONDS)"
                    )
                    rejects += [Reject(u, STAGE, OVER_BUDGET_REASON, detail) for u in file.utt_ids]
                    continue
                try:
                    with audio.open(file.audio_path) as handle:
                        data = handle.read()
                    sha1s[file.audio_path] = hashlib.sha1(data).hexdigest()
                    if add_to_tar is not None:
                        add_to_tar(file.audio_path, data)
                        # The staged tar half written under its temp name (outside the commit's points).
                        faults.fault_point("vad-staging")
                    if file.audio_path in imported:
                        segments[file.audio_path] = imported[file.audio_path]
                        continue
                    if long_form:
                        with sf.SoundFile(io.BytesIO(data)) as sound:
                            segments[file.audio_path] = long_file_speech(model, sound, params)
                        continue
                    samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
                    signals.append(to_vad_input(samples, rate))
                    waiting.append(file)
                except Exception as exc:  # any decoder or storage error costs this file only
                    rejects += [Reject(u, STAGE, "audio_unreadable", f"{file.audio_path}: {exc}") for u in file.utt_ids]
            for file, found in zip(waiting, detect_speech(model, signals, params, batch_files), strict=True):
                segments[file.audio_path] = found
            done_files += len(batch)
            done_s += sum(f.duration_s for f in batch)
            if on_progress:
                on_progress(done_files, len(files), done_s)

    if pack:
        tar_path = _name_by_content(data_root, shard_id, tar_path)
    fault_point("vad-tar")  # the new tar is in place; the published table still names the old one
    table = _segments_table(shard_id, tar_path, files, segments, sha1s, set(imported))
    data_root.write_parquet(layout.vad_segments(shard_id), table)
    fault_point("vad-segments")
    data_root.write_parquet(layout.rejects(shard_id, STAGE), rejects_table(rejects))
    remove_unreferenced_packed_tars(data_root, shard_id)
    return VadSummary(
        shard_id=shard_id,
        table=table,
        rows_in=index.num_rows,
        rows_out=sum(len(f.utt_ids) for f in files if f.audio_path in segments),
        rejects=rejects,
        audio_seconds=float(sum(table["duration_s"].to_pylist())),
        compute_seconds=time.perf_counter() - started,
        imported_files=len(set(imported) & set(segments)),
        dropped_imported_segments=dropped,
        outputs={
            "segments": data_root.uri(layout.vad_segments(shard_id)),
            "tar": data_root.uri(tar_path),
            "rejects": data_root.uri(layout.rejects(shard_id, STAGE)),
        },
    )


def _batches(files: list[AudioFile], size: int, max_padded_seconds: float | None = None) -> Iterator[list[AudioFile]]:
    """At most ``size`` files per batch, and at most ``max_padded_seconds`` (default: the per-utterance
    memory budget) of audio once the model pads every file to the batch's longest: 63 short files
    beside one of 30 minutes would otherwise hold 64 x 30 minutes. A file's segments do not depend
    on the files batched with it (the model keeps one state per row)."""
    limit = budget.MAX_UTTERANCE_SECONDS if max_padded_seconds is None else max_padded_seconds
    batch: list[AudioFile] = []
    longest = 0.0
    for file in files:
        padded = (len(batch) + 1) * max(longest, file.duration_s)
        if batch and (len(batch) == size or padded > limit):
            yield batch
            batch, longest = [], 0.0
        batch.append(file)
        longest = max(longest, file.duration_s)
    if batch:
        yield batch


def _name_by_content(data_root: DataRoot, shard_id: str, staged: str) -> str:
    """Move the staged tar to its content name (an existing one holds the same bytes); return that name."""
    digest = hashlib.sha256()
    with data_root.fs.open(data_root.path(staged), "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    named = layout.packed_audio_tar(shard_id, digest.hexdigest())
    if data_root.exists(named):
        data_root.fs.rm(data_root.path(staged))
    else:
        data_root.fs.mv(data_root.path(staged), data_root.path(named))
    return named


def _segments_table(
    shard_id: str,
    tar_path: str,
    files: list[AudioFile],
    segments: dict[str, SpeechSegments],
    sha1s: dict[str, str],
    imported: set[str],
) -> pa.Table:
    rows, keys_seen = [], set()
    for file in files:
        found = segments.get(file.audio_path)
        if found is None:  # rejected
            continue
        key, _ = webdataset_key(file.audio_path)
        # Two files with one WebDataset key would be merged into one sample when streamed.
        tar_key = key if key is not None and key not in keys_seen else None
        keys_seen.add(key)
        rows.append(
            {
                "shard": shard_id,
                "audio_path": file.audio_path,
                "tar_path": tar_path,
                "tar_key": tar_key,
                "language": file.language,
                "utt_ids": file.utt_ids,
                "duration_s": file.duration_s,
                "speech_s": found.speech_s,
                "n_segments": len(found),
                "start_s": list(found.start_s),
                "end_s": list(found.end_s),
                "segments_source": "import" if file.audio_path in imported else "silero",
                "audio_sha1": sha1s[file.audio_path],
            }
        )
    return pa.Table.from_pylist(rows, schema=VAD_SEGMENTS_SCHEMA)
