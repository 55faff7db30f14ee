"""Import an ASR segment-tar shard into a landing shard (docs/landing-contract.md).

A segment-tar shard directory holds ``metadata.parquet`` (``segment_id``, ``transcription_native``,
``duration_s``, ``tx_quality_score``, ``segment_language``, ...), ``audio_index.parquet``
(``segment_id``, ``tar_member_name``) and one audio tar whose members are FLAC files. The import is
columnar (polars), copies the tar unchanged (it is audited when read, never extracted by name) and
writes ``_SUCCESS`` last. Nothing is dropped here: a segment without an audio index entry lands with
a null ``audio_path`` and ``raw_shards`` rejects it with that reason.

Column mapping: ``utt_id`` = ``segment_id`` with characters outside ``[A-Za-z0-9_-]`` replaced by
``_`` (the original stays in ``segment_id``), ``audio_path`` = ``tar_member_name``, ``text`` =
``transcription_native``, ``language`` = ``segment_language`` (else the language given for the
whole shard, as the source pipeline's ``lang_from_path`` does), ``declared_duration_s`` = ``duration_s``,
``recording_id`` = the first of ``recording_id`` / ``source_id`` / ``video_id`` present, else the
``segment_id`` without its trailing ``_NNNN`` segment number. Other columns are carried through.
"""

from __future__ import annotations

import io
import posixpath
import shutil
import tarfile

import numpy as np
import polars as pl
import soundfile as sf

from speechdata.command_options import (
    add_data_root_option,
    add_quiet_option,
    data_root_from_args,
    key_type,
    with_progress,
)
from speechdata.io import layout
from speechdata.io.confinement import confined_landed_shard
from speechdata.io.storage import DataRoot, atomic_open, filesystem_for, read_parquet
from speechdata.landing.contract import CONTRACT_COLUMNS
from speechdata.landing.mark import mark_landed
from speechdata.landing.raw_shard import PROBE_FIELDS

METADATA_FILE = "metadata.parquet"
AUDIO_INDEX_FILE = "audio_index.parquet"
RECORDING_COLUMNS = ("recording_id", "source_id", "video_id")
_SEGMENT_NUMBER_SUFFIX = r"^(.+?)[_-]\d+$"


def import_segment_tar_shard(
    source_dir: str,
    data_root: DataRoot,
    shard_id: str,
    *,
    language: str | None = None,
    tar_name: str | None = None,
) -> int:
    """Land the segment-tar shard at ``source_dir`` (a path or fsspec URL) as ``landing/<shard_id>``.

    ``language`` fills rows whose ``segment_language`` is null. Returns the number of rows landed.
    """
    if not layout.is_valid_shard_id(shard_id):
        raise ValueError(f"shard id {shard_id!r} must match {layout.SHARD_ID_PATTERN.pattern}")
    confined_landed_shard(data_root.root, shard_id, local=data_root.is_local)  # never write through a link out
    fs, root = filesystem_for(source_dir)
    metadata = pl.from_arrow(read_parquet(fs, f"{root}/{METADATA_FILE}"))
    audio_index = pl.from_arrow(read_parquet(fs, f"{root}/{AUDIO_INDEX_FILE}", ["segment_id", "tar_member_name"]))
    landed = segment_tar_to_landing(metadata, audio_index, language=language, source=posixpath.basename(root))
    tar_path = f"{root}/{tar_name}" if tar_name else _the_one_tar(fs, root)
    with (
        fs.open(tar_path, "rb") as source,
        atomic_open(data_root.fs, data_root.path(layout.landing_audio_tar(shard_id))) as target,
    ):
        shutil.copyfileobj(source, target, length=8 << 20)
    data_root.write_parquet(layout.landing_metadata(shard_id), landed.to_arrow())
    mark_landed(data_root, shard_id)
    return landed.height


def _the_one_tar(fs, root: str) -> str:
    tars = sorted(p for p in fs.ls(root, detail=False) if p.endswith(".tar"))
    if len(tars) != 1:
        raise FileNotFoundError(f"{root}: expected exactly one audio tar, found {len(tars)} ({tars}); pass tar_name")
    return tars[0]


