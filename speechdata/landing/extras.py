"""The namespace for user columns: every landed column outside the contract rides in one field.

``extra`` is a JSON object per row (a string column, the same type in every shard), carried from
``metadata.parquet`` through ``utterances.parquet`` into every shard manifest. A user column can
therefore never shadow or collide with a pipeline column, whatever its name (``tar_url``,
``duration_s``, ``extra`` itself), and every manifest has the same columns: a plain
``read_parquet('manifests/*/*.parquet')`` works with no union option. Query a field in DuckDB with
``json_extract_string(extra, '$.speaker')``, in polars with ``pl.col("extra").str.json_path_match``.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math

import pyarrow as pa

EXTRA_COLUMN = "extra"
EXTRA_FIELD = pa.field(EXTRA_COLUMN, pa.string(), nullable=False)


def _jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN/inf; a missing value is what they mean in a metadata column
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time, datetime.timedelta, decimal.Decimal)):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def pack_extras(table: pa.Table, names: list[str]) -> pa.Array:
    """One JSON object per row holding ``names`` (sorted keys, so equal rows give equal strings)."""
    columns = {name: table.column(index).to_pylist() for index, name in enumerate(table.column_names) if name in names}
    rows = []
    for row in range(table.num_rows):
        record = {name: _jsonable(values[row]) for name, values in sorted(columns.items())}
        rows.append(json.dumps(record, sort_keys=True, ensure_ascii=False, allow_nan=False))
    return pa.array(rows, pa.string())


def unpack_extras(table: pa.Table, fields: list[pa.Field]) -> pa.Table:
    """``table`` plus one typed column per field, read from its ``extra`` JSON (null when absent).

    A field already present as a real column is left as it is (an index written before the namespace).
    """
    wanted = [f for f in fields if f.name not in table.column_names]
    if not wanted:
        return table
    if EXTRA_COLUMN in table.column_names:
        records = [json.loads(text) if text else {} for text in table[EXTRA_COLUMN].to_pylist()]
    else:
        records = [{}] * table.num_rows
    for field in wanted:
        values = [record.get(field.name) for record in records]
        try:
            array = pa.array(values, field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            array = pa.array([None if v is None else str(v) for v in values], pa.string()).cast(field.type, safe=False)
        table = table.append_column(field, array)
    return table
