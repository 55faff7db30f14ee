"""Import Granary-style parquet (audio bytes + transcript per row) into a landing shard.

The translation corpus's "ASR-only parquet files": one row per utterance with the encoded audio in a
column (a Hugging Face ``Audio`` struct ``{bytes, path}`` or plain binary) and the transcript in
another. The shard lands in the landing contract (docs/landing-contract.md): the audio members in
``landing/<shard>/audio.tar`` (one object, not one per utterance), ``metadata.parquet``, then
``_SUCCESS``. Other scalar columns are carried through. Nothing is dropped here: a row without audio
bytes is landed with a null ``audio_path`` and ``raw_shards`` rejects it (``missing_audio_path``);
bytes no decoder reads are ``audio_unreadable`` there. Row groups are streamed, so a large file is
never held whole.

    speechdata import granary SHARD_ID FILE.parquet [--language en] [--data-root URL]
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from speechdata.command_options import (
    add_data_root_option,
    add_quiet_option,
    data_root_from_args,
    take_positional_data_root,
    with_progress,
)
from speechdata.io import layout
from speechdata.io.confinement import confined_landed_shard
from speechdata.io.storage import DataRoot, atomic_open, filesystem_for
from speechdata.landing.contract import CONTRACT_COLUMNS, CONTRACT_FIELDS
from speechdata.landing.countries import country_code_for
from speechdata.landing.mark import mark_landed

TEXT_COLUMN_CANDIDATES = ("text", "transcript", "answer", "sentence", "pred_text")

_MAGIC_EXTENSIONS = (
    (b"RIFF", "wav"),
    (b"fLaC", "flac"),
    (b"OggS", "ogg"),
    (b"ID3", "mp3"),
    (b"\xff\xfb", "mp3"),
    (b"\xff\xf3", "mp3"),
    (b"\xff\xf2", "mp3"),
)


def audio_extension(data: bytes, path: str | None) -> str:
    """The file extension for encoded audio: from its magic bytes, else from its original path."""
    for magic, extension in _MAGIC_EXTENSIONS:
        if data.startswith(magic):
            return extension
    suffix = (path or "").rpartition(".")[2].lower()
    return suffix if suffix.isalnum() and 0 < len(suffix) <= 5 else "bin"


def _audio_bytes(value) -> tuple[bytes | None, str | None]:
    if value is None:
        return None, None
    if isinstance(value, dict):  # Hugging Face Audio feature
        return value.get("bytes") or None, value.get("path")
    return bytes(value) or None, None


@dataclass(frozen=True)
class GranaryImport:
    shard_id: str
    rows: int
    rows_without_audio: int
    metadata: pa.Table


def _pick_text_column(names: list[str], text_column: str | None) -> str | None:
    if text_column is not None:
        if text_column not in names:
            raise ValueError(f"text column {text_column!r} not in the parquet file (have: {', '.join(names)})")
        return text_column
    return next((c for c in TEXT_COLUMN_CANDIDATES if c in names), None)


def import_granary_parquet(
    data_root: DataRoot,
    shard_id: str,
    source_url: str,
    *,
    audio_column: str = "audio",
    text_column: str | None = None,
    id_column: str | None = None,
    id_prefix: str = "utt",
    language: str | None = "en",
    country: str | None = None,
    source_name: str = "granary",
) -> GranaryImport:
    """Land ``source_url`` (a parquet file, any fsspec URL) as shard ``shard_id``.

    ``utt_id`` is ``id_column``'s value when given (``raw_shards`` rejects ids that break the
    contract; a null or empty id lands as null, never as the text ``"None"``, and its audio is not
    copied: ``raw_shards`` rejects the row ``missing_utt_id``), else ``<id_prefix>_<row:06d>``
    (``utt_000123``, the translation corpus's naming). The transcript is ``text_column``, else the
    first of :data:`TEXT_COLUMN_CANDIDATES` present.
    ``country`` is a code or a country name (``germany``): rows carry its ISO 3166-1 alpha-2 code.
    """
    country = country_code_for(country) if country is not None else None
    if not layout.is_valid_shard_id(shard_id):
        raise ValueError(f"shard id {shard_id!r} must match {layout.SHARD_ID_PATTERN.pattern}")
    confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)  # never write through a link out
    fs, path = filesystem_for(source_url)
    rows: list[dict] = []
    without_audio = without_id = 0
    tar_path = data_root.path(layout.landing_audio_tar(shard_id))
    with fs.open(path, "rb") as source, atomic_open(data_root.fs, tar_path) as handle:
        parquet = pq.ParquetFile(source)
        names = parquet.schema_arrow.names
        if audio_column not in names:
            raise ValueError(f"{source_url}: audio column {audio_column!r} missing (have: {', '.join(names)})")
        text_name = _pick_text_column(names, text_column)
        carried = [
            n
            for n in names
            if n not in (audio_column, text_name, id_column)
            and n not in CONTRACT_COLUMNS
            and not pa.types.is_nested(parquet.schema_arrow.field(n).type)
            and not pa.types.is_binary(parquet.schema_arrow.field(n).type)
        ]
        with tarfile.open(fileobj=handle, mode="w|", format=tarfile.GNU_FORMAT) as tar:
            for group in range(parquet.num_row_groups):
                batch = parquet.read_row_group(group).to_pylist()
                for record in batch:
                    number = len(rows)
                    utt_id = _utt_id_of(record[id_column]) if id_column else f"{id_prefix}_{number:06d}"
                    data, original_path = _audio_bytes(record[audio_column])
                    audio_path = None
                    if utt_id is None:
                        without_id += 1  # landed with a null id: raw_shards rejects it, missing_utt_id
                    elif data is None:
                        without_audio += 1
                    else:
                        audio_path = f"{utt_id}.{audio_extension(data, original_path)}"
                        info = tarfile.TarInfo(audio_path)
                        info.size, info.mtime = len(data), 0  # fixed mtime: a re-import is byte-identical
                        tar.addfile(info, io.BytesIO(data))
                    rows.append(
                        {
                            "utt_id": utt_id,
                            "audio_path": audio_path,
                            "text": record[text_name] if text_name else None,
                            "language": language,
                            "country": country,
                            "start_s": None,
                            "end_s": None,
                            "source": source_name,
                            **{n: record[n] for n in carried},
                        }
                    )
    schema = pa.schema(
        [
            *CONTRACT_FIELDS,
            *[parquet.schema_arrow.field(n) for n in carried],
        ]
    )
    metadata = pa.Table.from_pylist(rows, schema=schema)
    data_root.write_parquet(layout.landing_metadata(shard_id), metadata)
    mark_landed(data_root, shard_id)
    return GranaryImport(shard_id, len(rows), without_audio, metadata)


def _utt_id_of(value) -> str | None:
    """The row's id as text; None for a null or empty one (``str(None)`` would land the id "None")."""
    if value is None:
        return None
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
    return text or None


DESCRIPTION = "Land a Granary-style parquet (audio bytes and transcript per row) as one landing shard."
EPILOG = """example:
  speechdata import granary granary-0001 train-00000.parquet --language en --data-root "$DATA_ROOT"

The data root used to be the first positional argument; that form still works for one release
and prints a deprecation warning."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Three positionals when the deprecated "DATA_ROOT SHARD_ID SOURCE_URL" form is used: argparse fills
    # them in order, so run() shifts them when the third is present.
    parser.add_argument("shard_id", metavar="SHARD_ID", help="the landing shard to write")
    parser.add_argument("source_url", metavar="SOURCE_URL", help="the Granary-style parquet (path or fsspec URL)")
    parser.add_argument("legacy_source_url", nargs="?", help=argparse.SUPPRESS)
    add_data_root_option(parser, creates_root=True)
    parser.add_argument("--audio-column", default="audio", help="the column holding the audio (default: audio)")
    parser.add_argument(
        "--text-column", help="the transcript column (default: the first known transcript column present)"
    )
    parser.add_argument("--id-column", help="the utterance id column (default: utt_<row number>)")
    parser.add_argument("--language", default="en", help="ISO 639-1 language of every row (default: en)")
    add_quiet_option(parser)


def main(argv: list[str] | None = None) -> int:
    """python -m speechdata.importers.granary: an alias of speechdata import granary."""
    parser = argparse.ArgumentParser(
        prog="python -m speechdata.importers.granary",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if args.legacy_source_url is not None:
        legacy_root, args.shard_id, args.source_url = args.shard_id, args.source_url, args.legacy_source_url
        take_positional_data_root(args, legacy_root, "import granary")
    root = data_root_from_args(args, what="import granary", creates_root=True)
    steps = with_progress([args.shard_id], description="import granary", quiet=args.quiet, total=1)
    for shard_id in steps:
        result = import_granary_parquet(
            root,
            shard_id,
            args.source_url,
            audio_column=args.audio_column,
            text_column=args.text_column,
            id_column=args.id_column,
            language=args.language,
        )
    print(f"landed {result.rows} rows ({result.rows_without_audio} without audio) as {args.shard_id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
