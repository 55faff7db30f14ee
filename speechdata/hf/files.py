"""A split's parquet files: written under a build folder, rolled at a size, moved into the Hub layout.

A split is written in *parts*, one per shard whose segments it holds, so a new shard adds files
and never rewrites another shard's. Files are named
``<split>-NNNNN-of-NNNNN-shard-<part>-<content>.parquet``: the Hub's convention (the count is the
part's), the first 10 hex digits of the SHA-256 of the shard id, and the first 12 of the file's
SHA-256. (Files written before parts lack ``shard-<part>``.) A split whose content changes is
therefore written under new names, so ``datasets``' cache (keyed by the data files) can never
serve the old rows; a split that does not change keeps its names. Each part is written
(atomically) as ``<split>-<part>-NNNNN.parquet`` in the build folder and renamed into
``hf/<dataset>/<country>/`` when the part is complete; the part's old files (and strays of a killed
build) are removed, the other parts' files are never touched.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from speechdata.alignment.pseudo_labels import TEXT_SOURCE_ASR
from speechdata.io import layout
from speechdata.io.storage import DataRoot

FILE_NAME = re.compile(
    r"^(?P<split>\w+(?:\.\w+)*)-(?P<index>\d{5})-of-(?P<count>\d{5})"
    r"(?:-shard-(?P<part>[0-9a-f]{10}))?(?:-(?P<content>[0-9a-f]{12}))?\.parquet$"
)
PART_DIGITS = 10
CONTENT_DIGITS = 12
PARQUET_RESERVE = 0.01
"""Share of a size budget kept for parquet's own bytes (footer, page headers, text columns' overhead)."""


@dataclass
class SplitFiles:
    split: str
    files: list[dict] = field(default_factory=list)
    """``path_in_repo``, ``rows``, ``pseudo_labels`` (rows whose ``text_source`` is ``asr``), ``bytes``,
    ``sha256`` per file (and, until committed, its ``(shard_id, key)`` rows)."""

    @property
    def rows(self) -> int:
        return sum(f["rows"] for f in self.files)

    @property
    def bytes(self) -> int:
        return sum(f["bytes"] for f in self.files)


class SplitSink:
    """Parquet files of one split, rolled at ``max_file_bytes``, moved into place when the split is complete."""

    def __init__(
        self,
        data_root: DataRoot,
        dataset: str,
        country: str,
        split: str,
        schema: pa.Schema,
        max_file_bytes: int,
        shard_id: str,
    ):
        self.data_root, self.dataset, self.country, self.split = data_root, dataset, country, split
        self.schema, self.max_file_bytes = schema, max_file_bytes
        self.shard_id, self.part = shard_id, part_tag(shard_id)
        self.build_dir = layout.hf_build_dir(dataset, country)
        self.parts: list[dict] = []
        self.payload_bytes = 0
        self._stack = contextlib.ExitStack()
        self._writer = None
        self.result = SplitFiles(split)

    def append(self, tables: pa.Table | Iterable[pa.Table], payload: int) -> None:
        """One recording's rows (``payload`` bytes), in the current file or a new one: a table, or the
        tables of a long recording (one row group each)."""
        current = self.parts[-1]["payload"] if self.parts else 0
        if self._writer is None or (current and current + payload > self.max_file_bytes * (1 - PARQUET_RESERVE)):
            self._roll()
        part = self.parts[-1]
        for table in [tables] if isinstance(tables, pa.Table) else tables:
            self._writer.write_table(table)
            part["rows"] += table.num_rows
            if "text_source" in table.column_names:
                part["pseudo_labels"] += pc.sum(pc.equal(table["text_source"], TEXT_SOURCE_ASR)).as_py() or 0
            part["keys"].extend(zip(table["shard_id"].to_pylist(), table["key"].to_pylist(), strict=True))
        part["payload"] += payload
        self.payload_bytes += payload

    def _roll(self) -> None:
        self._stack.close()
        self._stack = contextlib.ExitStack()
        relative = f"{self.build_dir}/{self.split}-{self.part}-{len(self.parts):05d}.parquet"
        self._writer = self._stack.enter_context(self.data_root.parquet_writer(relative, self.schema))
        self.parts.append({"relative": relative, "rows": 0, "pseudo_labels": 0, "payload": 0, "keys": []})

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._stack.close()

    def finish(self) -> None:
        self._stack.close()
        fs = self.data_root.fs
        count = len(self.parts)
        final_dir = layout.hf_dataset_file(self.dataset, self.country)
        stale = {
            p
            for p in fs.glob(self.data_root.path(f"{final_dir}/{self.split}-*-shard-{self.part}-*.parquet"))
            if (m := FILE_NAME.match(p.rsplit("/", 1)[-1])) and m["split"] == self.split and m["part"] == self.part
        }
        for index, part in enumerate(self.parts):
            sha256 = file_sha256(fs, self.data_root.path(part["relative"]))
            name = f"{self.split}-{index:05d}-of-{count:05d}-shard-{self.part}-{sha256[:CONTENT_DIGITS]}.parquet"
            target = self.data_root.path(f"{final_dir}/{name}")
            fs.makedirs(self.data_root.path(final_dir), exist_ok=True)
            fs.mv(self.data_root.path(part["relative"]), target)
            stale.discard(target)
            self.result.files.append(
                {
                    "path_in_repo": f"{self.country}/{name}",
                    "rows": part["rows"],
                    "pseudo_labels": part["pseudo_labels"],
                    "bytes": int(fs.size(target)),
                    "sha256": sha256,
                    "keys": part["keys"],
                }
            )
        for path in stale:
            fs.rm(path)


def part_tag(shard_id: str) -> str:
    """The part of a split that holds ``shard_id``'s segments, as its files name it."""
    return hashlib.sha256(shard_id.encode()).hexdigest()[:PART_DIGITS]


def file_sha256(fs, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()
