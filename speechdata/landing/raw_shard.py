"""Validate a landed shard against the contract and build its utterance index.

The index holds one row per utterance that can be used: the contract columns, any extra
columns (carried through), and what the audio header says (rate, channels, frames), with the
segment resolved to absolute ``segment_start_s``/``segment_end_s`` inside its file.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from speechdata.accounting.rejects import Reject, error_text
from speechdata.audio.truth import sample_rate_problem
from speechdata.io import layout
from speechdata.io.confinement import LandedShardOutsideRoot, confined_landed_shard
from speechdata.io.regular_files import NotARegularFile, open_regular
from speechdata.io.storage import DataRoot
from speechdata.landing.contract import ContractError, check_rows, read_metadata
from speechdata.landing.landed_audio import AudioHeader, AudioNotFound, LandedAudio, UnsafeAudio

STAGE = "raw_shards"

LANDED_SHARD_OUTSIDE_ROOT = "landed_shard_outside_root"
"""The rule a shard breaks as a whole when its folder or one of its parts is a symlink out of it."""

SEGMENT_END_TOLERANCE_S = 0.005
"""A segment may end this far past the last sample (rounding in upstream tools) and is clamped."""

PROBE_FIELDS = [
    pa.field("source_sample_rate", pa.int32()),
    pa.field("source_channels", pa.int16()),
    pa.field("source_frames", pa.int64()),
    pa.field("source_format", pa.string()),
    pa.field("segment_start_s", pa.float64()),
    pa.field("segment_end_s", pa.float64()),
    pa.field("duration_s", pa.float64()),
]


@dataclass(frozen=True)
class ShardValidation:
    """The usable utterances (``index``) and one reject per metadata row that is not usable."""

    index: pa.Table
    rejects: list[Reject]
    landed_rows: int

    @property
    def hours(self) -> float:
        return float(sum(self.index["duration_s"].to_pylist())) / 3600.0


def validate_landed_shard(data_root: DataRoot, shard_id: str) -> ShardValidation:
    """Check ``landing/<shard_id>`` row by row; raise :class:`ContractError` if the shard is unusable."""
    if not layout.is_valid_shard_id(shard_id):
        raise ContractError(
            f"{layout.LANDING}/{shard_id}",  # named, never made a path: the id is not a valid one
            None,
            f"shard id {shard_id!r} must match {layout.SHARD_ID_PATTERN.pattern}",
        )
    try:
        confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)
    except LandedShardOutsideRoot as exc:
        raise ContractError(exc.value, None, f"{LANDED_SHARD_OUTSIDE_ROOT}: {exc}") from exc
    metadata_path = data_root.path(layout.landing_metadata(shard_id))
    if not data_root.fs.exists(metadata_path):
        raise ContractError(metadata_path, None, "file is missing: every shard needs metadata.parquet")
    try:
        handle = open_regular(data_root.fs, metadata_path)
    except NotARegularFile as exc:
        raise ContractError(metadata_path, None, f"metadata.parquet must be a regular file, not a {exc.kind}") from exc
    with handle:
        table = read_metadata(handle, metadata_path)

    # Rejects name the file relative to the root: the same shard writes the same ledger under any root.
    rows = check_rows(table, STAGE, layout.landing_metadata(shard_id))
    rejects = list(rows.rejects)
    audio_paths = table["audio_path"].to_pylist()
    utt_ids = table["utt_id"].to_pylist()
    starts = table["start_s"].to_pylist()
    ends = table["end_s"].to_pylist()

    kept: list[int] = []
    probes: dict[str, list] = {field.name: [] for field in PROBE_FIELDS}
    headers: dict[str, AudioHeader | Reject] = {}
    with LandedAudio(data_root, shard_id) as audio:
        for row in rows.valid_rows:
            utt_id, path = utt_ids[row], audio_paths[row]
            if path not in headers:
                headers[path] = _probe(audio, path, utt_id)
            header = headers[path]
            if isinstance(header, Reject):
                rejects.append(Reject(utt_id, STAGE, header.reason, f"metadata row {row}: {header.detail}"))
                continue
            start_s, end_s, problem = _resolve_segment(header, starts[row], ends[row])
            if problem is not None:
                reason, detail = problem
                rejects.append(Reject(utt_id, STAGE, reason, f"metadata row {row}: {path}: {detail}"))
                continue
            kept.append(row)
            for name, value in (
                ("source_sample_rate", header.sample_rate),
                ("source_channels", header.channels),
                ("source_frames", header.frames),
                ("source_format", header.format),
                ("segment_start_s", start_s),
                ("segment_end_s", end_s),
                ("duration_s", end_s - start_s),
            ):
                probes[name].append(value)

    index = table.take(pa.array(kept, pa.int64()))
    for field in PROBE_FIELDS:
        index = index.append_column(field, pa.array(probes[field.name], field.type))
    index = index.sort_by("utt_id")
    return ShardValidation(index=index, rejects=rejects, landed_rows=table.num_rows)


def _probe(audio: LandedAudio, path: str, utt_id: str) -> AudioHeader | Reject:
    try:
        header = audio.header(path)
    except AudioNotFound as exc:
        return Reject(utt_id, STAGE, "audio_not_found", str(exc))
    except UnsafeAudio as exc:
        return Reject(utt_id, STAGE, exc.reason, str(exc))
    except Exception as exc:  # libsndfile reports every unreadable header as a RuntimeError/LibsndfileError
        return Reject(utt_id, STAGE, "audio_unreadable", f"{path}: {error_text(exc)}")
    if header.frames <= 0 or header.sample_rate <= 0:
        return Reject(utt_id, STAGE, "audio_empty", f"{path}: {header.frames} frames at {header.sample_rate} Hz")
    rate_problem = sample_rate_problem(header.sample_rate)
    if rate_problem is not None:
        return Reject(utt_id, STAGE, rate_problem[0], f"{path}: {rate_problem[1]}")
    return header


def _resolve_segment(
    header: AudioHeader, start_s: float | None, end_s: float | None
) -> tuple[float, float, None] | tuple[None, None, tuple[str, str]]:
    """The segment inside its file (a null bound is the file's start or end), or why it has none."""
    file_s = header.duration_s
    start = 0.0 if start_s is None else start_s
    end = file_s if end_s is None else end_s
    if start >= file_s:
        return (
            None,
            None,
            ("segment_past_end_of_file", f"start_s={start} is at or past the end of the file ({file_s:.3f} s)"),
        )
    if end > file_s + SEGMENT_END_TOLERANCE_S:
        return None, None, ("segment_past_end_of_file", f"end_s={end} is past the end of the file ({file_s:.3f} s)")
    end = min(end, file_s)
    if not start < end:
        return None, None, ("segment_start_not_before_end", f"start_s={start} must be < end_s={end}")
    return start, end, None
