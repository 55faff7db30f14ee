"""What every export reads: the published samples of a data root, selected and streamed from their tars.

Only published products are read: the shard manifests (``manifests/shard=*/part-0.parquet``) and
the bridge tars they point at (each sample's ``.wav``, arrays and ``.json`` with its words). The
manifests' ``tar_url`` is resolved against the root the reader is given
(:func:`resolve_tar_path`), so a copied or moved root exports the same way.

Filters are the catalog CLI's (languages, countries, minimum alignment score, duration bounds)
and the quality signals' (``shards/<shard>/quality.parquet``: CER, WER, SNR, bandwidth, MOS, a
language the text LID confirms), applied with Arrow compute on typed values: nothing is interpolated
into a query. A sample whose shard has no quality file, or whose signal is null, fails a quality
filter: unmeasured is not a pass.
"""

from __future__ import annotations

import math
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from speechdata.bridge.manifest import MANIFEST_COLUMNS, MANIFESTS_DIR
from speechdata.io.storage import DataRoot, read_parquet
from speechdata.quality.paths import quality_signals
from speechdata.quality.text_language import primary_language

_MANIFEST_GLOB = f"{MANIFESTS_DIR}/shard=*/part-0.parquet"
_SELECTED_COLUMNS = [f.name for f in MANIFEST_COLUMNS]


@dataclass(frozen=True)
class SampleFilter:
    """The catalog CLI's selection. ``None`` keeps everything on that axis."""

    languages: tuple[str, ...] | None = None
    countries: tuple[str, ...] | None = None
    min_alignment_score: float | None = None
    min_duration_s: float | None = None
    max_duration_s: float | None = None
    max_cer: float | None = None
    """Greedy-CTC character error rate against the landed text (``quality.parquet`` ``cer``), inclusive."""
    max_wer: float | None = None
    min_snr_db: float | None = None
    min_bandwidth_hz: float | None = None
    min_mos: float | None = None
    language_confirmed: bool = False
    """Keep only samples whose text LID language is the landed one (its primary subtag)."""

    QUALITY_BOUNDS = (
        ("max_cer", "cer", "<="),
        ("max_wer", "wer", "<="),
        ("min_snr_db", "snr_db", ">="),
        ("min_bandwidth_hz", "bandwidth_hz", ">="),
        ("min_mos", "mos", ">="),
    )
    """``(field, quality.parquet column, comparison)`` of every numeric quality filter."""

    @property
    def uses_quality(self) -> bool:
        return self.language_confirmed or any(getattr(self, name) is not None for name, _, _ in self.QUALITY_BOUNDS)

    def __post_init__(self):
        for name in ("languages", "countries"):
            values = getattr(self, name)
            if values is not None:
                bad = [v for v in values if not isinstance(v, str) or not v.strip()]
                if bad:
                    raise ValueError(f"{name}: every value must be a non-empty string, got {bad!r}")
        for name in (
            "min_alignment_score",
            "min_duration_s",
            "max_duration_s",
            *(n for n, _, _ in self.QUALITY_BOUNDS),
        ):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not math.isfinite(float(value))):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        for name in ("min_duration_s", "max_duration_s"):
            value = getattr(self, name)
            if value is not None and float(value) < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if (
            self.min_duration_s is not None
            and self.max_duration_s is not None
            and self.min_duration_s > self.max_duration_s
        ):
            raise ValueError(f"min_duration_s {self.min_duration_s} > max_duration_s {self.max_duration_s}")

    def as_dict(self) -> dict:
        return {
            "languages": list(self.languages) if self.languages is not None else None,
            "countries": list(self.countries) if self.countries is not None else None,
            "min_alignment_score": self.min_alignment_score,
            "min_duration_s": self.min_duration_s,
            "max_duration_s": self.max_duration_s,
            **{name: getattr(self, name) for name, _, _ in self.QUALITY_BOUNDS},
            "language_confirmed": self.language_confirmed,
        }


def select_published_samples(root: DataRoot, selection: SampleFilter = SampleFilter()) -> pa.Table:
    """Every published sample that passes ``selection``, in (shard, tar, offset) order, with the
    manifest's fixed columns (the landed extra columns are left out: exports carry the contract's)."""
    tables = []
    for path in sorted(root.fs.glob(root.path(_MANIFEST_GLOB))):
        table = read_parquet(root.fs, path)
        for column in MANIFEST_COLUMNS:
            if column.name not in table.column_names:  # a manifest written before the column existed
                table = table.append_column(column.name, pa.nulls(table.num_rows, column.type))
        tables.append(table.select(_SELECTED_COLUMNS).cast(MANIFEST_COLUMNS))
    if not tables:
        return MANIFEST_COLUMNS.empty_table()
    table = pa.concat_tables(tables)
    mask = pa.array([True] * table.num_rows, pa.bool_())
    if selection.languages is not None:
        mask = pc.and_(mask, pc.is_in(table["language"], pa.array(selection.languages, pa.string())))
    if selection.countries is not None:
        mask = pc.and_(mask, pc.is_in(table["country"], pa.array(selection.countries, pa.string())))
    if selection.min_alignment_score is not None:
        mask = pc.and_(mask, pc.greater_equal(table["alignment_score"], float(selection.min_alignment_score)))
    if selection.min_duration_s is not None:
        mask = pc.and_(mask, pc.greater_equal(table["duration_s"], float(selection.min_duration_s)))
    if selection.max_duration_s is not None:
        mask = pc.and_(mask, pc.less_equal(table["duration_s"], float(selection.max_duration_s)))
    # A null comparison (no score) is not a pass.
    table = table.filter(pc.fill_null(mask, False))
    if selection.uses_quality:
        table = table.filter(_quality_mask(root, table, selection))
    return table.sort_by([("shard", "ascending"), ("tar_url", "ascending"), ("offset", "ascending")])


