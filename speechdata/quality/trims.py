"""The spans a product keeps where its quality policy trimmed long edge silence.

``quality_decisions.parquet`` records ``keep_start_s`` / ``keep_end_s`` (seconds into the
utterance) for a kept utterance whose leading or trailing silence was over the product's limit; the
product's stage extracts only that span (ASR's FLAC extraction, ``speechdata.asr.flac``).
"""

from __future__ import annotations

import pyarrow.compute as pc

from speechdata.io.storage import DataRoot
from speechdata.quality.paths import quality_decisions


def kept_spans(data_root: DataRoot, shard_id: str, product: str) -> dict[str, tuple[float, float]]:
    """``{utt_id: (start_s, end_s)}`` of every kept, trimmed utterance of the shard for ``product``;
    empty when the decisions are not written yet (or were written before trimming existed)."""
    relative = quality_decisions(shard_id)
    if not data_root.exists(relative):
        return {}
    table = data_root.read_parquet(relative)
    if "keep_start_s" not in table.column_names:
        return {}
    table = table.filter(
        pc.and_(
            pc.and_(pc.equal(table["product"], product), pc.is_null(table["reason"])),
            pc.is_valid(table["keep_start_s"]),
        )
    )
    return {
        utt_id: (float(start), float(end))
        for utt_id, start, end in zip(
            table["utt_id"].to_pylist(),
            table["keep_start_s"].to_pylist(),
            table["keep_end_s"].to_pylist(),
            strict=True,
        )
    }
