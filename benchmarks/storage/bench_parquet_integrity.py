"""What verifying page checksums costs on a payload file, against reading the same file unverified.

Why: every parquet file the platform writes carries a CRC-32 per page and every read checks them
(:mod:`speechdata.io.parquet_integrity`). The payload files (audio container, feature stores) are
the big ones, hundreds of MB a shard, and are read whole by packing; the check must stay a small
fraction of reading them.

Input: an audio container of ``--megabytes`` of random ``pcm16`` payloads (incompressible, like
real encoded audio) in utterances of ``--utterance-kb``, written with the container's own options
(16 MiB row groups, 8 MiB pages, no compression on the audio) and page checksums, on the local disk
of a temporary directory; read from the page cache (one untimed read first), so the figures are the
CPU cost, where the check weighs most.

Timed (wall-clock, ``time.perf_counter``), each with and without ``page_checksum_verification``:

* whole: ``pq.ParquetFile(...).read()`` of every column (what ``DataRoot.read_parquet`` does);
* streamed: row group by row group, ``iter_batches`` of 64 rows with a 4 MiB buffered stream
  (what packing's ``KeyedRows`` does);
* write: the same table written with and without ``write_page_checksum``.

Reported: seconds of each, and ``*_verified_over_unverified`` (1 = free). Each figure is the median
of ``--repeats`` passes; the order of the two variants alternates each repeat.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.report import alternating_medians, emit, progress, ratio, stdout_to_stderr
from speechdata.audio.container import AUDIO_CONTAINER_SCHEMA, CONTAINER_PARQUET_OPTIONS, ROW_GROUP_BYTES
from speechdata.io.keyed_stream import BATCH_ROWS, STREAM_BUFFER_BYTES

MB = 1e6


def payload_table(megabytes: float, utterance_kb: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    count = max(1, int(megabytes * MB / (utterance_kb * 1000)))
    payloads = [rng.integers(0, 256, utterance_kb * 1000, dtype=np.uint8).tobytes() for _ in range(count)]
    n_samples = utterance_kb * 1000 // 2
    return pa.table(
        {
            "utt_id": [f"u{n:07d}" for n in range(count)],
            "sample_rate": pa.array([24_000] * count, pa.int32()),
            "n_samples": pa.array([n_samples] * count, pa.int64()),
            "duration_s": [n_samples / 24_000] * count,
            "codec": ["pcm16"] * count,
            "clipped_share": pa.array([0.0] * count, pa.float32()),
            "audio": pa.array(payloads, pa.binary()),
        },
        schema=AUDIO_CONTAINER_SCHEMA,
    )


def write(path: Path, table: pa.Table, checksums: bool) -> None:
    rows_per_group = max(1, ROW_GROUP_BYTES // max(1, table["audio"].nbytes // table.num_rows))
    pq.write_table(
        table,
        str(path),
        row_group_size=rows_per_group,
        write_page_checksum=checksums,
        **CONTAINER_PARQUET_OPTIONS,
    )


def read_whole(path: Path, verify: bool) -> int:
    with pa.OSFile(str(path), "rb") as handle:
        return pq.ParquetFile(handle, page_checksum_verification=verify).read().num_rows


def read_streamed(path: Path, verify: bool) -> int:
    rows = 0
    with pa.OSFile(str(path), "rb") as handle:
        parquet = pq.ParquetFile(handle, page_checksum_verification=verify, buffer_size=STREAM_BUFFER_BYTES)
        for group in range(parquet.num_row_groups):
            for batch in parquet.iter_batches(batch_size=BATCH_ROWS, row_groups=[group]):
                rows += batch.num_rows
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="16 MB and three passes, for smoke runs")
    parser.add_argument("--megabytes", type=float, default=256.0)
    parser.add_argument("--utterance-kb", type=int, default=400, help="payload per utterance (8 s of pcm16: 384)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if args.quick:
        args.megabytes, args.repeats = 16.0, 3

    with stdout_to_stderr(), tempfile.TemporaryDirectory() as tmp:
        table = payload_table(args.megabytes, args.utterance_kb, seed=0)
        checked_file, plain_file = Path(tmp) / "checked.parquet", Path(tmp) / "plain.parquet"
        write_checked, write_plain = alternating_medians(
            lambda: write(checked_file, table, True), lambda: write(plain_file, table, False), args.repeats
        )
        progress(f"write: {write_checked:.3f} s with page checksums, {write_plain:.3f} s without")
        assert read_whole(checked_file, True) == table.num_rows  # warms the page cache, proves the file reads
        whole_checked, whole_plain = alternating_medians(
            lambda: read_whole(checked_file, True), lambda: read_whole(checked_file, False), args.repeats
        )
        streamed_checked, streamed_plain = alternating_medians(
            lambda: read_streamed(checked_file, True), lambda: read_streamed(checked_file, False), args.repeats
        )
        file_mb = checked_file.stat().st_size / MB
        progress(f"whole read: {whole_checked:.3f} s verified, {whole_plain:.3f} s not ({file_mb:.0f} MB)")
        progress(f"streamed read: {streamed_checked:.3f} s verified, {streamed_plain:.3f} s not")

    emit(
        "parquet_integrity",
        {"megabytes": args.megabytes, "utterance_kb": args.utterance_kb, "repeats": args.repeats},
        {
            "file_mb": round(file_mb, 1),
            "whole_read_seconds": {"verified": round(whole_checked, 4), "unverified": round(whole_plain, 4)},
            "streamed_read_seconds": {"verified": round(streamed_checked, 4), "unverified": round(streamed_plain, 4)},
            "write_seconds": {"checksums": round(write_checked, 4), "none": round(write_plain, 4)},
            "whole_read_verified_over_unverified": ratio(whole_checked, whole_plain),
            "streamed_read_verified_over_unverified": ratio(streamed_checked, streamed_plain),
            "write_checksums_over_none": ratio(write_checked, write_plain),
            "verified_read_mb_per_s": round(file_mb / streamed_checked, 1) if streamed_checked else None,
        },
    )


if __name__ == "__main__":
    main()
