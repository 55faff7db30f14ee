"""Turn a shard's validated utterances into 24 kHz mono FLAC, recording what cannot be decoded.

Utterances are decoded grouped by source file (a long recording with many segments is opened
once per task, and only each segment's samples are decoded: every sample of the file once at
most). Memory is bounded by configuration, not by the shard: a task holds at most
:data:`MAX_ROWS_PER_TASK` rows and :data:`MAX_SOURCE_SECONDS_PER_TASK` seconds of source audio, and at
most :data:`TASKS_IN_FLIGHT_PER_WORKER` tasks per worker are submitted or waiting to be written
(docs/performance.md, "Memory bounds"). With ``workers > 1`` tasks are spread over a process pool;
results come back in submission order, so the output is the same whatever the worker count.

Decoded samples are checked for signal before they are stored (:mod:`speechdata.audio.truth`):
NaN, digital silence, channels that cancel in the downmix and heavy clipping are rejects.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from itertools import groupby

import numpy as np
import pyarrow as pa
import soundfile as sf

from speechdata.accounting.rejects import Reject, error_text
from speechdata.audio import budget
from speechdata.audio.budget import OVER_BUDGET_REASON, OverMemoryBudget
from speechdata.audio.codec import (
    DEFAULT_AUDIO_CODEC,
    TARGET_SAMPLE_RATE,
    AudioCodec,
    ResamplerName,
    downmix_to_mono,
    encode_audio_payload,
    read_segment_from,
    resample,
)
from speechdata.audio.container import EncodedUtterance
from speechdata.audio.dc_offset import remove_dc_offset
from speechdata.audio.truth import MAX_CLIPPED_SHARE, clipped_share, clipping_problem, signal_problem, truncation_reject
from speechdata.io.storage import DataRoot
from speechdata.landing.landed_audio import LandedAudio
from speechdata.landing.long_form import normalize_long_segment

STAGE = "normalized_audio"
FILES_PER_TASK = 16
"""At most this many files per task: small files are batched so a task amortises its pickling."""

MAX_ROWS_PER_TASK = 256
"""At most this many utterances per task: a task's results travel back to the writer as one list."""

MAX_SOURCE_SECONDS_PER_TASK = 600.0
"""At most this much source audio per task (one longer utterance makes a task of its own): with the
rows cap, what one task's results can hold (600 s at 24 kHz pcm16 is 29 MB)."""

TASKS_IN_FLIGHT_PER_WORKER = 2
"""Tasks submitted ahead of the writer per worker: enough to keep every worker busy, and the bound
on results waiting in the parent."""


@dataclass(frozen=True)
class SegmentRequest:
    utt_id: str
    audio_path: str
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


SEGMENT_COLUMNS = ("utt_id", "audio_path", "segment_start_s", "segment_end_s")
"""The utterance index's columns normalizing reads (not the transcripts and extras)."""


def segment_requests(index: pa.Table) -> list[SegmentRequest]:
    """The index's utterances ordered by file then start, so each file is opened once."""
    rows = zip(*(index[column].to_pylist() for column in SEGMENT_COLUMNS), strict=True)
    requests = [SegmentRequest(u, p, s, e) for u, p, s, e in rows]
    return sorted(requests, key=lambda r: (r.audio_path, r.start_s, r.utt_id))


def bounded_tasks(
    requests: list[SegmentRequest],
    max_rows: int = MAX_ROWS_PER_TASK,
    max_source_s: float = MAX_SOURCE_SECONDS_PER_TASK,
    max_files: int = FILES_PER_TASK,
) -> Iterator[list[SegmentRequest]]:
    """Consecutive runs of ``requests`` (ordered by file) within the rows, seconds and files caps."""
    task: list[SegmentRequest] = []
    task_s = 0.0
    files = 0
    for request in requests:
        new_file = not task or task[-1].audio_path != request.audio_path
        if task and (
            len(task) >= max_rows or task_s + request.duration_s > max_source_s or (new_file and files >= max_files)
        ):
            yield task
            task, task_s, files = [], 0.0, 0
            new_file = True
        task.append(request)
        task_s += request.duration_s
        files += new_file
    if task:
        yield task


