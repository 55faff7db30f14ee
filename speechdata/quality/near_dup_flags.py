"""Near-duplicate flags a product's policy turns into rejects.

The near-duplicate stage lists in ``shards/<shard>/near_duplicate_flags.parquet`` the utterances that
match an earlier one without being duplicates (docs/near-duplicates.md): ``other_speaker_reading``
(the same transcript read by another speaker) and ``contains_earlier`` (an earlier utterance plus
new speech). Both are kept by default. A product whose
:class:`~speechdata.quality.policy.QualityPolicy` sets ``reject_other_speaker_readings`` rejects the
first as ``near_duplicate``: the quality decisions carry the reject, so every product stage and the
catalog see it the way they see any quality reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from speechdata.io.storage import DataRoot
from speechdata.quality.near_dup_matching import OTHER_SPEAKER_READING
from speechdata.quality.paths import near_duplicate_flags

NEAR_DUPLICATE = "near_duplicate"


def flagged_utterances(data_root: DataRoot, shard_id: str) -> dict[str, dict]:
    """``{utt_id: flag row}`` of the shard's flags file; empty when it is not written (yet)."""
    relative = near_duplicate_flags(shard_id)
    if not data_root.exists(relative):
        return {}
    return {row["utt_id"]: row for row in data_root.read_parquet(relative).to_pylist()}


def reject_flagged_near_duplicates(
    data_root: DataRoot, shard_id: str, policies: Mapping, decision_rows: list[dict]
) -> None:
    """Set ``reason`` ``near_duplicate`` on the kept ``decision_rows`` (one per utterance and product)
    whose utterance is an ``other_speaker_reading`` and whose product's policy rejects those."""
    rejecting = {product for product, policy in policies.items() if policy.reject_other_speaker_readings}
    if not rejecting:
        return
    flags = flagged_utterances(data_root, shard_id)
    for row in decision_rows:
        flag = flags.get(row["utt_id"])
        if row["reason"] is None and row["product"] in rejecting and flag and flag["kind"] == OTHER_SPEAKER_READING:
            row["reason"] = NEAR_DUPLICATE
            row["detail"] = (
                f"{OTHER_SPEAKER_READING} of {flag['representative_shard']}/{flag['representative_utt']}"
                f" (transcript similarity {flag['similarity']}); the product rejects other speakers' readings"
            )
