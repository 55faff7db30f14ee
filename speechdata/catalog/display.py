"""Catalog query results as aligned plain text for a terminal."""

from __future__ import annotations

import pyarrow as pa


def format_table(table: pa.Table, max_rows: int = 50, max_width: int = 60, total_rows: int | None = None) -> str:
    """An aligned plain-text rendering of ``table`` for a terminal (numbers right-aligned);
    ``total_rows``: how many rows ``table`` was taken from (default: its own)."""
    names = table.column_names
    if not names:
        return "(no columns)"
    shown = table.slice(0, max_rows).to_pylist() if max_rows >= 0 else table.to_pylist()
    numeric = [pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t) for t in table.schema.types]
    cells = [[_format_cell(row[name], max_width) for name in names] for row in shown]
    widths = [max([len(name)] + [len(r[i]) for r in cells]) for i, name in enumerate(names)]

    def line(values: list[str]) -> str:
        return "  ".join(
            value.rjust(width) if is_number else value.ljust(width)
            for value, width, is_number in zip(values, widths, numeric, strict=True)
        ).rstrip()

    out = [line(list(names)), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in cells)
    total = table.num_rows if total_rows is None else total_rows
    noun = "row" if total == 1 else "rows"
    out.append(f"({len(shown)} of {total} {noun} shown)" if len(shown) < total else f"({total} {noun})")
    return "\n".join(out)


def _format_cell(value: object, max_width: int) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        text = f"{value:.4f}" if abs(value) < 1e9 else f"{value:.4g}"
    else:
        text = str(value).replace("\n", "\\n").replace("\t", "\\t")
    return text if len(text) <= max_width else text[: max_width - 3] + "..."
