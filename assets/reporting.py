"""Turn a stage summary into the metadata people read in the Dagster UI."""

from __future__ import annotations

import time

import dagster as dg
import pyarrow as pa

from speechdata.stage import StageSummary


def stage_metadata(summary: StageSummary) -> dict[str, dg.RawMetadataValue]:
    metadata: dict[str, dg.RawMetadataValue] = {
        "dagster/row_count": summary.rows_out,
        "utterances_in": summary.rows_in,
        "rejects": len(summary.rejects),
        "reject_share": round(summary.reject_share, 6),
        "rejects_by_reason": dg.MetadataValue.json(summary.rejects_by_reason),
        "hours": round(summary.hours, 6),
        "audio_seconds_per_second": round(summary.audio_seconds_per_second, 2),
        "compute_seconds": round(summary.compute_seconds, 3),
    }
    for name, uri in summary.outputs.items():
        metadata[f"{name}_uri"] = dg.MetadataValue.path(uri)
    return metadata


def device_metadata(device) -> dict:
    """Where a GPU step ran: device, dtype and (on CUDA) peak memory. ``device``: a TorchDeviceResource."""
    peak = device.peak_memory_gb()
    metadata = {"device": str(device.torch_device()), "dtype": str(device.dtype()).removeprefix("torch.")}
    if peak is not None:
        metadata["gpu_memory_peak_gb"] = round(peak, 3)
    return metadata


def column_schema(schema: pa.Schema) -> dg.TableSchema:
    """A parquet schema as ``dagster/column_schema``: the UI's column table for a manifest or index."""
    return dg.TableSchema(columns=[dg.TableColumn(f.name, str(f.type)) for f in schema])


def markdown_preview(table: pa.Table, columns: list[str], rows: int = 5) -> dg.MetadataValue:
    """A few rows as a markdown table, for the asset's materialization page."""
    return markdown_rows(table.select([c for c in columns if c in table.column_names]).slice(0, rows).to_pylist())


def markdown_rows(shown: list[dict]) -> dg.MetadataValue:
    """Rows (dicts with the same keys) as a markdown table."""
    if not shown:
        return dg.MetadataValue.md("_no rows_")
    header = list(shown[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in shown:
        lines.append("| " + " | ".join(_cell(row[c]) for c in header) + " |")
    return dg.MetadataValue.md("\n".join(lines))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3f}"
    text = "" if value is None else str(value)
    text = text.replace("|", "\\|")
    return text if len(text) <= 60 else text[:57] + "..."


def progress_logger(context: dg.AssetExecutionContext, verb: str, shard_id: str | None = None, every_s: float = 10.0):
    """A ``(done, total[, audio_s])`` callback that logs progress at most every ``every_s`` seconds
    (and once at the end), with audio seconds per second when the stage reports audio."""
    started = last = time.monotonic()
    label = shard_id or context.partition_key

    def log(done: int, total: int, audio_s: float | None = None) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last < every_s and done != total:
            return
        last = now
        rate = f", {audio_s / max(now - started, 1e-9):.1f} audio s/s" if audio_s is not None else ""
        context.log.info(f"{label}: {verb} {done}/{total} utterances{rate}")

    return log


def utterance_check_results(failing: dict[str, list[str]]) -> list[dg.AssetCheckResult]:
    """One check result per check name: passed when no utterance fails it, with a few examples."""
    return [
        dg.AssetCheckResult(
            check_name=name,
            passed=not failed,
            metadata={"failing_utterances": len(failed), "examples": dg.MetadataValue.json(failed[:5])},
        )
        for name, failed in failing.items()
    ]


def accounting_check(
    name: str, summary: StageSummary, rows_in_as: str, rows_out_as: str, rejected: int | None = None
) -> list[dg.AssetCheckResult]:
    """The check that every row in came out or was rejected: ``rows_out + rejected == rows_in``.

    ``rejected`` defaults to the number of rejects; pass the distinct rejected utterances where a
    stage can reject one utterance twice. The metadata names the counts ``rows_in_as`` / ``rows_out_as``.
    """
    passed = summary.rows_out + (len(summary.rejects) if rejected is None else rejected) == summary.rows_in
    metadata = {rows_in_as: summary.rows_in, rows_out_as: summary.rows_out, "rejected": len(summary.rejects)}
    return [dg.AssetCheckResult(check_name=name, passed=passed, metadata=metadata)]


def log_stage(context: dg.AssetExecutionContext, summary: StageSummary, done: str, detail: str = "") -> None:
    """One line per shard: rows out of rows in, the rejects by reason, the audio rate."""
    context.log.info(
        f"{summary.shard_id}: {summary.rows_out}/{summary.rows_in} {done}{detail}, "
        f"rejects {summary.rejects_by_reason}, {summary.audio_seconds_per_second:.0f} audio s/s"
    )
