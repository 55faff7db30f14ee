"""Import per-country aligned-JSON corpora (segments of long recordings) into landing shards.

Source layout (one folder per country)::

    <countries_dir>/<country>/Alignment/alignment_output/<video_id>_<transcript_id>_aligned.json

Each JSON names a long recording (``audio_file``) and lists segments of it. Every segment becomes
one landing row: ``utt_id`` is the segment key ``<country>_<video_id>_<start_ms>_<end_ms>``,
``audio_path`` the recording copied into the shard, ``start_s``/``end_s`` the span, ``text`` the
human transcript, and the JSON's other fields are carried as extra columns (``video_id``,
``transcript_id``, ``human_text``, ``asr_text``, ``cer``, ``transcript_start_idx``,
``transcript_end_idx``). All JSONs of one recording land in the same shard, so a recording is never
split across shards; shards hold up to ``recordings_per_shard`` recordings.

Re-running the import after new JSONs arrived lands only the new ones: a JSON already named in the
``source`` column of a landed shard of that country is skipped. Shard ids are
``<country>-<digest of their JSON names>``, so the same input always lands under the same id.

Problems never vanish: a malformed JSON is reported (file and field) and skipped; a recording that
cannot be found still lands its rows, and ``raw_shards`` records them as ``audio_not_found``; a
segment past the end of its recording is rejected there as ``segment_past_end_of_file``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import posixpath
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import fsspec
import pyarrow as pa

from speechdata.alignment.aligned_json_format import ALIGNED_JSON_SUFFIX, AlignedSegment, read_aligned_json
from speechdata.alignment.table import AlignmentFormatError
from speechdata.command_options import (
    add_data_root_option,
    add_quiet_option,
    data_root_from_args,
    positive_int,
    with_progress,
)
from speechdata.importers.country_languages import (
    COUNTRY_LANGUAGES,
    codes_of,
    country_code_of_folder,
    language_for_country,
)
from speechdata.io import layout
from speechdata.io.bounded_json import JsonBoundsError, read_bounded_json_bytes
from speechdata.io.confinement import ConfinementError, confined_landed_shard, confined_source
from speechdata.io.storage import DataRoot, _is_local, filesystem_for
from speechdata.landing.mark import mark_landed

ALIGNMENT_SUBDIR = "Alignment/alignment_output"
SOURCE_PREFIX = "aligned-json:"
DEFAULT_RECORDINGS_PER_SHARD = 32

LANDING_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string()),
        pa.field("audio_path", pa.string()),
        pa.field("text", pa.string()),
        pa.field("language", pa.string()),
        pa.field("country", pa.string()),
        pa.field("start_s", pa.float64()),
        pa.field("end_s", pa.float64()),
        pa.field("source", pa.string()),
        pa.field("video_id", pa.string()),
        pa.field("transcript_id", pa.string()),
        pa.field("human_text", pa.string()),
        pa.field("asr_text", pa.string()),
        pa.field("cer", pa.float64()),
        pa.field("transcript_start_idx", pa.int32()),
        pa.field("transcript_end_idx", pa.int32()),
    ]
)
"""The landing contract's columns, then the aligned JSON's fields carried through as extra columns."""


@dataclass
class CountryImport:
    """What one country's import did: shards landed, JSONs skipped as already landed, files rejected."""

    country: str
    """The ISO 3166-1 alpha-2 code its rows and shards carry."""
    folder: str = ""
    """The source's country folder (``france`` or ``fr``)."""
    shards: list[str] = field(default_factory=list)
    segments: int = 0
    recordings: int = 0
    already_landed: int = 0
    missing_recordings: list[str] = field(default_factory=list)
    rejected_files: dict[str, str] = field(default_factory=dict)
    """JSON path -> why it was not imported (malformed JSON, a bad field)."""
    refused_recordings: dict[str, str] = field(default_factory=dict)
    """``audio_file`` -> why it was not copied (it leaves the source folder)."""


@dataclass(frozen=True)
class _Recording:
    audio_file: str
    audio_path: str
    sources: tuple[str, ...]
    segments: tuple[AlignedSegment, ...]


