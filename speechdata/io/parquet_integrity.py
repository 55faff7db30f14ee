"""Checksums on every parquet page the platform writes, verified on every read, and errors that name the file.

Every parquet file written through :mod:`speechdata.io.storage` carries a CRC-32 in each page header
(Parquet's own ``crc`` field: ``write_page_checksum``), and every read through it checks them
(``page_checksum_verification``). The checksum travels inside the file, so a read checks exactly the
pages it decodes: a column-pruned read of ``utt_id`` touches no audio page and pays for none, and a
payload read pays one CRC-32 per page (benchmarks/storage/bench_parquet_integrity.py measures the ratio).

Bytes overwritten in a page fail its CRC; a truncated file or a damaged footer fails Arrow's parse.
Either way the reader raises :class:`UnreadableIntermediate`, naming the file relative to the data
root and the asset that writes it, instead of Arrow's bare message (or, before page checksums, a
green run over damaged audio). Files written before page checksums carry none and are read
unverified until their stage re-runs.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import pyarrow as pa

WRITE_OPTIONS = {"write_page_checksum": True}
"""Given to every ``pq.write_table`` / ``pq.ParquetWriter`` of the platform's own files."""

READ_OPTIONS = {"page_checksum_verification": True}
"""Given to every ``pq.ParquetFile`` that reads the platform's own files."""

PRODUCERS: tuple[tuple[str, str], ...] = (
    (r"landing/.*", "the landing producer (re-land the shard), then raw_shards"),
    (r"shards/[^/]+/utterances\.parquet", "raw_shards"),
    (r"shards/[^/]+/audio_24k\.parquet", "normalized_audio"),
    (r"shards/[^/]+/alignments\.parquet", "alignments"),
    (r"shards/[^/]+/alignment_scores\.parquet", "alignments"),
    (r"shards/[^/]+/frame_grids\.parquet", "frame_grids"),
    (r"shards/[^/]+/qwen_hidden_states\.parquet", "qwen_hidden_states"),
    (r"shards/[^/]+/wavlm_features\.parquet", "wavlm_features"),
    (r"shards/[^/]+/bridge_staged/.*", "bridge_tars"),
    (r"shards/[^/]+/bridge_index\.parquet", "bridge_tars, then shard_manifest"),
    (r"shards/[^/]+/asr_flac\.parquet", "asr_flac"),
    (r"shards/[^/]+/vad_segments\.parquet", "vad_segments"),
    (r"shards/[^/]+/rejects/(?P<stage>[^/]+)\.parquet", "the stage {stage}"),
    (r"manifests/.*", "shard_manifest"),
    (r"asr/manifests/.*", "asr_manifest"),
    (r"translation/segments/.*", "streaming_segments"),
    (r"translation/qe/.*", "qe_scores"),
    (r"translation/pairs/.*", "streaming_pairs"),
    (r"language_index/.*", "language_shard_index"),
    (r"hf/.*", "hf_dataset"),
)
"""Which asset writes a file (first match wins), for the error's "re-run ..." advice."""


def producer_of(relative: str) -> str:
    """The asset to re-run to rewrite ``relative`` (a path relative to the data root)."""
    for pattern, producer in PRODUCERS:
        match = re.fullmatch(pattern, relative)
        if match:
            return producer.format(**match.groupdict())
    return "the stage that writes it"


class UnreadableIntermediate(OSError):
    """A file the platform wrote does not read back: damaged, truncated, or failing its checksums."""

    def __init__(self, relative: str, cause: BaseException):
        self.relative = relative
        self.producer = producer_of(relative)
        super().__init__(
            f"{relative}: unreadable or corrupt ({type(cause).__name__}: {cause}); "
            f"re-run {self.producer} for this partition to rewrite it"
        )


@contextlib.contextmanager
def naming_unreadable(relative: str) -> Iterator[None]:
    """Raise what Arrow raises inside the block as :class:`UnreadableIntermediate` naming ``relative``.

    A missing file stays a :class:`FileNotFoundError` (callers test for absence with it); errors of
    the caller's own code (``KeyError``, ``ValueError`` that is not Arrow's) pass through unchanged.
    """
    try:
        yield
    except (FileNotFoundError, UnreadableIntermediate):
        raise
    except (pa.ArrowException, OSError) as error:
        raise UnreadableIntermediate(relative, error) from error
