"""The landing contract: what a raw shard must look like, checked column by column and row by row.

Shard-level problems (no metadata, a missing or mistyped column) make the whole shard unusable and
raise :class:`ContractError`, whose message names the file, the column and the rule. Row-level
problems (a duplicate or dotted ``utt_id``, a bad segment) become :class:`~speechdata.accounting.rejects.Reject`
records and the rest of the shard goes on.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from speechdata.accounting.rejects import Reject
from speechdata.audio.truth import has_words
from speechdata.io.storage import read_parquet_handle
from speechdata.landing.countries import country_problem, is_country_code
from speechdata.landing.extras import EXTRA_FIELD, pack_extras

UTT_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]+$")
MAX_UTT_ID_LENGTH = 200
"""An utt id names files (``<utt>.ctm``, ``<utt>.flac``, their ``._tmp-<12 hex>-`` temp names): 200
characters keep every such name under the 255-byte limit of common filesystems."""
LANGUAGE_PATTERN = re.compile(r"^[a-z]{2}$")

REQUIRED_COLUMNS: dict[str, pa.DataType] = {
    "utt_id": pa.string(),
    "audio_path": pa.string(),
}
"""Columns a shard cannot do without."""

OPTIONAL_COLUMNS: dict[str, pa.DataType] = {
    "text": pa.string(),
    "language": pa.string(),
    "country": pa.string(),
    "start_s": pa.float64(),
    "end_s": pa.float64(),
    "source": pa.string(),
}
"""Contract columns whose values may be null; an absent one is read as all nulls."""

CONTRACT_COLUMNS = [*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS]

CONTRACT_FIELDS = [pa.field(name, kind) for name, kind in {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}.items()]
"""The contract's columns as typed fields, in order: what every producer of ``metadata.parquet`` starts with."""


class ContractError(ValueError):
    """A landed shard breaks the contract as a whole. The message names file, column and rule."""

    def __init__(self, file: str, column: str | None, rule: str):
        self.file, self.column, self.rule = file, column, rule
        where = f"{file}, column {column!r}" if column else file
        super().__init__(f"{where}: {rule}")


def _accepts(actual: pa.DataType, expected: pa.DataType) -> bool:
    if pa.types.is_null(actual):
        return True
    if pa.types.is_string(expected):
        return pa.types.is_string(actual) or pa.types.is_large_string(actual)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(actual) or pa.types.is_integer(actual) or pa.types.is_decimal(actual)
    return actual.equals(expected)


def read_metadata(handle, file_label: str) -> pa.Table:
    """Read ``metadata.parquet`` and coerce it to the contract's types.

    Raises :class:`ContractError` for an unreadable file, a repeated column name, a missing required
    column or a column of the wrong type. Every other column is packed into the ``extra`` JSON field
    (:mod:`speechdata.landing.extras`), carried through to the manifests.
    """
    try:
        table = read_parquet_handle(handle)
    except Exception as exc:  # pyarrow raises several types for a corrupt footer
        raise ContractError(file_label, None, f"not a readable parquet file ({exc})") from exc
    repeated = sorted(name for name, count in Counter(table.column_names).items() if count > 1)
    if repeated:
        raise ContractError(file_label, repeated[0], "column names must be unique: the name appears more than once")
    for column in REQUIRED_COLUMNS:
        if column not in table.column_names:
            raise ContractError(
                file_label, column, f"required column is missing (have: {', '.join(table.column_names)})"
            )
    for column, expected in {**REQUIRED_COLUMNS, **OPTIONAL_COLUMNS}.items():
        if column not in table.column_names:
            table = table.append_column(column, pa.nulls(table.num_rows, expected))
            continue
        actual = table.schema.field(column).type
        if not _accepts(actual, expected):
            raise ContractError(file_label, column, f"must be of type {expected}, found {actual}")
        if not actual.equals(expected):
            index = table.column_names.index(column)
            # Integers wider than a float64's mantissa (an int64 start_s of 2**62 + 1) would make a safe
            # cast raise; the value is absurd as seconds anyway and the row checks reject it by name.
            table = table.set_column(index, column, pc.cast(table[column], expected, safe=False))
    extras = [c for c in table.column_names if c not in CONTRACT_COLUMNS]
    # Every other column rides in the one namespace field: it can never shadow a pipeline column.
    return table.select(CONTRACT_COLUMNS).append_column(EXTRA_FIELD, pack_extras(table, extras))


def _safe_relative_path(path: str) -> bool:
    if not path or path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
        return False
    parts = path.replace("\\", "/").split("/")
    return all(part not in ("", ".", "..") for part in parts)


@dataclass(frozen=True)
class RowCheck:
    """Outcome of the row-level contract checks: which rows survive, and a reject for each that does not."""

    valid_rows: list[int]
    rejects: list[Reject]


