"""QE scores and filtered streaming pairs for one shard.

``qe_scores``: the shard's segments flattened to MetricX JSONL (``source`` = English segment,
``hypothesis`` = Chinese segment, plus ``utt_id``, ``latency``, ``segment_index``, ``emit_ms``),
scored, and written back as MetricX output JSONL (the same lines with ``prediction``: an error
score in [0, 25], lower is better) and as a parquet table.

``streaming_pairs``: the scored segments with ``prediction <= threshold`` (default 5.0), as JSONL and
parquet, with the kept share per latency level.

A GPU worker reads the next shard's ``qe_scores`` inputs (:class:`QeShardInputs`) while the current
shard is on the device; the stage takes them as ``inputs``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from speechdata.accounting.ledger_gate import require_balanced
from speechdata.accounting.ledgers import produced_utterances
from speechdata.accounting.stage import StageSummary
from speechdata.io import layout
from speechdata.io.input_versions import InputFingerprint, fingerprint_is_current, input_fingerprint
from speechdata.io.storage import DataRoot
from speechdata.translation.segmentation_input import LATENCY_LEVELS

DEFAULT_THRESHOLD = 5.0
METADATA_FIELDS = ("utt_id", "latency", "segment_index", "emit_ms")

SCORED_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string(), nullable=False),
        pa.field("latency", pa.string(), nullable=False),
        pa.field("segment_index", pa.int32(), nullable=False),
        pa.field("emit_ms", pa.int32(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("hypothesis", pa.string(), nullable=False),
        pa.field("prediction", pa.float64(), nullable=False),
    ]
)

ScoreFn = Callable[[Sequence[str], Sequence[str], Callable[[int, int], None] | None], list[float]]
"""``(sources, hypotheses, on_progress) -> predictions``, e.g. :class:`speechdata.translation.metricx.MetricXScorer`."""


def metricx_records(segments: pa.Table) -> list[dict]:
    """MetricX input lines from a segments table: ``source``, ``hypothesis`` and the metadata fields."""
    columns = {name: segments[name].to_pylist() for name in (*METADATA_FIELDS, "source", "target")}
    return [
        {"source": source, "hypothesis": target, **{name: columns[name][i] for name in METADATA_FIELDS}}
        for i, (source, target) in enumerate(zip(columns["source"], columns["target"], strict=True))
    ]


def jsonl_bytes(records: Iterable[dict]) -> bytes:
    """One JSON object per line, UTF-8, non-ASCII kept as is (Chinese stays readable)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()


def read_jsonl(data: bytes | str, source: str) -> list[dict]:
    """The objects of a JSONL file; a malformed line raises ``ValueError`` naming ``source:line``."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    records = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source}:{line_no}: malformed JSON: {exc.msg}") from exc
        if not isinstance(record, dict):
            raise ValueError(f"{source}:{line_no}: not a JSON object")
        records.append(record)
    return records


def scored_table(records: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(
        [{name: r[name] for name in SCORED_SCHEMA.names} for r in records], schema=SCORED_SCHEMA
    )


@dataclass(frozen=True)
class QeShardInputs:
    """The shard's MetricX input lines, as records and as the JSONL the stage writes: all it reads.

    Read only, never written (the stage writes ``metricx_input.jsonl`` itself, under the shard's
    lock), so they can be read ahead of the shard's turn; ``fingerprint`` tells a worker that the
    segments were replaced in between."""

    shard_id: str
    records: list[dict]
    """``source``, ``hypothesis`` and the metadata fields, one per segment."""
    input_jsonl: bytes
    fingerprint: InputFingerprint


def read_qe_inputs(data_root: DataRoot, shard_id: str) -> QeShardInputs:
    """The shard's streaming segments as MetricX input lines."""
    fingerprint = input_fingerprint(data_root, [layout.streaming_segments(shard_id)])
    records = metricx_records(data_root.read_parquet(layout.streaming_segments(shard_id)))
    return QeShardInputs(shard_id, records, jsonl_bytes(records), fingerprint)


def qe_inputs_are_current(data_root: DataRoot, inputs: QeShardInputs) -> bool:
    """Whether the segments file is still the version ``inputs`` was read from."""
    return fingerprint_is_current(data_root, inputs.fingerprint)


@dataclass(frozen=True, kw_only=True)
class QeSummary(StageSummary):
    """The stage's summary (rows: segments; every segment is scored, none rejected), with the mean
    MetricX prediction, overall and per latency level."""

    mean_prediction: float | None
    mean_prediction_by_level: dict[str, float | None]

    @property
    def segments_per_second(self) -> float:
        return self.rows_out / self.compute_seconds if self.compute_seconds > 0 else 0.0