def _quality_mask(root: DataRoot, table: pa.Table, selection: SampleFilter) -> pa.Array:
    """Which rows of ``table`` pass the quality filters, from each shard's ``quality.parquet``."""
    signals: dict[tuple[str, str], dict] = {}
    columns = ["utt_id", "language", "text_language", *(column for _, column, _ in SampleFilter.QUALITY_BOUNDS)]
    for shard in sorted(set(table["shard"].to_pylist())):
        relative = quality_signals(shard)
        if root.exists(relative):
            for row in root.read_parquet(relative, columns=columns).to_pylist():
                signals[(shard, row["utt_id"])] = row
    keep = []
    for shard, key in zip(table["shard"].to_pylist(), table["key"].to_pylist(), strict=True):
        row = signals.get((shard, key))
        keep.append(row is not None and _passes(row, selection))
    return pa.array(keep, pa.bool_())


def _passes(row: dict, selection: SampleFilter) -> bool:
    for name, column, comparison in SampleFilter.QUALITY_BOUNDS:
        bound, value = getattr(selection, name), row.get(column)
        if bound is None:
            continue
        if value is None or not (value <= bound if comparison == "<=" else value >= bound):
            return False
    if selection.language_confirmed:
        landed = primary_language(row.get("language"))
        return landed is not None and row.get("text_language") == landed
    return True


def resolve_tar_path(root: DataRoot, tar_url: str) -> str:
    """The filesystem path, under ``root``, of a manifest's ``tar_url``.

    A relative reference (what the pipeline writes) is taken from the root. An absolute one (a
    manifest written before references were relative) keeps only its part from ``bridge/`` on, so
    it still resolves against the root it is read from rather than against where it was built.
    """
    if "://" not in tar_url and not tar_url.startswith("/"):
        relative = tar_url
    else:
        marker = "/bridge/"
        if marker not in tar_url:
            raise ValueError(f"tar_url {tar_url!r} is neither relative to the data root nor under a bridge/ folder")
        relative = "bridge/" + tar_url.rsplit(marker, 1)[1]
    if ".." in relative.split("/"):
        raise ValueError(f"tar_url {tar_url!r} leaves the data root")
    return root.path(relative)


@dataclass
class PublishedSample:
    """One bridge sample as published: its manifest row and its tar members (extension -> bytes)."""

    row: dict
    members: dict[str, bytes] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.row["key"]

    @property
    def shard(self) -> str:
        return self.row["shard"]

    @property
    def export_id(self) -> str:
        """Unique across shards (keys are unique only within their shard) and free of dots."""
        return f"{self.shard}__{self.key}"


def iter_published_samples(root: DataRoot, selected: pa.Table) -> Iterator[PublishedSample]:
    """The selected samples with their members, reading each tar once, front to back."""
    rows_by_tar: dict[str, dict[str, dict]] = {}
    for row in selected.to_pylist():
        rows_by_tar.setdefault(resolve_tar_path(root, row["tar_url"]), {})[row["key"]] = row
    for tar_path, rows in rows_by_tar.items():
        seen: set[str] = set()
        with root.fs.open(tar_path, "rb") as handle:
            for sample in _iter_tar_samples(handle, wanted=rows.keys()):
                sample.row = rows[sample.row["key"]]
                seen.add(sample.key)
                yield sample
        if len(seen) != len(rows):
            missing = sorted(set(rows) - seen)
            raise ValueError(
                f"{tar_path}: {len(missing)} samples of the manifest are not in the tar, e.g. {missing[:3]}"
            )


def _iter_tar_samples(handle, wanted: Iterable[str]) -> Iterator[PublishedSample]:
    """Group consecutive members by key (the bridge tars are sorted by key, then member name)."""
    wanted = set(wanted)
    current: PublishedSample | None = None
    with tarfile.open(fileobj=handle, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            key, _, extension = member.name.partition(".")
            if current is not None and current.row["key"] != key:
                yield current
                current = None
            if key not in wanted:
                continue
            if current is None:
                current = PublishedSample(row={"key": key})
            current.members[extension] = tar.extractfile(member).read()
    if current is not None:
        yield current