def import_aligned_countries(
    countries_dir: str,
    data_root: DataRoot,
    countries: list[str] | None = None,
    *,
    country_languages: Mapping[str, str] = COUNTRY_LANGUAGES,
    recordings_per_shard: int = DEFAULT_RECORDINGS_PER_SHARD,
) -> list[CountryImport]:
    """Land every not-yet-landed aligned JSON of ``countries`` (default: every country folder).

    ``countries_dir`` is a local path or an fsspec URL. Relative ``audio_file`` paths are resolved
    against the country folder. A folder named by a country name (``france``) lands under the
    country's ISO 3166-1 alpha-2 code (``fr``): rows, keys and shard ids carry the code. Raises
    :class:`UnknownCountryError` before landing anything when a folder is no known country or its
    country has no language.
    """
    source_fs, source_root = filesystem_for(countries_dir)
    if countries is None:
        countries = sorted(PurePosixPath(p).name for p in source_fs.ls(source_root, detail=False) if source_fs.isdir(p))
    # A mistyped path or country found no JSON and reported success with nothing landed.
    missing = [folder for folder in countries if not source_fs.isdir(f"{source_root}/{folder}")]
    if missing:
        raise FileNotFoundError(
            f"{countries_dir}: no country folder {', '.join(map(repr, missing))} "
            f"(COUNTRIES_DIR holds one folder per country, e.g. germany/{ALIGNMENT_SUBDIR}/*_aligned.json)"
        )
    codes = {}
    for folder in countries:
        language_for_country(folder, country_languages)
        codes[folder] = country_code_of_folder(folder, country_languages)
    by_code = codes_of(country_languages)
    return [
        _import_country(
            source_fs,
            f"{source_root}/{folder}",
            folder,
            codes[folder],
            by_code[codes[folder]],
            data_root,
            recordings_per_shard,
        )
        for folder in countries
    ]


def landed_sources(data_root: DataRoot, country: str) -> set[str]:
    """The aligned-JSON sources already landed for ``country`` (its code; read from the shards'
    ``source`` column, ``<folder>/<json name>``)."""
    landing = data_root.path(layout.LANDING)
    if not data_root.fs.exists(landing):
        return set()
    sources: set[str] = set()
    for shard_dir in data_root.fs.ls(landing, detail=False):
        shard_id = PurePosixPath(shard_dir).name
        if not shard_id.startswith(f"{country}-") or not data_root.exists(layout.landing_success_marker(shard_id)):
            continue
        confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)
        table = data_root.read_parquet(layout.landing_metadata(shard_id), columns=["source"])
        sources.update(
            s[len(SOURCE_PREFIX) :] for s in table["source"].to_pylist() if s and s.startswith(SOURCE_PREFIX)
        )
    return sources


def _import_country(
    source_fs: fsspec.AbstractFileSystem,
    country_dir: str,
    folder: str,
    country: str,
    language: str,
    data_root: DataRoot,
    recordings_per_shard: int,
) -> CountryImport:
    report = CountryImport(country, folder)
    done = landed_sources(data_root, country)
    json_paths = sorted(source_fs.glob(f"{country_dir}/{ALIGNMENT_SUBDIR}/*{ALIGNED_JSON_SUFFIX}"))
    segments_by_audio: dict[str, list[AlignedSegment]] = {}
    sources_by_audio: dict[str, list[str]] = {}
    for path in json_paths:
        source = f"{folder}/{PurePosixPath(path).name}"
        if source in done:
            report.already_landed += 1
            continue
        try:
            with source_fs.open(path, "rb") as handle:
                data = read_bounded_json_bytes(handle, path)  # a huge file is refused, not read whole
            segments = read_aligned_json(data.decode("utf-8"), path, country)
        except (AlignmentFormatError, UnicodeDecodeError, JsonBoundsError) as exc:
            report.rejected_files[path] = str(exc)
            continue
        if not segments:
            report.rejected_files[path] = f"{path}: 'segments' is empty"
            continue
        audio_file = segments[0].audio_file
        segments_by_audio.setdefault(audio_file, []).extend(segments)
        sources_by_audio.setdefault(audio_file, []).append(source)
    recordings = [
        _Recording(audio, _landed_audio_name(segs[0].video_id, audio), tuple(sources_by_audio[audio]), tuple(segs))
        for audio, segs in sorted(segments_by_audio.items(), key=lambda item: item[1][0].video_id)
    ]
    for start in range(0, len(recordings), recordings_per_shard):
        batch = recordings[start : start + recordings_per_shard]
        shard_id = _shard_id(country, [s for r in batch for s in r.sources])
        _land_shard(source_fs, country_dir, language, batch, data_root, shard_id, report)
        report.shards.append(shard_id)
        report.recordings += len(batch)
        report.segments += sum(len(r.segments) for r in batch)
    return report


def _landed_audio_name(video_id: str, audio_file: str) -> str:
    suffix = PurePosixPath(audio_file).suffix.lower()
    # Two recordings of one video (re-encodes) keep distinct names through a short digest.
    return f"{video_id}-{hashlib.sha1(audio_file.encode()).hexdigest()[:8]}{suffix}"


def _shard_id(country: str, sources: list[str]) -> str:
    digest = hashlib.sha1("\n".join(sorted(sources)).encode()).hexdigest()[:12]
    return f"{country}-{digest}"


