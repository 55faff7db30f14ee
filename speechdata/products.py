"""The product lines: one record each, the only place a product line is described.

A product line is something the platform builds per shard from the landed utterances (bridge tuples,
ASR FLACs, VAD chunks, streaming translation segments, the HF dataset's utterance index). Its
:class:`ProductLine` says which stages' rejects it owns and where its per-shard output is, which is
all the ledgers (:mod:`speechdata.ledgers`) and the catalog's accounting
(:mod:`speechdata.catalog.accounting`) need: both iterate :data:`PRODUCT_LINES`, so adding a product
line is adding its record here (docs/contributing.md).

The registry is read when it is used, never copied at import: code that iterates it reads
``speechdata.products.PRODUCT_LINES`` (or calls :func:`product_lines`) at call time.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from speechdata.bridge.manifest import manifest_path
from speechdata.hf.shard_paths import HF_STAGE, published_index_parts
from speechdata.io import layout

PRODUCT_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""A product name is a SQL string, a metadata key segment (``ledger/<product>/landed``) and a column value."""

_SHARD_PLACEHOLDER = layout.KEY_PLACEHOLDER
"""Never in a path: where a shard id goes when an output path function is turned into a glob or regex."""


@dataclass(frozen=True)
class ProductLine:
    """One product line: its stages and its per-shard output, as the ledgers and the catalog read it."""

    name: str
    description: str
    """One line for people: what the product is and who uses it."""
    stages: tuple[str, ...]
    """The stages, in pipeline order, whose rejects this product owns: an utterance one of them rejected
    is accounted for; counted under the reason of the earliest stage that rejected it."""
    output: Callable[[str], str]
    """Shard id -> the product's per-shard output file, relative to the data root: one parquet file
    whose :attr:`id_column` names every utterance the product holds for the shard. Its file name may
    hold one ``*`` when the product writes one file per part of the shard (the ``hf`` product: one
    per country, so countries built in parallel never rewrite each other's file): the product's ids
    are then those of every matching file, and it is built for the shard once one exists."""
    id_column: str
    ids_are_lists: bool = False
    """True when each row holds a list of utterance ids (a VAD chunk spans several utterances)."""
    shard_column: str | None = None
    """A column of the output's rows that names their shard. The catalog's accounting then takes a
    row's shard from it (as the ``samples`` view does for bridge manifests) instead of from the file's
    path; which shard a *file* belongs to always comes from its path (:attr:`shard_regex`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))  # a list would make the record mutable
        if not PRODUCT_NAME_PATTERN.match(self.name):
            raise ValueError(f"product name {self.name!r} must match {PRODUCT_NAME_PATTERN.pattern}")
        if not self.stages:
            raise ValueError(f"product line {self.name!r}: stages must name at least the landing stage")
        output = self.output(_SHARD_PLACEHOLDER)
        if output.count(_SHARD_PLACEHOLDER) != 1:
            raise ValueError(f"product line {self.name!r}: its output path must name the shard exactly once")
        if "*" in output.rpartition("/")[0] or output.count("*") > 1:
            raise ValueError(f"product line {self.name!r}: only its file name may hold a '*', and only one")

    @property
    def output_has_parts(self) -> bool:
        """Whether a shard's output is every file matching :attr:`output` (one per part) rather than one file."""
        return "*" in self.output(_SHARD_PLACEHOLDER)

    @property
    def output_glob(self) -> str:
        """Every shard's output, relative to the data root (the catalog's ``read_parquet`` glob)."""
        return self.output("*")

    @property
    def shard_regex(self) -> str:
        """A regex whose group 1 is the shard of an output file's path (a root-relative path after a
        slash, or a full URL): anchored at the end, so another file in the same folder never matches."""
        before, after = self.output(_SHARD_PLACEHOLDER).split(_SHARD_PLACEHOLDER)
        return "/" + re.escape(before) + "([^/]+)" + re.escape(after).replace(r"\*", "[^/]+") + "$"


PRODUCT_LINES: tuple[ProductLine, ...] = (
    ProductLine(
        name="bridge",
        description="12.5 Hz bridge tuples (audio, aligned words, text and audio features) in WebDataset tars.",
        stages=("raw_shards", "normalized_audio", "alignments", "frame_grids", "qwen_hidden_states", "wavlm_features"),
        output=manifest_path,
        id_column="key",
        shard_column="shard",
    ),
    ProductLine(
        name="asr",
        description="16 kHz FLAC per utterance and the NeMo manifests for ASR training.",
        stages=("raw_shards", "asr_flac"),
        output=layout.asr_flac_index,
        id_column="utt_id",
    ),
    ProductLine(
        name="vad",
        description="Speech segments per landed audio file, with the streaming tar they are read from.",
        stages=("raw_shards", "vad_segments"),
        output=layout.vad_segments,
        id_column="utt_ids",
        ids_are_lists=True,
    ),
    ProductLine(
        name="translation",
        description="Streaming translation segments per utterance and latency level, quality-scored.",
        stages=("raw_shards", "normalized_audio", "alignments", "streaming_segments"),
        output=layout.streaming_segments,
        id_column="utt_id",
    ),
    ProductLine(
        name="hf",
        # Counted from what the dataset holds (its per-country states), not from the shard's own
        # index: a row the publishing lost then shows as unaccounted. Its filters are its rejects.
        description="The Hugging Face dataset: the utterances its per-country states hold (written, pending, failed).",
        stages=("raw_shards", HF_STAGE),
        output=published_index_parts,
        id_column="utt_id",
    ),
)
"""The product lines, in the order ledgers and reports list them."""


def product_lines() -> tuple[ProductLine, ...]:
    """The registry as it is now, checked: at least one line, names unique."""
    if not PRODUCT_LINES:
        raise ValueError("no product line is registered: speechdata.products.PRODUCT_LINES is empty")
    names = [line.name for line in PRODUCT_LINES]
    duplicated = sorted({name for name in names if names.count(name) > 1})
    if duplicated:
        raise ValueError(f"product lines registered twice: {', '.join(duplicated)}")
    return PRODUCT_LINES


def product_line(name: str) -> ProductLine:
    """The registered product line called ``name``."""
    for line in product_lines():
        if line.name == name:
            return line
    raise KeyError(f"unknown product {name!r}: one of {', '.join(line.name for line in PRODUCT_LINES)}")
