"""Turn a stage summary into the metadata people read in the Dagster UI."""

from __future__ import annotations

import time

import dagster as dg
import pyarrow as pa

from speechdata.accounting.ledger_gate import UnbalancedLedger
from speechdata.accounting.stage import StageSummary


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


COLUMN_DESCRIPTIONS: dict[str, str] = {
    # The landing contract's columns (docs/landing-contract.md), carried into the index and manifests.
    "utt_id": "The utterance's id from the landed metadata: unique in its shard, names its files.",
    "audio_path": "The landed audio file, relative to the shard's landing folder or tar.",
    "text": "The utterance's transcript, as landed, or the aligner's pseudo-label where none landed (text_source 'asr').",
    "text_source": "Where the text came from: 'landed' (the shard's own) or 'asr' (the aligner's greedy CTC pseudo-label).",
    "asr_text": "The aligner's greedy CTC transcript of an utterance landed without text (null for landed text).",
    "asr_confidence": "The pseudo-label's confidence, 0-1: mean max posterior of its words' frames (null for landed text).",
    "asr_word_confidences": "The pseudo-label's confidence per word (mean max posterior of the word's frames).",
    "untranscribed": "Stretches (start_ms, end_ms) the alignment's wildcard explained instead of the transcript: music, an intro, speech the text skips (empty without a wildcard).",
    "untranscribed_ms": "Total ms of the untranscribed stretches.",
    "language": "ISO 639-1 language code (two lower-case letters).",
    "country": "Country the recording belongs to; the HF dataset's config.",
    "start_s": "Segment start in the source audio, seconds (null: from the file's start).",
    "end_s": "Segment end in the source audio, seconds (null: to the file's end).",
    "source": "Where the utterance comes from (corpus or provider), as landed; in translation tables the "
    "source-language text.",
    "extra": "The landed metadata's other columns, as one JSON object.",
    # raw_shards: the probed audio header.
    "source_sample_rate": "Sample rate of the landed audio file, Hz.",
    "source_channels": "Channels of the landed audio file.",
    "source_frames": "Length of the landed audio file, samples per channel.",
    "source_format": "Container format of the landed audio file (wav, flac, mp3, opus).",
    "segment_start_s": "Start of the utterance's segment in the file, seconds, after clamping to the file.",
    "segment_end_s": "End of the utterance's segment in the file, seconds, after clamping to the file.",
    "duration_s": "Length of the utterance's audio, seconds.",
    # shard_manifest and bridge_index (docs/storage-layout.md, "Manifest rows").
    "key": "The sample's WebDataset key in its tar.",
    "shard": "The shard the row belongs to.",
    "shard_id": "The shard the row belongs to.",
    "tar_url": "The sample's tar, relative to the data root (bridge/<shard>-NNNNNN-<sha>.tar).",
    "tar_sha256": "SHA-256 of the whole tar file.",
    "offset": "Byte offset of the sample's first member in its tar.",
    "size": "Bytes of the sample's members in its tar, from offset.",
    "n_frames": "Mimi frames of the utterance (12.5 per second).",
    "n_tokens": "Text tokens of the utterance.",
    "alignment_score": "Mean frame log-probability of the forced alignment (higher is better).",
    "zero_duration_token_share": "Share of the utterance's tokens that own no frame.",
    "clipped_share": "Share of the source samples at full scale (null: normalized before it was measured).",
    # alignments
    "level": "Span level: word or token.",
    "index": "Position of the span within its utterance and level.",
    "start_ms": "Span start, integer milliseconds from the utterance's start.",
    "end_ms": "Span end, integer milliseconds from the utterance's start.",
    "score": "Alignment log-probability (per span, or the utterance's mean frame log-prob).",
    "aligner": "Which forced aligner produced the spans.",
    "n_words": "Words of the aligned transcript.",
    # frame_grids (docs/bridge-tuples.md)
    "n_samples": "Audio samples of the utterance at its sample rate.",
    "silence_frames": "Frames no token owns.",
    "zero_duration_tokens": "Tokens that own no frame.",
    "tokens": "Token ids [T].",
    "grid": "Frame-to-token grid [F]: the token each Mimi frame belongs to.",
    "dur": "Frames per token [T].",
    "token_start_ms": "Each token's start, milliseconds.",
    "token_end_ms": "Each token's end, milliseconds.",
    # vad_segments and language_shard_index
    "tar_path": "The shard's packed audio tar, relative to the data root.",
    "tar_key": "The file's WebDataset key in the tar (null: the key is taken by another file).",
    "utt_ids": "The landed utterances of the file.",
    "speech_s": "Seconds of speech in the file.",
    "n_segments": "Speech segments found in the file.",
    "segments_source": "Where the segments come from: silero (detected) or import (landed).",
    "audio_sha1": "SHA-1 of the audio's bytes.",
    "files": "Audio files.",
    "streamable_files": "Audio files a tar reader can stream.",
    "hours": "Hours of audio.",
    "speech_hours": "Hours of speech.",
    "usable_chunk_hours": "Hours of speech in chunks long enough for training.",
    "tar_keys": "WebDataset keys of the files in the tar.",
    # translation
    "latency": "The simultaneous-translation latency level of the segmentation.",
    "segment_index": "Position of the segment within its utterance.",
    "emit_ms": "When the segment is emitted, milliseconds from the utterance's start.",
    "target": "The segment's translation.",
    "first_chunk": "First audio chunk the segment covers.",
    "last_chunk": "Last audio chunk the segment covers.",
    "n_unmatched_chunks": "Chunks of the segment no aligned word matches.",
    "hypothesis": "The translation being scored.",
    "prediction": "MetricX quality estimate (lower is better).",
    # asr_flac and asr_manifest
    "flac_path": "The extracted 16 kHz FLAC, relative to the data root.",
    "sample_rate": "Sample rate of the stored audio, Hz.",
    "duration": "Length of the utterance's audio, seconds (NeMo's name).",
    "lang": "ISO 639-1 language code (NeMo's name).",
    "audio_filepath": "The FLAC as NeMo reads it.",
    "recording_id": "The recording the utterance is cut from (null: the whole shard is one recording).",
    "original_language": "The language as landed, before corrections.",
    "quality": "Quality tier of the utterance.",
    "split": "train, validation or eval.",
}
"""What each stored column means (docs/storage-layout.md, docs/landing-contract.md): the descriptions
of every ``dagster/column_schema``. A column name means the same thing in every table that has it."""


