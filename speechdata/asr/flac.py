"""Extract a shard's utterances as 16 kHz mono FLAC files for ASR training.

The training job reads one FLAC per utterance from disk, so this writes
``asr/flac/<shard_id>/<utt_id>-<sha16>.flac`` for every indexed utterance: cut to its segment,
downmixed, resampled to 16 kHz, 16-bit. ``<sha16>`` starts the SHA-1 of the PCM samples, so a name
always holds the same samples: a re-run never rewrites the bytes a published manifest points at, it
writes new names. Nothing is removed here; FLACs no table names any more are collected after the
manifests are swapped (:mod:`speechdata.asr.flac_retention`). Output names come from the ``utt_id`` (validated by the landing
contract), never from a tar member name; tar members are audited first
(:mod:`speechdata.io.safe_tar`) and an utterance whose member is unsafe is rejected with the reason.

Alongside, ``shards/<shard_id>/asr_flac.parquet`` lists each file with its duration and a SHA-1 of
its PCM samples (the manifest's audio deduplication key: the same audio, whatever container or
rate it landed in, hashes the same after this normalisation).

A long recording (longer than one training sample, :data:`~speechdata.alignment.segmentation.MAX_SEGMENT_MS`)
that the ``alignments`` stage cut into ``segment`` rows is published as those segments, never as one
file: one FLAC per segment, named and indexed by the bridge's key ``<utt_id>+<index>``, its ``text``
the segment's words (docs/asr-data.md, "Long recordings"). Each segment is read from the landed file
by seeking to it, so the recording is never decoded whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import tarfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import groupby
from typing import IO

import numpy as np
import pyarrow as pa
import soundfile as sf

from speechdata.accounting.rejects import Reject, error_text, rejects_table
from speechdata.accounting.stage import StageSummary
from speechdata.alignment.segmentation import MAX_SEGMENT_MS
from speechdata.audio import budget
from speechdata.audio.budget import OverMemoryBudget
from speechdata.audio.codec import ResamplerName, downmix_to_mono, read_segment_from, resample
from speechdata.audio.dc_offset import remove_dc_offset
from speechdata.audio.truth import truncation_reject
from speechdata.bridge.segments import SEGMENT_KEY_SEPARATOR, segment_key, segment_spans, utterance_of_key
from speechdata.io import layout
from speechdata.io.confinement import confined_landed_shard
from speechdata.io.faults import fault_point
from speechdata.io.safe_tar import TarAudit, UnsafeMember, audit_tar, contained_path
from speechdata.io.storage import DataRoot
from speechdata.landing.landed_audio import AudioNotFound, LandedAudio
from speechdata.landing.normalize import SegmentRequest, segment_requests
from speechdata.quality.decisions import failed_on_length_alone

STAGE = "asr_flac"
ASR_SAMPLE_RATE = 16_000

ASR_FLAC_INDEX_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("flac_path", pa.string(), nullable=False),
        pa.field("sample_rate", pa.int32()),
        pa.field("n_samples", pa.int64()),
        pa.field("duration_s", pa.float64()),
        pa.field("audio_sha1", pa.string()),
        pa.field("text", pa.string()),
    ]
)
"""``text`` is set on the rows of a long recording's segments only (their words); an utterance's
text is the utterance index's."""


def pcm16(samples: np.ndarray) -> np.ndarray:
    """Float samples to int16, clipped (never wrapped) at full scale."""
    return np.rint(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def flac_bytes(pcm: np.ndarray, sample_rate: int = ASR_SAMPLE_RATE) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, pcm, sample_rate, format="FLAC", subtype="PCM_16")
    return buffer.getvalue()


