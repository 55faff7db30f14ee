"""Turn a shard's validated utterances into 24 kHz mono FLAC, recording what cannot be decoded.

Utterances are decoded grouped by source file (a long recording with many segments is opened
once, and only each segment's samples are decoded). With ``workers > 1`` groups of files are
spread over a process pool; results come back in submission order, so the output is the same
whatever the worker count.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from itertools import groupby

import pyarrow as pa
import soundfile as sf

from speechdata.audio.codec import (
    DEFAULT_AUDIO_CODEC,
    TARGET_SAMPLE_RATE,
    AudioCodec,
    ResamplerName,
    encode_audio_payload,
    read_segment_from,
    to_target_mono,
)
from speechdata.audio.container import EncodedUtterance
from speechdata.audio.truth import truncation_reject
from speechdata.io.storage import DataRoot
from speechdata.landing.landed_audio import LandedAudio
from speechdata.rejects import Reject, error_text

STAGE = "normalized_audio"
FILES_PER_TASK = 16


@dataclass(frozen=True)
class SegmentRequest:
    utt_id: str
    audio_path: str
    start_s: float
    end_s: float


SEGMENT_COLUMNS = ("utt_id", "audio_path", "segment_start_s", "segment_end_s")
"""The utterance index's columns normalizing reads (not the transcripts and extras)."""


def segment_requests(index: pa.Table) -> list[SegmentRequest]:
    """The index's utterances ordered by file then start, so each file is opened once."""
    rows = zip(*(index[column].to_pylist() for column in SEGMENT_COLUMNS), strict=True)
    requests = [SegmentRequest(u, p, s, e) for u, p, s, e in rows]
    return sorted(requests, key=lambda r: (r.audio_path, r.start_s, r.utt_id))


def normalize_segments(
    audio: LandedAudio,
    requests: list[SegmentRequest],
    resampler: ResamplerName = "soxr",
    codec: AudioCodec = DEFAULT_AUDIO_CODEC,
) -> Iterator[EncodedUtterance | Reject]:
    for audio_path, group in groupby(requests, key=lambda r: r.audio_path):
        group = list(group)
        finished = 0
        try:
            with audio.open(audio_path) as handle, sf.SoundFile(handle) as sound:
                for request in group:
                    yield _normalize_one(sound, request, resampler, codec)
                    finished += 1
        except Exception as exc:  # the file would not open (or close): its remaining segments are lost
            for request in group[finished:]:
                yield Reject(request.utt_id, STAGE, "audio_decode_failed", f"{audio_path}: {error_text(exc)}")


def _normalize_one(
    sound: sf.SoundFile, request: SegmentRequest, resampler: ResamplerName, codec: AudioCodec
) -> EncodedUtterance | Reject:
    try:
        samples = read_segment_from(sound, request.start_s, request.end_s)
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
    mono = to_target_mono(samples, sound.samplerate, TARGET_SAMPLE_RATE, resampler)
    return EncodedUtterance(
        request.utt_id,
        TARGET_SAMPLE_RATE,
        int(mono.shape[0]),
        codec,
        encode_audio_payload(mono, TARGET_SAMPLE_RATE, codec),
    )


_worker_audio: LandedAudio | None = None


def _open_worker_audio(data_root: DataRoot, shard_id: str) -> None:
    global _worker_audio
    _worker_audio = LandedAudio(data_root, shard_id)


def _normalize_task(args: tuple[list[SegmentRequest], str, str]) -> list[EncodedUtterance | Reject]:
    requests, resampler, codec = args
    assert _worker_audio is not None, "worker initializer did not run"
    return list(normalize_segments(_worker_audio, requests, resampler, codec))


def normalize_shard(
    data_root: DataRoot,
    shard_id: str,
    index: pa.Table,
    *,
    workers: int = 1,
    resampler: ResamplerName = "soxr",
    codec: AudioCodec = DEFAULT_AUDIO_CODEC,
    on_progress: Callable[[int, int], None] | None = None,
) -> Iterator[EncodedUtterance | Reject]:
    """Yield one :class:`EncodedUtterance` or :class:`Reject` per index row.

    ``on_progress(done, total)`` is called after each group of files, for logs.
    """
    requests = segment_requests(index)
    total = len(requests)
    by_file = [list(group) for _, group in groupby(requests, key=lambda r: r.audio_path)]
    tasks = [
        [r for group in by_file[i : i + FILES_PER_TASK] for r in group] for i in range(0, len(by_file), FILES_PER_TASK)
    ]
    workers = max(1, min(workers or os.cpu_count() or 1, len(tasks)))
    done = 0
    if workers == 1:
        with LandedAudio(data_root, shard_id) as audio:
            for task in tasks:
                yield from normalize_segments(audio, task, resampler, codec)
                done += len(task)
                if on_progress:
                    on_progress(done, total)
        return
    # spawn, not fork: the parent may hold torch/thread pools that are unsafe to fork.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(
        workers, mp_context=context, initializer=_open_worker_audio, initargs=(data_root, shard_id)
    ) as pool:
        for task, results in zip(tasks, pool.map(_normalize_task, [(t, resampler, codec) for t in tasks]), strict=True):
            yield from results
            done += len(task)
            if on_progress:
                on_progress(done, total)