def column_schema(schema: pa.Schema, descriptions: dict[str, str] | None = None) -> dg.TableSchema:
    """A parquet schema as ``dagster/column_schema``: the UI's column table for a manifest or index,
    each column described (``descriptions`` first, then :data:`COLUMN_DESCRIPTIONS`)."""
    described = {**COLUMN_DESCRIPTIONS, **(descriptions or {})}
    return dg.TableSchema(
        columns=[dg.TableColumn(f.name, str(f.type), description=described.get(f.name)) for f in schema]
    )


REJECTS_SAMPLE_ROWS = 20
"""How many rejects an asset's ``rejects_sample`` shows: enough to see the pattern, short enough to read."""


def rejects_sample(rejects, limit: int = REJECTS_SAMPLE_ROWS) -> dg.MetadataValue:
    """The first ``limit`` rejects (:class:`speechdata.accounting.rejects.Reject`) as a markdown table
    (utt_id, reason, detail), with how many are not shown."""
    rejects = list(rejects)
    if not rejects:
        return dg.MetadataValue.md("_no rejects_")
    shown = [{"utt_id": r.utt_id, "reason": r.reason, "detail": r.detail} for r in rejects[:limit]]
    table = markdown_rows(shown).value
    hidden = len(rejects) - len(shown)
    more = f"\n\n_{hidden} more not shown: all are in the stage's rejects parquet._" if hidden else ""
    return dg.MetadataValue.md(table + more)