class _ShardAudio:
    """Handles on a landed shard's audio: the audited tar's regular members, or the ``audio/`` files."""

    def __init__(self, data_root: DataRoot, shard_id: str):
        self.landed: LandedAudio | None = None
        self.audit: TarAudit | None = None
        self._tar: tarfile.TarFile | None = None
        self._handle: IO | None = None
        confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)
        if data_root.exists(layout.landing_audio_tar(shard_id)):
            self._handle = data_root.fs.open(data_root.path(layout.landing_audio_tar(shard_id)), "rb")
            # Held open for the reader's life, so members stream from one handle; close() closes it.
            self._tar = tarfile.open(fileobj=self._handle, mode="r:")  # noqa: SIM115
            self.audit = audit_tar(self._tar)
        else:
            self.landed = LandedAudio(data_root, shard_id)

    def close(self) -> None:
        for closeable in (self._tar, self._handle, self.landed):
            if closeable is not None:
                closeable.close()

    @contextlib.contextmanager
    def open(self, audio_path: str) -> Iterator[IO]:
        if self.landed is not None:
            with self.landed.open(audio_path) as handle:
                yield handle
            return
        if audio_path in self.audit.unsafe:
            raise _UnsafeAudio(self.audit.unsafe[audio_path])
        member = self.audit.files.get(audio_path)
        if member is None:
            raise AudioNotFound(f"the shard's audio.tar has no member {audio_path!r}")
        handle = self._tar.extractfile(member)
        try:
            yield handle
        finally:
            handle.close()


class _UnsafeAudio(Exception):
    def __init__(self, member: UnsafeMember):
        super().__init__(member.detail)
        self.member = member


@dataclass(frozen=True, kw_only=True)
class AsrFlacSummary(StageSummary):
    """The stage's summary, with every unsafe member of the shard's landed tars (referenced or not)."""

    unsafe_members: list[UnsafeMember]
    segments: int = 0
    """FLACs written for segments of long recordings (``rows_out`` counts each recording once)."""


def run_asr_flac(
    data_root: DataRoot,
    shard_id: str,
    *,
    resampler: ResamplerName = "soxr",
    on_progress: Callable[[int, int, float], None] | None = None,
    excluded: Mapping[str, tuple[str, str]] | None = None,
    kept_spans: Mapping[str, tuple[float, float]] | None = None,
) -> AsrFlacSummary:
    """Write every indexed utterance's FLAC, the FLAC index and the ``asr_flac`` rejects.

    ``excluded``: ``{utt_id: (reason, detail)}`` the ASR product leaves out (its quality policy and
    near duplicates, ``speechdata.quality.decisions.excluded_utterances``): never extracted, each an
    ``asr_flac`` reject with that reason. ``kept_spans``: ``{utt_id: (start_s, end_s)}`` within the
    utterance, where the quality policy trimmed long edge silence
    (``speechdata.quality.trims.kept_spans``): only that span is extracted. A constant DC offset is
    removed as normalization removes it (:mod:`speechdata.audio.dc_offset`).

    The summary lists every unsafe tar member, for the caller to report. The FLACs are written
    first (new names only), then the index that publishes them: a failure anywhere leaves the
    previous index naming its own, untouched files. Files no index or manifest names are left for
    :func:`speechdata.asr.flac_retention.remove_unreferenced_flacs`.
    """
    started = time.perf_counter()
    index = data_root.read_parquet(layout.utterance_index(shard_id))
    requests = segment_requests(index)
    # The alignments (every word of the shard) are read only for a shard that holds a long recording.
    spans = aligned_segments(data_root, shard_id) if any(is_long_recording(r) for r in requests) else {}
    requests, rejects, texts = _planned(requests, spans, excluded or {}, kept_spans or {})
    rows: dict[str, list] = {field.name: [] for field in ASR_FLAC_INDEX_SCHEMA}
    audio_seconds = 0.0
    audio = _ShardAudio(data_root, shard_id)
    try:
        done = 0
        for audio_path, group in groupby(requests, key=lambda r: r.audio_path):
            for request, outcome in _extract_group(audio, audio_path, list(group), resampler):
                done += 1
                if isinstance(outcome, Reject):
                    rejects.append(outcome)
                    continue
                pcm, digest = outcome
                relative = layout.asr_flac(shard_id, request.utt_id, digest)
                contained_path(layout.ASR, relative.removeprefix(layout.ASR + "/"))
                # Rewritten even when present (same name, same samples): its fresh mtime tells
                # flac_retention that this extraction, not yet indexed, still needs it.
                data_root.write_bytes(relative, flac_bytes(pcm))
                for name, value in zip(
                    rows,
                    (
                        request.utt_id,
                        relative,
                        ASR_SAMPLE_RATE,
                        pcm.shape[0],
                        pcm.shape[0] / ASR_SAMPLE_RATE,
                        digest,
                        texts.get(request.utt_id),
                    ),
                    strict=True,
                ):
                    rows[name].append(value)
                audio_seconds += pcm.shape[0] / ASR_SAMPLE_RATE
            if on_progress:
                on_progress(done, len(requests), audio_seconds)
        unsafe = sorted(audio.audit.unsafe.values(), key=lambda m: m.name) if audio.audit else []
    finally:
        audio.close()

    table = pa.table(rows, schema=ASR_FLAC_INDEX_SCHEMA).sort_by("utt_id")
    rejects = _recordings_without_segments(rejects, set(table["utt_id"].to_pylist()))
    produced = {utterance_of_key(utt_id) for utt_id in table["utt_id"].to_pylist()}
    fault_point("asr-flac-files")  # new files written, the old index still names the old ones
    data_root.write_parquet(layout.asr_flac_index(shard_id), table)
    fault_point("asr-flac-index")
    data_root.write_parquet(layout.rejects(shard_id, STAGE), rejects_table(rejects))
    return AsrFlacSummary(
        shard_id=shard_id,
        rows_in=index.num_rows,
        rows_out=len(produced),
        rejects=rejects,
        audio_seconds=audio_seconds,
        compute_seconds=time.perf_counter() - started,
        outputs={
            "flac_dir": data_root.uri(layout.asr_flac_dir(shard_id)),
            "index": data_root.uri(layout.asr_flac_index(shard_id)),
            "rejects": data_root.uri(layout.rejects(shard_id, STAGE)),
        },
        unsafe_members=unsafe,
        segments=sum(1 for utt_id in table["utt_id"].to_pylist() if utt_id in texts),
    )


