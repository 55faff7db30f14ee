"""Import language-indexed tars (mixed-language audio plus a language index) into landing shards.

Source layout::

    <tars>/<...N...>.tar        audio files (mp3 originally; any libsndfile format works), many
                                languages per tar; N, the tar number, is the last run of digits in the name
    lid_index                   {(tar_number, filename): language}: the corpus's ``lid_index.pkl``, or a
                                parquet/CSV/JSON table with columns tar_number, filename, language
    vad cache (optional)        per tar, {filename: {"segments": [(start_s, end_s), ...]}}

``filename`` is matched the way the original streaming loader looked it up (the sample's WebDataset
key) and, failing that, as the member's name, its base name, or its base name without extension.

Each source tar becomes one landing shard ``<prefix>-<NNNNNN>`` (docs/landing-contract.md):
``audio.tar`` with members renamed ``<utt_id>.<ext>`` (bytes untouched, deterministic headers),
``metadata.parquet`` (``language`` null where the index does not know the file, and counted;
``source_tar_number``, ``source_member`` carried through) and, when the cache has the tar,
``vad_segments.parquet`` that ``vad_segments`` uses instead of running the model. ``_SUCCESS`` last.

Every source member is checked for its real size before it is read (:mod:`speechdata.io.safe_tar`):
a sparse member, one over the size limit, a link or a device is refused, listed in the import's
report (``refused_members``: name, reason, detail with the size) and never copied; members are
copied as streams, never held whole. A re-import removes the temps a killed import left in the shard.

Pickles run code when loaded: only load a ``lid_index.pkl`` or VAD cache from a source you trust.
"""

from __future__ import annotations

import pickle
import posixpath
import re
import tarfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import fsspec
import pyarrow as pa

from speechdata.command_options import add_data_root_option, add_quiet_option, data_root_from_args, with_progress
from speechdata.io import layout
from speechdata.io.audio_tars import audio_extension, deterministic_tar_writer, webdataset_key
from speechdata.io.bounded_json import load_bounded_json, read_bounded_json_bytes
from speechdata.io.confinement import confined_landed_shard
from speechdata.io.safe_tar import UnsafeMember, audit_member
from speechdata.io.storage import DataRoot, filesystem_for, read_parquet_handle
from speechdata.landing.contract import CONTRACT_FIELDS, LANGUAGE_PATTERN
from speechdata.landing.mark import mark_landed

LanguageIndex = Mapping[tuple[int, str], str]
VadCache = Callable[[int], Mapping[str, dict] | None]
"""``tar_number -> {filename: {"segments": [(start_s, end_s), ...]}}``, or None when not cached."""

_UNSAFE_ID_CHARACTERS = re.compile(r"[^A-Za-z0-9_-]+")

IMPORTED_METADATA_SCHEMA = pa.schema(
    [
        *CONTRACT_FIELDS,
        ("source_tar_number", pa.int64()),
        ("source_member", pa.string()),
        ("source_language", pa.string()),
    ]
)
IMPORTED_SEGMENTS_SCHEMA = pa.schema(
    [("audio_path", pa.string()), ("start_s", pa.list_(pa.float64())), ("end_s", pa.list_(pa.float64()))]
)


@dataclass(frozen=True)
class ImportedShard:
    shard_id: str
    source_tar: str
    files: int
    unknown_language: int
    """Files the language index has no valid ISO 639-1 entry for: landed with ``language = null``."""
    skipped_members: int
    """Tar members that are not audio files (sidecars, directories)."""
    vad_files: int
    """Files with cached VAD segments, landed as ``vad_segments.parquet``."""
    refused_members: list[UnsafeMember] = field(default_factory=list)
    """Audio members never read: sparse, over the size limit, links, devices, unsafe names."""


def tar_number_of(path: str) -> int:
    digits = re.findall(r"\d+", posixpath.basename(path))
    if not digits:
        raise ValueError(f"{path}: a source tar's name must contain its number (e.g. 000123.tar)")
    return int(digits[-1])


