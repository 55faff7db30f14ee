"""The stage contract: what every per-shard stage of ``speechdata`` is and what it reports.

A stage builds one product of one shard. Its entry point

* is named ``run_<product>``, ``<product>`` being what it writes and the asset of the same name
  (``run_frame_grids`` writes ``frame_grids``); a second way to build the same product says how
  (``run_alignments_from_import``);
* lives in its package's stage module (``stage.py``, or ``<product>_stage.py`` beside it where a
  package has more than one);
* takes ``(data_root, shard_id, ...)``: the data root, the shard, then what the stage needs
  (a model, settings, an ``on_progress`` callback);
* writes its products and its rejects ledger whole, replacing what an earlier run wrote, so a
  re-run gives the same result;
* returns a :class:`StageSummary`, or a subclass of it holding the stage's own figures
  (``FrameGridSummary``, ``VadSummary``, ``QeSummary``, ...), so every asset reports rows, rejects,
  hours and rates the same way (``assets.reporting.stage_metadata``).

Steps over many shards (the ASR manifests, a country's Hugging Face dataset, the language index)
are not shard stages and keep their own summaries.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from speechdata.accounting.rejects import Reject, count_by_reason


@dataclass(frozen=True)
class StageSummary:
    """What a per-shard stage did: rows in, rows out, the rejects it recorded, the audio it covered
    and the seconds it took. Subclasses add their figures as keyword-only fields
    (``@dataclass(frozen=True, kw_only=True)``)."""

    shard_id: str
    rows_in: int
    rows_out: int
    rejects: list[Reject]
    audio_seconds: float
    compute_seconds: float
    outputs: dict[str, str] = field(default_factory=dict)
    """``{name: URI}`` of what the stage wrote (the asset reports each as ``<name>_uri``)."""

    @property
    def rejects_by_reason(self) -> dict[str, int]:
        return count_by_reason(self.rejects)

    @property
    def reject_share(self) -> float:
        return len(self.rejects) / self.rows_in if self.rows_in else 0.0

    @property
    def hours(self) -> float:
        return self.audio_seconds / 3600.0

    @property
    def audio_seconds_per_second(self) -> float:
        return self.audio_seconds / self.compute_seconds if self.compute_seconds > 0 else 0.0