def markdown_histogram(values, unit: str, bins: int = 10, width: int = 30) -> dg.MetadataValue:
    """A distribution as a markdown table of ``bins`` equal ranges, each with its count and a bar.

    Nulls and NaNs are counted apart, never binned; ``unit`` names the values' unit in the header."""
    present = [float(v) for v in values if v is not None and v == v]
    missing = len(values) - len(present)
    if not present:
        return dg.MetadataValue.md(f"_no values_ ({missing} null)" if missing else "_no values_")
    low, high = min(present), max(present)
    step = (high - low) / bins or 1.0
    counts = [0] * bins
    for value in present:
        counts[min(int((value - low) / step), bins - 1)] += 1
    top = max(counts)
    lines = [f"| {unit} | count | |", "|---|---|---|"]
    for position, count in enumerate(counts):
        start = low + position * step
        bar = "#" * round(width * count / top)
        lines.append(f"| {start:.3g} to {start + step:.3g} | {count} | `{bar}` |")
    footer = f"\n\n{len(present)} values, min {low:.3g}, max {high:.3g}" + (f", {missing} null" if missing else "")
    return dg.MetadataValue.md("\n".join(lines) + footer)


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
            description=f"{len(failed)} utterances fail {name}, e.g. {', '.join(failed[:3])}" if failed else None,
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
    counted = len(summary.rejects) if rejected is None else rejected
    passed = summary.rows_out + counted == summary.rows_in
    metadata = {rows_in_as: summary.rows_in, rows_out_as: summary.rows_out, "rejected": len(summary.rejects)}
    description = (
        None
        if passed
        else f"Shard {summary.shard_id!r}: {summary.rows_in} {rows_in_as} but {summary.rows_out} {rows_out_as} "
        f"+ {counted} rejected; {summary.rows_in - summary.rows_out - counted} unaccounted for"
    )
    return [dg.AssetCheckResult(check_name=name, passed=passed, metadata=metadata, description=description)]


def log_stage(context: dg.AssetExecutionContext, summary: StageSummary, done: str, detail: str = "") -> None:
    """One line per shard: rows out of rows in, the rejects by reason, the audio rate."""
    context.log.info(
        f"{summary.shard_id}: {summary.rows_out}/{summary.rows_in} {done}{detail}, "
        f"rejects {summary.rejects_by_reason}, {summary.audio_seconds_per_second:.0f} audio s/s"
    )


def unbalanced_ledger_failure(exc: UnbalancedLedger, scope: str | None = None) -> dg.Failure:
    """The step's failure when a product's ledger gate refuses to publish: the gate's message (``scope``
    first, e.g. the country), the shard, and the first unaccounted ids."""
    return dg.Failure(
        description=f"{scope}: {exc}" if scope else str(exc),
        metadata={"shard": exc.shard_id, "unaccounted": dg.MetadataValue.json(exc.ledger.unaccounted[:20])},
    )


def _is_figure(value: object) -> bool:
    if isinstance(value, (dg.IntMetadataValue, dg.FloatMetadataValue)):
        return value.value is not None
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _figure(value: object) -> int | float:
    if isinstance(value, (dg.IntMetadataValue, dg.FloatMetadataValue)):
        return value.value  # ty: ignore[invalid-return-type]
    return value  # ty: ignore[invalid-return-type]


def unplotted_check(check: dg.AssetCheckResult) -> dg.AssetCheckResult:
    """``check`` with each numeric metadata value as text: still shown on the check, never charted.

    Dagster's UI plots a check's numeric metadata as one series over time across every partition
    (the check's Plots: Dagster 1.13 has no partition axis there), so a partitioned asset's check
    figures would read as one shard's trend. The asset's own plots have that axis (Partitions /
    Events): the figures worth charting per partition are the materialization's (``stage_metadata``:
    rows in, rows out, rejects), which the checks' counts restate.
    """
    if not any(_is_figure(value) for value in (check.metadata or {}).values()):
        return check
    metadata = {
        key: dg.MetadataValue.text(str(_figure(value))) if _is_figure(value) else value
        for key, value in (check.metadata or {}).items()
    }
    return dg.AssetCheckResult(
        passed=check.passed,
        asset_key=check.asset_key,
        check_name=check.check_name,
        metadata=metadata,
        severity=check.severity,
        description=check.description,
    )