def check_rows(table: pa.Table, stage: str, file_label: str = "metadata.parquet") -> RowCheck:
    """Row-level rules that need no audio: ``utt_id`` form and uniqueness, path safety, value formats.

    ``file_label`` names the metadata file in the rejects' details that name a field's value."""
    utt_ids = table["utt_id"].to_pylist()
    audio_paths = table["audio_path"].to_pylist()
    languages = table["language"].to_pylist()
    countries = table["country"].to_pylist()
    starts = table["start_s"].to_pylist()
    ends = table["end_s"].to_pylist()
    texts = table["text"].to_pylist()
    id_counts = Counter(u for u in utt_ids if u is not None)

    valid: list[int] = []
    rejects: list[Reject] = []
    for row, utt_id in enumerate(utt_ids):
        problem = _row_problem(
            utt_id,
            id_counts,
            audio_paths[row],
            languages[row],
            countries[row],
            starts[row],
            ends[row],
            texts[row],
            file_label,
        )
        if problem is None:
            valid.append(row)
        else:
            reason, detail = problem
            rejects.append(Reject(utt_id, stage, reason, f"metadata row {row}: {detail}"))
    return RowCheck(valid, rejects)


def _row_problem(
    utt_id, id_counts, audio_path, language, country, start_s, end_s, text=None, file_label="metadata.parquet"
):
    utt_id_problem = _utt_id_problem(utt_id, id_counts)
    if utt_id_problem is not None:
        return utt_id_problem
    if text is not None and text.strip() and not has_words(text):
        return "no_words", f"text {text[:80]!r} has no word character (punctuation or symbols only)"
    if audio_path is None or audio_path == "":
        return "missing_audio_path", "audio_path is null or empty"
    if not _safe_relative_path(audio_path):
        return "unsafe_audio_path", f"audio_path {audio_path!r} must be relative, without '..' or empty parts"
    if language is not None and not LANGUAGE_PATTERN.match(language):
        return "invalid_language", f"language {language!r} is not a lowercase ISO 639-1 code"
    if country is not None and (problem := country_problem(country)) is not None:
        return "invalid_country", f"{file_label}, field 'country': {problem}"
    for name, value in (("start_s", start_s), ("end_s", end_s)):
        if value is not None and (value != value or value < 0 or value == float("inf")):
            return "invalid_segment", f"{name}={value} must be a finite number >= 0"
    if start_s is not None and end_s is not None and not start_s < end_s:
        return "segment_start_not_before_end", f"start_s={start_s} must be < end_s={end_s}"
    return None


def _utt_id_problem(utt_id, id_counts) -> tuple[str, str] | None:
    if utt_id is None or utt_id == "":
        return "missing_utt_id", "utt_id is null or empty"
    if len(utt_id) > MAX_UTT_ID_LENGTH:
        return "utt_id_too_long", f"utt_id of {len(utt_id)} characters is longer than {MAX_UTT_ID_LENGTH}"
    if "." in utt_id:
        return "utt_id_has_dot", f"utt_id {utt_id!r} contains '.', which WebDataset reads as an extension"
    if not UTT_ID_PATTERN.match(utt_id):
        return "invalid_utt_id", f"utt_id {utt_id!r} must match [A-Za-z0-9_-]+"
    if id_counts[utt_id] > 1:
        return "duplicate_utt_id", f"utt_id {utt_id!r} appears {id_counts[utt_id]} times in the shard"
    return None


def partition_values(
    handle, file_label: str, *, countries_only_where: str | None = None
) -> tuple[list[str], list[str]]:
    """The distinct valid ``country`` and ``language`` values of a metadata file (for partitions).

    ``countries_only_where``: a column that must be filled for a row's country to count (the
    ``country`` partitions serve the HF dataset, which takes only shards carrying ASR transcripts:
    a bridge shard's country would be a partition nothing ever builds). Values that break the
    contract are left out here; :func:`check_rows` rejects their rows later.
    """
    try:
        schema = pq.read_schema(handle)
        wanted = ("country", "language", countries_only_where) if countries_only_where else ("country", "language")
        columns = [c for c in wanted if c in schema.names]
        handle.seek(0)
        table = read_parquet_handle(handle, columns)
    except Exception as exc:
        raise ContractError(file_label, None, f"not a readable parquet file ({exc})") from exc

    def distinct(rows, column: str, is_valid) -> list[str]:
        if column not in rows.column_names:
            return []
        values = pc.unique(rows[column]).to_pylist()
        return sorted(v for v in values if isinstance(v, str) and is_valid(v))

    country_rows = table
    if countries_only_where:
        if countries_only_where in table.column_names:
            country_rows = table.filter(pc.is_valid(table[countries_only_where]))
        else:
            country_rows = table.slice(0, 0)
    return distinct(country_rows, "country", is_country_code), distinct(table, "language", LANGUAGE_PATTERN.match)