def lookup_names(member_name: str) -> list[str]:
    """The names a source index may use for a member, most specific first."""
    key, _ = webdataset_key(member_name)
    base = posixpath.basename(member_name)
    names = [key, member_name, base, base.split(".", 1)[0]]
    return [n for i, n in enumerate(names) if n and n not in names[:i]]


def import_language_tar(
    data_root: DataRoot,
    source_tar: str,
    language_index: LanguageIndex,
    *,
    vad_cache: VadCache | None = None,
    shard_prefix: str = "lid",
    source: str = "language-tars",
) -> ImportedShard:
    """Land one source tar as the shard ``<shard_prefix>-<tar number, 6 digits>``."""
    number = tar_number_of(source_tar)
    shard_id = f"{shard_prefix}-{number:06d}"
    if not layout.is_valid_shard_id(shard_id):
        raise ValueError(f"shard id {shard_id!r} must match {layout.SHARD_ID_PATTERN.pattern}")
    confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)  # never write through a link out
    if data_root.exists(layout.landing_success_marker(shard_id)):
        data_root.fs.rm(data_root.path(layout.landing_success_marker(shard_id)))  # a re-import: landing again
    cached = (vad_cache(number) if vad_cache else None) or {}
    rows, segments, used_ids, refused = [], [], set(), []
    skipped = unknown = 0
    with (
        _open_source(source_tar) as handle,
        tarfile.open(fileobj=handle, mode="r|*") as tar,
        deterministic_tar_writer(data_root, layout.landing_audio_tar(shard_id)) as add,
    ):
        for member in tar:
            _, extension = webdataset_key(member.name)
            fmt = audio_extension(extension) if extension and not member.isdir() else None
            if fmt is None:
                skipped += 1
                continue
            problem = audit_member(member)  # before a byte is read: a sparse 4 GB member stays 4 GB unread
            if problem is not None:
                refused.append(problem)
                continue
            names = lookup_names(member.name)
            utt_id = _unique_id(_UNSAFE_ID_CHARACTERS.sub("_", names[0]).strip("_") or "file", used_ids)
            audio_path = f"{utt_id}.{fmt}"
            add(audio_path, tar.extractfile(member), member.size)
            raw_language = next((language_index[(number, n)] for n in names if (number, n) in language_index), None)
            language = raw_language.lower() if isinstance(raw_language, str) else None
            if language is None or not LANGUAGE_PATTERN.match(language):
                language, unknown = None, unknown + 1
            rows.append(
                {
                    "utt_id": utt_id,
                    "audio_path": audio_path,
                    "text": None,
                    "language": language,
                    "country": None,
                    "start_s": None,
                    "end_s": None,
                    "source": source,
                    "source_tar_number": number,
                    "source_member": member.name,
                    "source_language": raw_language,
                }
            )
            entry = next((cached[n] for n in names if n in cached), None)
            if entry is not None:
                pairs = sorted((float(s), float(e)) for s, e in entry.get("segments", []))
                segments.append(
                    {"audio_path": audio_path, "start_s": [s for s, _ in pairs], "end_s": [e for _, e in pairs]}
                )
    data_root.write_parquet(
        layout.landing_metadata(shard_id), pa.Table.from_pylist(rows, schema=IMPORTED_METADATA_SCHEMA)
    )
    if segments:
        data_root.write_parquet(
            layout.landing_vad_segments(shard_id), pa.Table.from_pylist(segments, schema=IMPORTED_SEGMENTS_SCHEMA)
        )
    elif data_root.exists(layout.landing_vad_segments(shard_id)):
        data_root.fs.rm(data_root.path(layout.landing_vad_segments(shard_id)))  # a re-import without a cache
    mark_landed(data_root, shard_id)
    return ImportedShard(shard_id, source_tar, len(rows), unknown, skipped, len(segments), refused)