def _resolve_audio(source_fs: fsspec.AbstractFileSystem, country_dir: str, audio_file: str) -> str:
    """The recording's path, which must stay inside the import's source folder (the countries folder):
    an ``audio_file`` of ``/etc/hostname`` or ``../../x`` is refused (ConfinementError), never copied."""
    source_root = posixpath.dirname(country_dir)
    if "://" in audio_file:
        raise ConfinementError("audio_file", audio_file, source_root, "must be a path inside the source folder")
    local = _is_local(source_fs)
    if audio_file.startswith("/"):
        if not local:
            raise ConfinementError("audio_file", audio_file, source_root, "must be relative to the country folder")
        return confined_source(audio_file, source_root, what="audio_file")
    resolved = posixpath.normpath(f"{country_dir}/{audio_file}")
    if not resolved.startswith(source_root.rstrip("/") + "/"):
        raise ConfinementError("audio_file", audio_file, source_root, "resolves outside the source folder")
    return confined_source(resolved, source_root, what="audio_file") if local else resolved


def _land_shard(
    source_fs: fsspec.AbstractFileSystem,
    country_dir: str,
    language: str,
    recordings: list[_Recording],
    data_root: DataRoot,
    shard_id: str,
    report: CountryImport,
) -> None:
    confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)  # never write through a link out
    rows = []
    for recording in recordings:
        try:
            source_audio = _resolve_audio(source_fs, country_dir, recording.audio_file)
        except ConfinementError as exc:
            report.refused_recordings[recording.audio_file] = str(exc)
            source_audio = None
        if source_audio is None:
            pass  # its rows still land; ingest rejects them as audio_not_found
        elif source_fs.exists(source_audio):
            with (
                source_fs.open(source_audio, "rb") as src,
                data_root.open_atomic(f"{layout.landing_audio_dir(shard_id)}/{recording.audio_path}") as dst,
            ):
                while chunk := src.read(16 << 20):
                    dst.write(chunk)
        else:
            report.missing_recordings.append(source_audio)
        source_by_transcript = {Path(s).name: s for s in recording.sources}
        for seg in recording.segments:
            rows.append(
                {
                    "utt_id": seg.key,
                    "audio_path": recording.audio_path,
                    "text": seg.human_text,
                    "language": language,
                    "country": seg.country,
                    "start_s": seg.start_ms / 1000.0,
                    "end_s": seg.end_ms / 1000.0,
                    "source": SOURCE_PREFIX
                    + source_by_transcript[f"{seg.video_id}_{seg.transcript_id}{ALIGNED_JSON_SUFFIX}"],
                    "video_id": seg.video_id,
                    "transcript_id": seg.transcript_id,
                    "human_text": seg.human_text,
                    "asr_text": seg.asr_text,
                    "cer": seg.cer,
                    "transcript_start_idx": seg.start_idx,
                    "transcript_end_idx": seg.end_idx,
                }
            )
    data_root.write_parquet(layout.landing_metadata(shard_id), pa.Table.from_pylist(rows, schema=LANDING_SCHEMA))
    # _SUCCESS last: the landing sensor ignores the shard until everything above is in place.
    mark_landed(data_root, shard_id)


DESCRIPTION = "Land per-country aligned-JSON corpora (segments of long recordings) as landing shards."
EPILOG = """example:
  speechdata import aligned-json /data/aligned-json/countries --data-root "$DATA_ROOT" --country germany"""


def main(argv: list[str] | None = None) -> int:
    """python -m speechdata.importers.aligned_json: an alias of speechdata import aligned-json."""
    parser = argparse.ArgumentParser(
        prog="python -m speechdata.importers.aligned_json",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "countries_dir",
        metavar="COUNTRIES_DIR",
        help="folder (or fsspec URL) holding <country>/Alignment/alignment_output/",
    )
    add_data_root_option(parser, creates_root=True)
    parser.add_argument("--country", action="append", help="import only this country (repeatable)")
    parser.add_argument(
        "--language",
        action="append",
        default=[],
        metavar="COUNTRY=LANG",
        help="add or override a country's language (repeatable)",
    )
    parser.add_argument(
        "--recordings-per-shard",
        type=positive_int,
        default=DEFAULT_RECORDINGS_PER_SHARD,
        metavar="N",
        help=f"recordings landed per shard (default: {DEFAULT_RECORDINGS_PER_SHARD})",
    )
    add_quiet_option(parser)


def run(args: argparse.Namespace) -> int:
    mapping = dict(COUNTRY_LANGUAGES)
    mapping.update(dict(item.split("=", 1) for item in args.language))
    root = data_root_from_args(args, what="import aligned-json", creates_root=True)
    # One call for all countries: an unknown country fails before anything lands.
    for _ in with_progress([root], description="import aligned-json", quiet=args.quiet, total=1):
        reports = import_aligned_countries(
            args.countries_dir,
            root,
            args.country,
            country_languages=mapping,
            recordings_per_shard=args.recordings_per_shard,
        )
    for report in reports:
        print(
            json.dumps(
                {
                    "country": report.country,
                    "folder": report.folder,
                    "shards": report.shards,
                    "recordings": report.recordings,
                    "segments": report.segments,
                    "already_landed_jsons": report.already_landed,
                    "missing_recordings": report.missing_recordings,
                    "rejected_files": report.rejected_files,
                }
            )
        )
    return 1 if any(r.rejected_files or r.missing_recordings for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
