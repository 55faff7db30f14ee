"""Exports of a selection of samples: a NeMo JSONL manifest, a WebDataset tar list."""

from __future__ import annotations

import io
import json
import os
from typing import IO

import pyarrow as pa

from speechdata.io.storage import atomic_open, filesystem_for


def export_nemo_manifest(
    table: pa.Table, path_or_handle: str | os.PathLike | IO, audio_url_column: str = "tar_url"
) -> int:
    """Write ``table``'s samples as a NeMo JSONL manifest; return the number of lines.

    One line per row: ``{"audio_filepath": "<tar_url>#<key>.wav", "duration": <duration_s>,
    "text": <text or "">, "lang": <language>}``. The ``#<key>.wav`` convention: ``tar_url`` is
    the WebDataset tar that holds the sample and the fragment after the last ``#`` is the name of
    its audio member inside that tar (keys have no dots, so ``<key>.wav`` is the whole member
    name). A loader splits at the last ``#``, opens the tar (or reads the manifest's
    ``offset``/``size`` byte range) and reads that member. NeMo's own tarred datasets take the tar
    list and the member name separately (``tarred_audio_filepaths`` and ``audio_filepath``), so
    feed them ``audio_filepath.rsplit("#", 1)``.

    ``path_or_handle``: a local path or fsspec URL (written atomically) or an open text/binary handle.
    """
    needed = [audio_url_column, "key", "duration_s", "text", "language"]
    missing = [c for c in needed if c not in table.column_names]
    if missing:
        raise ValueError(f"cannot export a NeMo manifest: the table lacks column(s) {', '.join(missing)}")

    def write_lines(handle) -> int:
        binary = not isinstance(handle, io.TextIOBase) and "b" in getattr(handle, "mode", "b")
        lines = 0
        for batch in table.select(needed).to_batches(max_chunksize=65_536):
            urls, keys, durations, texts, langs = (batch.column(i).to_pylist() for i in range(5))
            chunk = "".join(
                json.dumps(
                    {"audio_filepath": f"{url}#{key}.wav", "duration": duration, "text": text or "", "lang": lang},
                    ensure_ascii=False,
                )
                + "\n"
                for url, key, duration, text, lang in zip(urls, keys, durations, texts, langs)
            )
            handle.write(chunk.encode("utf-8") if binary else chunk)
            lines += batch.num_rows
        return lines

    if hasattr(path_or_handle, "write"):
        return write_lines(path_or_handle)
    fs, path = filesystem_for(os.fspath(path_or_handle))
    with atomic_open(fs, path, "wb") as handle:
        return write_lines(handle)


def export_tar_urls(table: pa.Table, column: str = "tar_url") -> list[str]:
    """The distinct tar URLs of ``table``'s samples, sorted (a WebDataset shard list)."""
    if column not in table.column_names:
        raise ValueError(f"the table has no {column!r} column")
    return sorted({url for url in table.column(column).to_pylist() if url is not None})
