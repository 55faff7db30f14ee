"""The product lines: one record each, the one declaration of a product line.

A product line is something the platform builds per shard from the landed utterances (bridge tuples,
ASR FLACs, VAD chunks, streaming translation segments, the HF dataset's utterance index). Its
:class:`ProductLine` names its package, the stages it builds (and the module of each stage's entry
point), the stages whose rejects it owns, its per-shard output and the asset that writes it, what
the catalog reads of it and its docs page. Everything that iterates the product lines reads them
here: the ledgers (:mod:`speechdata.accounting.ledgers`), the catalog's accounting
(:mod:`speechdata.catalog.accounting`), the catalog refresh sensor (which assets it watches), the
stage-contract test (which stage entry points it checks) and the code location's load-time check
that the asset graph agrees with the records. Adding a product line is its own package, its asset
module and its record here (docs/contributing.md).

The registry is read when it is used, never copied at import: code that iterates it reads
``speechdata.products.PRODUCT_LINES`` (or calls :func:`product_lines`) at call time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from speechdata.io import layout

PRODUCT_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
"""A product name is a SQL string, a metadata key segment (``ledger/<product>/landed``) and a column value."""

_SHARD_PLACEHOLDER = layout.KEY_PLACEHOLDER
"""Never in a path: where a shard id goes when an output path function is turned into a glob or regex."""


SHARED_STAGES: Mapping[str, str] = MappingProxyType(
    {
        "raw_shards": "speechdata.landing.ingest",
        "normalized_audio": "speechdata.landing.ingest",
        "alignments": "speechdata.alignment.stage",
        "quality_signals": "speechdata.quality.stage",
        "quality_decisions": "speechdata.quality.stage",
        "near_duplicates": "speechdata.quality.near_duplicates",
    }
)
"""The per-shard stages upstream of the product lines, no product line's own: stage -> the module
holding its ``run_<stage>`` entry point (:mod:`speechdata.accounting.stage`). Landing and normalization feed
every line, the alignments several, and the quality stages decide for every line."""


@dataclass(frozen=True, kw_only=True)
class ProductLine:
    """One product line, as the ledgers, the catalog, its sensor and the code location read it."""

    name: str
    description: str
    """One line for people: what the product is and who uses it."""
    package: str
    """Its own package under ``speechdata`` (no Dagster): its stages, schemas and publishing."""
    builds: Mapping[str, str]
    """The per-shard stages the line adds to :data:`SHARED_STAGES`, in pipeline order: stage -> the
    module holding its ``run_<stage>`` entry point (:mod:`speechdata.accounting.stage`), each the asset of the
    same name. Empty when the line's output is built by steps over many shards (the HF dataset)."""
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
    id_part_separator: str | None = None
    """An id holding this separator names a part of the utterance before it: the bridge packs a long
    recording as one sample per segment, keyed ``<utt_id>+<index>`` (docs/bridge-tuples.md)."""
    shard_column: str | None = None
    """A column of the output's rows that names their shard. The catalog's accounting then takes a
    row's shard from it (as the ``samples`` view does for bridge manifests) instead of from the file's
    path; which shard a *file* belongs to always comes from its path (:attr:`shard_regex`)."""
    output_asset: str
    """The asset that writes :attr:`output`. The code location checks at load that it exists and that
    every stage of :attr:`stages` is it or upstream of it, so the record cannot drift from the graph."""
    catalog_assets: tuple[str, ...] = ()
    """Further assets whose files the catalog reads for this line (its views, beside the output): the
    catalog refresh sensor watches :attr:`output_asset` and these."""
    catalog_views: tuple[str, ...] = ()
    """Views the catalog builds over this line's files, beside ``product_accounting`` and
    ``product_rejects`` (which every line has)."""
    docs: str
    """Its contract page, relative to ``docs/`` (listed in mkdocs.yml): output, columns, reject reasons."""

    def __post_init__(self) -> None:
        # Lists or dicts would make the record mutable.
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "builds", MappingProxyType(dict(self.builds)))
        object.__setattr__(self, "catalog_assets", tuple(self.catalog_assets))
        object.__setattr__(self, "catalog_views", tuple(self.catalog_views))
        if not PRODUCT_NAME_PATTERN.match(self.name):
            raise ValueError(f"product name {self.name!r} must match {PRODUCT_NAME_PATTERN.pattern}")
        if not self.stages:
            raise ValueError(f"product line {self.name!r}: stages must name at least the landing stage")
        output = self.output(_SHARD_PLACEHOLDER)
        if output.count(_SHARD_PLACEHOLDER) != 1:
            raise ValueError(f"product line {self.name!r}: its output path must name the shard exactly once")
        if "*" in output.rpartition("/")[0] or output.count("*") > 1:
            raise ValueError(f"product line {self.name!r}: only its file name may hold a '*', and only one")
        if not self.package.startswith("speechdata."):
            raise ValueError(f"product line {self.name!r}: its package {self.package!r} is not under speechdata")
        shared = sorted(set(self.builds) & set(SHARED_STAGES))
        if shared:
            raise ValueError(f"product line {self.name!r} builds shared stage(s) {shared}: name them in stages only")

    def __hash__(self) -> int:
        return hash(self.name)

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
        package="speechdata.bridge",
        builds={
            "frame_grids": "speechdata.bridge.grid_stage",
            "qwen_hidden_states": "speechdata.features.stage",
            "wavlm_features": "speechdata.features.stage",
        },
        stages=("raw_shards", "normalized_audio", "alignments", "frame_grids", "qwen_hidden_states", "wavlm_features"),
        output=layout.shard_manifest,
        id_column="key",
        id_part_separator="+",
        shard_column="shard",
        output_asset="shard_manifest",
        catalog_views=("samples", "words", "hours_by_language", "hours_by_country", "hours_by_shard"),
        docs="bridge-tuples.md",
    ),
    ProductLine(
        name="asr",
        description="16 kHz FLAC per utterance and the NeMo manifests for ASR training.",
        package="speechdata.asr",
        builds={"asr_flac": "speechdata.asr.flac"},
        stages=("raw_shards", "asr_flac"),
        output=layout.asr_flac_index,
        id_column="utt_id",
        # A long recording is published as one FLAC per aligned segment, keyed as the bridge keys them.
        id_part_separator="+",
        output_asset="asr_flac",
        docs="asr-data.md",
    ),
    ProductLine(
        name="vad",
        description="Speech segments per landed audio file, with the streaming tar they are read from.",
        package="speechdata.vad",
        builds={"vad_segments": "speechdata.vad.stage"},
        stages=("raw_shards", "vad_segments"),
        output=layout.vad_segments,
        id_column="utt_ids",
        ids_are_lists=True,
        output_asset="vad_segments",
        docs="vad.md",
    ),
    ProductLine(
        name="translation",
        description="Streaming translation segments per utterance and latency level, quality-scored.",
        package="speechdata.translation",
        builds={
            "streaming_segments": "speechdata.translation.stage",
            "qe_scores": "speechdata.translation.qe_stage",
            "streaming_pairs": "speechdata.translation.qe_stage",
        },
        stages=("raw_shards", "normalized_audio", "alignments", "streaming_segments"),
        output=layout.streaming_segments,
        id_column="utt_id",
        output_asset="streaming_segments",
        catalog_assets=("qe_scores", "streaming_pairs"),
        docs="streaming-translation.md",
    ),
    ProductLine(
        name="hf",
        # Counted from what the dataset holds (its per-country states), not from the shard's own
        # index: a row the publishing lost then shows as unaccounted. Its filters are its rejects.
        description="The Hugging Face dataset: the utterances its per-country states hold (written, pending, failed).",
        package="speechdata.hf",
        builds={},
        stages=("raw_shards", "hf_dataset"),
        output=layout.hf_published_index_parts,
        id_column="utt_id",
        # A long recording is published as one row per aligned segment, keyed as the bridge keys them.
        id_part_separator="+",
        output_asset="hf_dataset",
        catalog_assets=("hf_split_assignments",),
        docs="hf-splits.md",
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


def shard_stage_modules() -> dict[str, str]:
    """Every per-shard stage, shared or a product line's own: stage -> the module of its ``run_<stage>``."""
    return {**SHARED_STAGES, **{stage: module for line in product_lines() for stage, module in line.builds.items()}}


def catalogued_assets() -> tuple[str, ...]:
    """The assets whose files the catalog reads, each product line's output asset first: after any of
    them materializes, the catalog is refreshed."""
    names = [name for line in product_lines() for name in (line.output_asset, *line.catalog_assets)]
    return tuple(dict.fromkeys(names))