def normalize_segments(
    audio: LandedAudio,
    requests: list[SegmentRequest],
    resampler: ResamplerName = "soxr",
    codec: AudioCodec = DEFAULT_AUDIO_CODEC,
    max_clipped_share: float = MAX_CLIPPED_SHARE,
) -> Iterator[EncodedUtterance | Reject]:
    for audio_path, group in groupby(requests, key=lambda r: r.audio_path):
        group = list(group)
        finished = 0
        try:
            with audio.open(audio_path) as handle, sf.SoundFile(handle) as sound:
                for request in group:
                    yield _normalize_one(sound, request, resampler, codec, max_clipped_share)
                    finished += 1
        except Exception as exc:  # the file would not open (or close): its remaining segments are lost
            for request in group[finished:]:
                yield Reject(request.utt_id, STAGE, "audio_decode_failed", f"{audio_path}: {error_text(exc)}")


def _normalize_one(
    sound: sf.SoundFile,
    request: SegmentRequest,
    resampler: ResamplerName,
    codec: AudioCodec,
    max_clipped_share: float = MAX_CLIPPED_SHARE,
) -> EncodedUtterance | Reject:
    long_form = _long_form_frames(sound, request)
    if isinstance(long_form, Reject):
        return long_form
    if long_form is not None:
        return _normalize_long(sound, request, *long_form, codec, max_clipped_share)
    try:
        samples = read_segment_from(sound, request.start_s, request.end_s)
    except OverMemoryBudget as exc:  # from the header: nothing was decoded
        return Reject(request.utt_id, STAGE, exc.reason, f"{request.audio_path}: {exc}")
    except Exception as exc:
        return Reject(request.utt_id, STAGE, "audio_decode_failed", f"{request.audio_path}: {error_text(exc)}")
    if samples.shape[0] == 0:
        return Reject(request.utt_id, STAGE, "audio_empty", f"{request.audio_path}: no samples decoded")
    truncated = truncation_reject(
        request.utt_id,
        STAGE,
        request.audio_path,
        request.end_s - request.start_s,
        samples.shape[0] / sound.samplerate,
    )
    if truncated is not None:
        return truncated
    mixed = downmix_to_mono(samples)
    problem = signal_problem(samples, mixed)
    share = clipped_share(samples)
    if problem is None:
        problem = clipping_problem(share, max_clipped_share)
    if problem is not None:
        reason, detail = problem
        return Reject(request.utt_id, STAGE, reason, f"{request.audio_path}: {detail}")
    # A constant DC bias is removed here, before resampling, so no product inherits it.
    mixed = remove_dc_offset(mixed, sound.samplerate)
    mono = resample(mixed, sound.samplerate, TARGET_SAMPLE_RATE, resampler)
    return EncodedUtterance(
        request.utt_id,
        TARGET_SAMPLE_RATE,
        int(mono.shape[0]),
        codec,
        encode_audio_payload(mono, TARGET_SAMPLE_RATE, codec),
        clipped_share=float(np.float32(share)),
    )


def _long_form_frames(sound: sf.SoundFile, request: SegmentRequest) -> tuple[int, int] | Reject | None:
    """The segment's ``(first, last)`` frames when it is past the whole-decode budget but within the
    long-form limit (streamed: :mod:`speechdata.landing.long_form`); a reject past the long-form
    limit; None for an utterance decoded whole. From the header: nothing is decoded here."""
    rate = sound.samplerate
    first = int(round(request.start_s * rate))
    last = min(int(round(request.end_s * rate)), sound.frames)
    seconds = max(last - first, 0) / rate if rate > 0 else 0.0
    if seconds <= budget.MAX_UTTERANCE_SECONDS:
        return None
    limit = min(budget.MAX_LANDED_LONG_FORM_SECONDS, budget.MAX_LONG_FORM_SECONDS)
    if seconds > limit:
        return Reject(
            request.utt_id,
            STAGE,
            OVER_BUDGET_REASON,
            f"{request.audio_path}: {seconds:.1f} s of audio, over the landed long-form limit of {limit:.0f} s "
            "(SPEECHDATA_MAX_LANDED_LONG_FORM_SECONDS)",
        )
    return first, last