def aligned_segments(data_root: DataRoot, shard_id: str) -> dict[str, list[tuple[int, str, int, int]]]:
    """The aligner's segments of the shard's long recordings (none before its ``alignments`` exist)."""
    if not data_root.exists(layout.alignments(shard_id)):
        return {}
    return segment_spans(data_root, shard_id)


def is_long_recording(request: SegmentRequest) -> bool:
    """Published as its aligned segments: longer than the longest segment the aligner cuts."""
    return request.duration_s * 1000 > MAX_SEGMENT_MS


def _planned(
    requests: list[SegmentRequest],
    spans: Mapping[str, list[tuple[int, str, int, int]]],
    excluded: Mapping[str, tuple[str, str]],
    kept_spans: Mapping[str, tuple[float, float]],
) -> tuple[list[SegmentRequest], list[Reject], dict[str, str]]:
    """``(requests, rejects, texts)``: what to cut (a long recording's segments in its place, keyed
    ``<utt_id>+<index>``, ordered by file then start), the utterances left out with their reason, and
    each segment's words by its key."""
    planned: list[SegmentRequest] = []
    rejects: list[Reject] = []
    texts: dict[str, str] = {}
    for request in requests:
        segmented = is_long_recording(request) and request.utt_id in spans
        exclusion = excluded.get(request.utt_id)
        if exclusion is not None and not (segmented and failed_on_length_alone(exclusion)):
            rejects.append(Reject(request.utt_id, STAGE, *exclusion))
        elif segmented:
            cut = _segment_requests(request, spans[request.utt_id])
            if not cut:
                detail = f"{request.audio_path}: not aligned: no aligned segment holds audio"
                rejects.append(Reject(request.utt_id, STAGE, "audio_empty", detail))
            planned += cut
            texts.update({segment.utt_id: text for segment, text in cut.items()})
        elif is_long_recording(request) and request.duration_s > budget.MAX_UTTERANCE_SECONDS:
            # Never decoded: the reason every stage gives a recording it may not decode whole.
            problem = budget.audio_budget_problem(round(request.duration_s * 1000), 1000)
            detail = f"{request.audio_path}: the segment: {problem}; not aligned: no segments to publish it as"
            rejects.append(Reject(request.utt_id, STAGE, budget.OVER_BUDGET_REASON, detail))
        else:
            planned.append(_kept(request, kept_spans))
    if texts:  # segments join their file's other utterances, in order (each file is opened once)
        planned.sort(key=lambda r: (r.audio_path, r.start_s, r.utt_id))
    return planned, rejects, texts