def _unique_id(candidate: str, used: set[str]) -> str:
    utt_id, n = candidate, 1
    while utt_id in used:
        n += 1
        utt_id = f"{candidate}-{n}"
    used.add(utt_id)
    return utt_id


def _open_source(url: str):
    """A source file opened for reading; a local one only if it is a regular file (never a FIFO that would block)."""
    fs, path = filesystem_for(url)
    return fs.open(path, "rb")


def load_language_index(url: str) -> dict[tuple[int, str], str]:
    """The corpus's ``lid_index.pkl`` (trusted sources only), or a parquet/CSV/JSON table of it."""
    if url.endswith(".pkl"):
        with _open_source(url) as handle:
            raw = pickle.load(handle)
        return {(int(number), str(name)): language for (number, name), language in raw.items()}
    with _open_source(url) as handle:
        if url.endswith(".parquet"):
            rows = read_parquet_handle(handle, ["tar_number", "filename", "language"]).to_pylist()
        elif url.endswith(".csv"):
            import pyarrow.csv as pacsv

            rows = pacsv.read_csv(handle).select(["tar_number", "filename", "language"]).to_pylist()
        else:
            rows = load_bounded_json(read_bounded_json_bytes(handle, url), url)
    return {(int(r["tar_number"]), str(r["filename"])): r["language"] for r in rows}


def pickled_vad_cache(url_for_tar: Callable[[int], str]) -> VadCache:
    """A VAD cache of one pickle per tar (the original ``load_vad_shard``), None where a tar has none."""

    def load(number: int) -> Mapping[str, dict] | None:
        url = url_for_tar(number)
        fs, path = filesystem_for(url)
        if not fs.exists(path):
            return None
        with fs.open(path, "rb") as handle:
            return pickle.load(handle)

    return load


def import_language_tars(
    data_root: DataRoot, source_tars: list[str], language_index: LanguageIndex, **options
) -> list[ImportedShard]:
    """Land every source tar (see :func:`import_language_tar` for ``options``)."""
    return [import_language_tar(data_root, url, language_index, **options) for url in sorted(source_tars)]


DESCRIPTION = "Land mixed-language tars with a language index (lid_index) as shards."
EPILOG = """example:
  speechdata import language-tars 'raw/*.tar' --index lid_index.pkl --vad-cache 'vad/{number:06d}.pkl'"""


def add_arguments(parser) -> None:
    parser.add_argument("tars", nargs="+", metavar="TAR", help="source tar URLs or paths (globs are expanded)")
    parser.add_argument("--index", required=True, help="lid_index.pkl, or a parquet/CSV/JSON table")
    parser.add_argument("--vad-cache", help="per-tar VAD pickles, e.g. 'vad/{number:06d}.pkl'")
    add_data_root_option(parser, creates_root=True)
    parser.add_argument("--shard-prefix", default="lid", help="landing shards are <prefix>-<tar number> (default: lid)")
    add_quiet_option(parser)


def main(argv: list[str] | None = None) -> int:
    """python -m speechdata.importers.language_tars: an alias of speechdata import language-tars."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m speechdata.importers.language_tars",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args) -> int:
    import json

    root = data_root_from_args(args, what="import language-tars", creates_root=True)
    urls = [f.full_name for pattern in args.tars for f in fsspec.open_files(pattern)]
    cache = pickled_vad_cache(lambda n: args.vad_cache.format(number=n)) if args.vad_cache else None
    language_index = load_language_index(args.index)
    # One tar at a time (import_language_tars' own loop) so that the progress bar moves per tar.
    for url in with_progress(sorted(urls), description="import language-tars", quiet=args.quiet):
        [shard] = import_language_tars(root, [url], language_index, vad_cache=cache, shard_prefix=args.shard_prefix)
        report = {**shard.__dict__, "refused_members": [problem.__dict__ for problem in shard.refused_members]}
        print(json.dumps(report))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
