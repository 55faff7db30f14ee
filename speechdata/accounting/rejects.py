"""The rejects ledger: every utterance a stage could not use, with the stage and the reason.

Each stage writes ``shards/<shard_id>/rejects/<stage>.parquet`` for a shard, replacing its own file
on a re-run, so that for every shard: utterances landed = utterances packed + distinct rejected
utterances (docs/ledgers.md).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

REJECTS_SCHEMA = pa.schema(
    [
        pa.field("utt_id", pa.string()),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("detail", pa.string()),
    ]
)


@dataclass(frozen=True)
class Reject:
    """One utterance a stage could not use. ``reason`` is a stable snake_case code; ``detail`` is for people."""

    utt_id: str | None
    stage: str
    reason: str
    detail: str = ""


def rejects_table(rejects: Iterable[Reject]) -> pa.Table:
    rows = list(rejects)
    return pa.table(
        {
            "utt_id": [r.utt_id for r in rows],
            "stage": [r.stage for r in rows],
            "reason": [r.reason for r in rows],
            "detail": [r.detail for r in rows],
        },
        schema=REJECTS_SCHEMA,
    )


_OBJECT_REPR = re.compile(r"<[^<>]*? at 0x[0-9a-fA-F]+>")
# A file object's repr names the file it reads: ``<ExFileObject name='/abs/landing/s/audio.tar'>``
# (a tar member), ``<_io.BufferedReader name='/abs/...'>``.
_FILE_OBJECT_REPR = re.compile(r"""<[A-Za-z_][\w.]* name=(?:'[^']*'|"[^"]*"|[^<>\s]+)[^<>]*>""")


def error_text(exc: BaseException) -> str:
    """An exception's message without object reprs (``<... at 0x7f...>``) or file objects' reprs,
    which name absolute paths: a reject's detail must be the same on every run and under every data
    root, so re-runs stay byte-identical and a moved root writes the same ledgers."""
    return _OBJECT_REPR.sub("the file", _FILE_OBJECT_REPR.sub("the file", str(exc)))


def count_by_reason(rejects: Iterable[Reject]) -> dict[str, int]:
    return dict(sorted(Counter(r.reason for r in rejects).items()))