def _normalize_long(
    sound: sf.SoundFile,
    request: SegmentRequest,
    first: int,
    last: int,
    codec: AudioCodec,
    max_clipped_share: float,
) -> EncodedUtterance | Reject:
    try:
        result = normalize_long_segment(
            sound, request.utt_id, request.audio_path, first, last, codec, STAGE, max_clipped_share
        )
    except Exception as exc:
        return Reject(request.utt_id, STAGE, "audio_decode_failed", f"{request.audio_path}: {error_text(exc)}")
    if isinstance(result, Reject):
        return result
    decoded_s = result.n_samples / TARGET_SAMPLE_RATE
    truncated = truncation_reject(request.utt_id, STAGE, request.audio_path, request.end_s - request.start_s, decoded_s)
    return truncated or result


_worker_audio: LandedAudio | None = None


def _open_worker_audio(data_root: DataRoot, shard_id: str) -> None:
    global _worker_audio
    _worker_audio = LandedAudio(data_root, shard_id)


def _normalize_task(
    requests: list[SegmentRequest], resampler: ResamplerName, codec: AudioCodec, max_clipped_share: float
) -> list[EncodedUtterance | Reject]:
    assert _worker_audio is not None, "worker initializer did not run"
    return list(normalize_segments(_worker_audio, requests, resampler, codec, max_clipped_share))


def normalize_shard(
    data_root: DataRoot,
    shard_id: str,
    index: pa.Table,
    *,
    workers: int = 1,
    resampler: ResamplerName = "soxr",
    codec: AudioCodec = DEFAULT_AUDIO_CODEC,
    on_progress: Callable[[int, int], None] | None = None,
    max_clipped_share: float = MAX_CLIPPED_SHARE,
    max_rows_per_task: int = MAX_ROWS_PER_TASK,
    max_source_seconds_per_task: float = MAX_SOURCE_SECONDS_PER_TASK,
) -> Iterator[EncodedUtterance | Reject]:
    """Yield one :class:`EncodedUtterance` or :class:`Reject` per index row.

    ``on_progress(done, total)`` is called after each task, for logs.
    """
    requests = segment_requests(index)
    total = len(requests)
    tasks = bounded_tasks(requests, max_rows_per_task, max_source_seconds_per_task)
    task_count = sum(1 for _ in bounded_tasks(requests, max_rows_per_task, max_source_seconds_per_task))
    workers = max(1, min(workers or os.cpu_count() or 1, task_count))
    done = 0
    if workers == 1:
        with LandedAudio(data_root, shard_id) as audio:
            for task in tasks:
                yield from normalize_segments(audio, task, resampler, codec, max_clipped_share)
                done += len(task)
                if on_progress:
                    on_progress(done, total)
        return
    # spawn, not fork: the parent may hold torch/thread pools that are unsafe to fork.
    context = multiprocessing.get_context("spawn")
    in_flight: deque[tuple[int, Future]] = deque()
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_open_worker_audio, initargs=(data_root, shard_id)
    ) as pool:
        # ``pool.map`` would submit every task at once and keep every result until it is consumed:
        # memory would grow with the shard. Submitting a bounded window keeps it constant.
        for task in tasks:
            if len(in_flight) >= workers * TASKS_IN_FLIGHT_PER_WORKER:
                done = yield from _drain_oldest(in_flight, done, total, on_progress)
            in_flight.append((len(task), pool.submit(_normalize_task, task, resampler, codec, max_clipped_share)))
        while in_flight:
            done = yield from _drain_oldest(in_flight, done, total, on_progress)


def _drain_oldest(
    in_flight: deque[tuple[int, Future]],
    done: int,
    total: int,
    on_progress: Callable[[int, int], None] | None,
) -> Iterator[EncodedUtterance | Reject]:
    rows, future = in_flight.popleft()
    results = future.result()
    del future  # the future holds the results too: drop it so they go as soon as they are written
    results.reverse()
    while results:  # popped as written, so a written utterance's audio is freed at once
        yield results.pop()
    done += rows
    if on_progress:
        on_progress(done, total)
    return done