def segment_tar_to_landing(
    metadata: pl.DataFrame, audio_index: pl.DataFrame, *, language: str | None = None, source: str | None = None
) -> pl.DataFrame:
    """The landing metadata table for one segment-tar shard (see the module docstring)."""
    for column in ("segment_id", "transcription_native"):
        if column not in metadata.columns:
            raise ValueError(
                f"segment-tar metadata.parquet: required column {column!r} is missing (have {metadata.columns})"
            )
    # One audio entry per segment: a duplicated index row would otherwise duplicate the utterance.
    audio_index = audio_index.unique(subset="segment_id", keep="first", maintain_order=True)
    joined = metadata.with_columns(pl.col("segment_id").cast(pl.String)).join(
        audio_index.with_columns(pl.col("segment_id").cast(pl.String)), on="segment_id", how="left"
    )
    recording = next((pl.col(c).cast(pl.String) for c in RECORDING_COLUMNS if c in joined.columns), None)
    if recording is None:
        recording = pl.col("segment_id").str.extract(_SEGMENT_NUMBER_SUFFIX, 1)
    segment_language = pl.col("segment_language") if "segment_language" in joined.columns else pl.lit(None, pl.String)
    landing = joined.select(
        pl.col("segment_id").str.replace_all(r"[^A-Za-z0-9_-]", "_").alias("utt_id"),
        pl.col("tar_member_name").alias("audio_path"),
        pl.col("transcription_native").alias("text"),
        pl.coalesce(segment_language.cast(pl.String).str.to_lowercase(), pl.lit(language, pl.String)).alias("language"),
        pl.lit(None, pl.String).alias("country"),
        pl.lit(None, pl.Float64).alias("start_s"),
        pl.lit(None, pl.Float64).alias("end_s"),
        pl.lit(source, pl.String).alias("source"),
        recording.alias("recording_id"),
    )
    taken = {"segment_id", "tar_member_name", "transcription_native", "segment_language", *RECORDING_COLUMNS}
    reserved = set(CONTRACT_COLUMNS) | {f.name for f in PROBE_FIELDS} | set(landing.columns)
    extras = [
        pl.col(c).alias(f"declared_{c}" if c == "duration_s" else (f"source_{c}" if c in reserved else c))
        for c in joined.columns
        if c not in taken
    ]
    return pl.concat([landing, joined.select(pl.col("segment_id"), *extras)], how="horizontal")


def build_segment_tar_sample(
    target_dir: str,
    clips,
    *,
    n_segments: int = 12,
    seed: int = 0,
    tar_name: str = "audio.tar",
    extra_members: dict[str, bytes] | None = None,
) -> pl.DataFrame:
    """Write a small segment-tar shard (metadata, audio index, FLAC tar) for tests and the demo.

    Segments cycle through ``clips`` (languages of the fixtures, Hindi text for every third one to
    exercise Devanagari cleaning); ``extra_members`` adds raw tar members (e.g. a ``../`` name).
    """
    rng = np.random.default_rng(seed)
    fs, root = filesystem_for(target_dir)
    fs.makedirs(root, exist_ok=True)
    rows, files = [], {}
    for i in range(n_segments):
        clip = clips[i % len(clips)]
        hindi = i % 3 == 2
        member = f"rec{i // 3:03d}_{i:04d}.flac"
        buffer = io.BytesIO()
        sf.write(buffer, clip.samples, clip.sample_rate, format="FLAC", subtype="PCM_16")
        files[member] = buffer.getvalue()
        rows.append(
            {
                "segment_id": f"rec{i // 3:03d}_{i:04d}",
                "transcription_native": "नमस्ते। [laugh] आप कैसे हैं?" if hindi else f"[music] {clip.text}!",
                "duration_s": len(clip.samples) / clip.sample_rate,
                "tx_quality_score": round(float(rng.uniform(0.3, 1.0)), 3),
                "segment_language": "hi" if hindi else clip.language,
            }
        )
    metadata = pl.DataFrame(rows)
    _write_parquet(fs, f"{root}/{METADATA_FILE}", metadata)
    index = pl.DataFrame({"segment_id": metadata["segment_id"], "tar_member_name": list(files)})
    _write_parquet(fs, f"{root}/{AUDIO_INDEX_FILE}", index)
    with fs.open(f"{root}/{tar_name}", "wb") as handle, tarfile.open(fileobj=handle, mode="w") as tar:
        for name, data in sorted({**files, **(extra_members or {})}.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return metadata


def _write_parquet(fs, path: str, frame: pl.DataFrame) -> None:
    with fs.open(path, "wb") as handle:
        frame.write_parquet(handle)


DESCRIPTION = "Land one ASR segment-tar shard (metadata.parquet, audio_index.parquet, a FLAC tar) as a landing shard."
EPILOG = """example:
  speechdata import segment-tars /alloc/asr_data/hi/shard_0001 asr-hi-0001 --language hi --data-root "$DATA_ROOT\""""


def add_arguments(parser) -> None:
    parser.add_argument("source_dir", metavar="SOURCE_DIR", help="the segment-tar shard directory (path or fsspec URL)")
    parser.add_argument("shard_id", metavar="SHARD_ID", type=key_type("shard"), help="the landing shard to write")
    parser.add_argument(
        "--language", type=key_type("language"), help="ISO 639-1 language for rows without segment_language"
    )
    parser.add_argument("--tar-name", help="the audio tar's name when the directory holds more than one")
    add_data_root_option(parser, creates_root=True)
    add_quiet_option(parser)


def run(args) -> int:
    root = data_root_from_args(args, what="import segment-tars", creates_root=True)
    for shard_id in with_progress([args.shard_id], description="import segment-tars", quiet=args.quiet, total=1):
        rows = import_segment_tar_shard(args.source_dir, root, shard_id, language=args.language, tar_name=args.tar_name)
    print(f"landed {rows} rows as {args.shard_id}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """python -m speechdata.importers.segment_tars: an alias of speechdata import segment-tars."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m speechdata.importers.segment_tars",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    import sys

    sys.exit(main())