def _segment_requests(recording: SegmentRequest, spans: list[tuple[int, str, int, int]]) -> dict[SegmentRequest, str]:
    """The recording's aligned segments (times in ms of the recording) as requests into its landed file,
    with their words."""
    cut = {}
    for index, text, start_ms, end_ms in spans:
        start_s = recording.start_s + start_ms / 1000
        end_s = min(recording.start_s + end_ms / 1000, recording.end_s)
        if end_s > start_s:
            cut[SegmentRequest(segment_key(recording.utt_id, index), recording.audio_path, start_s, end_s)] = text
    return cut


def _recordings_without_segments(rejects: list[Reject], written: set[str]) -> list[Reject]:
    """A segment that could not be cut stays a reject under its own key; a recording none of whose
    segments was written is rejected under its own id too (the first segment's reason), so the
    ledger accounts for it."""
    failed: dict[str, list[Reject]] = {}
    for reject in rejects:
        if SEGMENT_KEY_SEPARATOR in reject.utt_id:
            failed.setdefault(utterance_of_key(reject.utt_id), []).append(reject)
    kept = {utterance_of_key(utt_id) for utt_id in written}
    for utt_id, segment_rejects in sorted(failed.items()):
        if utt_id not in kept:
            first = segment_rejects[0]
            rejects.append(
                Reject(utt_id, STAGE, first.reason, f"no segment of {len(segment_rejects)} cut; first: {first.detail}")
            )
    return rejects


def _kept(request: SegmentRequest, kept_spans: Mapping[str, tuple[float, float]]) -> SegmentRequest:
    """The request narrowed to the span the quality policy kept (seconds into the utterance)."""
    span = kept_spans.get(request.utt_id)
    if span is None:
        return request
    start, end = request.start_s + span[0], min(request.end_s, request.start_s + span[1])
    return dataclasses.replace(request, start_s=start, end_s=end) if start < end else request


def _extract_group(
    audio: _ShardAudio, audio_path: str, group: list[SegmentRequest], resampler: ResamplerName
) -> Iterator[tuple[SegmentRequest, tuple[np.ndarray, str] | Reject]]:
    """Each segment of one source file, decoded once per file."""
    finished = 0
    try:
        with audio.open(audio_path) as handle, sf.SoundFile(handle) as sound:
            for request in group:
                yield request, _extract_one(sound, request, resampler)
                finished += 1
    except _UnsafeAudio as exc:
        for request in group[finished:]:
            yield request, Reject(request.utt_id, STAGE, exc.member.reason, exc.member.detail)
    except AudioNotFound as exc:
        for request in group[finished:]:
            yield request, Reject(request.utt_id, STAGE, "audio_not_found", str(exc))
    except Exception as exc:  # libsndfile raises several types for a file it cannot open
        for request in group[finished:]:
            yield request, Reject(request.utt_id, STAGE, "audio_decode_failed", f"{audio_path}: {error_text(exc)}")


def _extract_one(
    sound: sf.SoundFile, request: SegmentRequest, resampler: ResamplerName
) -> tuple[np.ndarray, str] | Reject:
    try:
        samples = read_segment_from(sound, request.start_s, request.end_s)
    except OverMemoryBudget as exc:  # from the header: nothing was decoded
        return Reject(request.utt_id, STAGE, exc.reason, f"{request.audio_path}: {exc}")
    except Exception as exc:
        return Reject(request.utt_id, STAGE, "audio_decode_failed", f"{request.audio_path}: {error_text(exc)}")
    if samples.shape[0] == 0:
        return Reject(request.utt_id, STAGE, "audio_empty", f"{request.audio_path}: no samples decoded")
    expected_s, decoded_s = request.end_s - request.start_s, samples.shape[0] / sound.samplerate
    truncated = truncation_reject(request.utt_id, STAGE, request.audio_path, expected_s, decoded_s)
    if truncated is not None:
        return truncated
    mono = remove_dc_offset(downmix_to_mono(samples), sound.samplerate)
    pcm = pcm16(resample(mono, sound.samplerate, ASR_SAMPLE_RATE, resampler))
    return pcm, hashlib.sha1(pcm.tobytes()).hexdigest()