def _mean_by_level(table: pa.Table, column: str) -> dict[str, float | None]:
    means = {}
    for level in LATENCY_LEVELS:
        values = table.filter(pc.equal(table["latency"], level))[column]
        means[level] = round(pc.mean(values).as_py(), 4) if len(values) else None
    return means


def run_qe_scores(
    data_root: DataRoot,
    shard_id: str,
    score: ScoreFn,
    on_progress: Callable[[int, int], None] | None = None,
    inputs: QeShardInputs | None = None,
) -> QeSummary:
    """Write the MetricX input JSONL, score every segment, write the output JSONL and the scores table.

    ``inputs``: the shard's segments already read (a GPU worker's read-ahead); read here when None."""
    started = time.perf_counter()
    if inputs is None:
        inputs = read_qe_inputs(data_root, shard_id)
    elif inputs.shard_id != shard_id:
        raise ValueError(f"shard {shard_id}: given the inputs read for shard {inputs.shard_id}")
    records = inputs.records
    data_root.write_bytes(layout.metricx_input(shard_id), inputs.input_jsonl)
    predictions = score([r["source"] for r in records], [r["hypothesis"] for r in records], on_progress)
    scored = [{**r, "prediction": float(p)} for r, p in zip(records, predictions, strict=True)]
    data_root.write_bytes(layout.metricx_output(shard_id), jsonl_bytes(scored))
    table = scored_table(scored)
    data_root.write_parquet(layout.qe_scores(shard_id), table)
    mean = pc.mean(table["prediction"]).as_py() if table.num_rows else None
    return QeSummary(
        shard_id=shard_id,
        rows_in=len(records),
        rows_out=table.num_rows,
        rejects=[],
        audio_seconds=0.0,
        mean_prediction=None if mean is None else round(mean, 4),
        mean_prediction_by_level=_mean_by_level(table, "prediction"),
        compute_seconds=time.perf_counter() - started,
        outputs={
            name: data_root.uri(path)
            for name, path in (
                ("metricx_input", layout.metricx_input(shard_id)),
                ("metricx_output", layout.metricx_output(shard_id)),
                ("scores", layout.qe_scores(shard_id)),
            )
        },
    )


def filter_by_threshold(scored: pa.Table, threshold: float = DEFAULT_THRESHOLD) -> pa.Table:
    """The rows whose ``prediction`` is at or below ``threshold`` (MetricX: lower is better)."""
    return scored.filter(pc.less_equal(scored["prediction"], pa.scalar(float(threshold), pa.float64())))


def kept_share_by_level(scored: pa.Table, kept: pa.Table) -> dict[str, float | None]:
    shares = {}
    for level in LATENCY_LEVELS:
        total = pc.sum(pc.equal(scored["latency"], level)).as_py() or 0
        passed = pc.sum(pc.equal(kept["latency"], level)).as_py() or 0
        shares[level] = round(passed / total, 6) if total else None
    return shares


@dataclass(frozen=True, kw_only=True)
class PairsSummary(StageSummary):
    """The stage's summary: rows in are the scored segments, rows out the kept ones. A segment above
    the threshold is filtered, not rejected: it stays in ``qe_scores`` with its score."""

    threshold: float
    kept_share_by_level: dict[str, float | None]

    @property
    def scored(self) -> int:
        return self.rows_in

    @property
    def kept(self) -> int:
        return self.rows_out

    @property
    def kept_share(self) -> float:
        return self.kept / self.scored if self.scored else 0.0


def run_streaming_pairs(data_root: DataRoot, shard_id: str, threshold: float = DEFAULT_THRESHOLD) -> PairsSummary:
    """Keep the shard's scored segments at or below ``threshold``; write them as JSONL and parquet.

    Raises :class:`~speechdata.accounting.ledger_gate.UnbalancedLedger`, writing nothing, when the shard's
    ``translation`` ledger does not balance."""
    started = time.perf_counter()
    require_balanced(
        data_root, shard_id, "translation", produced_utterances(data_root, shard_id, "translation") or set()
    )
    scored = data_root.read_parquet(layout.qe_scores(shard_id))
    kept = filter_by_threshold(scored, threshold)
    data_root.write_bytes(layout.streaming_pairs_jsonl(shard_id), jsonl_bytes(kept.to_pylist()))
    data_root.write_parquet(layout.streaming_pairs(shard_id), kept)
    return PairsSummary(
        shard_id=shard_id,
        rows_in=scored.num_rows,
        rows_out=kept.num_rows,
        rejects=[],
        audio_seconds=0.0,
        compute_seconds=time.perf_counter() - started,
        threshold=threshold,
        kept_share_by_level=kept_share_by_level(scored, kept),
        outputs={
            "pairs_jsonl": data_root.uri(layout.streaming_pairs_jsonl(shard_id)),
            "pairs": data_root.uri(layout.streaming_pairs(shard_id)),
        },
    )
