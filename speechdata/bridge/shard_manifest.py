"""A shard's manifest (one row per packed sample) and its utterance accounting."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from speechdata.alignment.pseudo_labels import with_text_sources
from speechdata.audio.clock import SAMPLE_RATE
from speechdata.audio.container import read_container_index
from speechdata.bridge.manifest import MANIFEST_COLUMNS
from speechdata.bridge.segments import cut_grid, is_long_form, long_form_cuts, utterance_of_key
from speechdata.io import layout
from speechdata.io.storage import DataRoot


def build_shard_manifest(data_root: DataRoot, shard_id: str, packed: pa.Table | None = None) -> pa.Table:
    """Join where each sample is packed (``packed``: a bridge index, the committed one by default)
    with what it is: durations, counts, text, scores, extras."""
    if packed is None:
        packed = data_root.read_parquet(layout.bridge_index(shard_id))
    grids = data_root.read_parquet(
        layout.frame_grids(shard_id), columns=["utt_id", "n_samples", "n_frames", "n_tokens", "zero_duration_tokens"]
    )
    index = with_text_sources(data_root, shard_id, data_root.read_parquet(layout.utterance_index(shard_id)))
    scores = data_root.read_parquet(layout.alignment_scores(shard_id), columns=["utt_id", "score"])
    audio = read_container_index(data_root, layout.normalized_audio(shard_id))
    clipped_by = dict(zip(audio["utt_id"].to_pylist(), audio["clipped_share"].to_pylist(), strict=True))
    grid_by = {r["utt_id"]: r for r in grids.to_pylist()}
    grid_by.update(_segment_grids(data_root, shard_id, grids))
    index_by = {r["utt_id"]: r for r in index.to_pylist()}
    score_by = dict(zip(scores["utt_id"].to_pylist(), scores["score"].to_pylist(), strict=True))
    extras = index["extra"].to_pylist() if "extra" in index.column_names else ["{}"] * index.num_rows
    extra_by = dict(zip(index["utt_id"].to_pylist(), extras, strict=True))

    rows = []
    for sample in packed.to_pylist():
        key = sample["key"]
        utt_id = utterance_of_key(key)  # a segment sample's recording
        grid, meta = grid_by[key], index_by[utt_id]
        rows.append(
            {
                "key": key,
                "shard": shard_id,
                "tar_url": sample["tar_url"],
                "offset": sample["offset"],
                "size": sample["size"],
                "duration_s": grid["n_samples"] / SAMPLE_RATE,
                "n_frames": grid["n_frames"],
                "n_tokens": grid["n_tokens"],
                "language": meta["language"],
                "country": meta["country"],
                "source": meta["source"],
                "text": grid.get("text", meta["text"]),
                "text_source": meta["text_source"],
                "asr_confidence": meta["asr_confidence"],
                "alignment_score": score_by.get(utt_id),
                "zero_duration_token_share": grid["zero_duration_tokens"] / grid["n_tokens"]
                if grid["n_tokens"]
                else 0.0,
                "clipped_share": clipped_by.get(utt_id),
                "extra": extra_by[utt_id],
            }
        )
    return pa.Table.from_pylist(rows, schema=MANIFEST_COLUMNS)


def _segment_grids(data_root: DataRoot, shard_id: str, grids: pa.Table) -> dict[str, dict]:
    """The manifest's grid figures (and text) of each segment sample of the shard's long recordings."""
    long_ids = [
        u for u, n in zip(grids["utt_id"].to_pylist(), grids["n_samples"].to_pylist(), strict=True) if is_long_form(n)
    ]
    if not long_ids:
        return {}
    rows = data_root.read_parquet(layout.frame_grids(shard_id))
    rows = rows.filter(pc.is_in(rows["utt_id"], pa.array(long_ids, pa.string())))
    by_utt = {r["utt_id"]: r for r in rows.to_pylist()}
    figures = {}
    for utt_id, cuts in long_form_cuts(data_root, shard_id, rows).items():
        row = by_utt[utt_id]
        for cut in cuts:
            _, _, dur = cut_grid(cut, row["tokens"], row["grid"])
            figures[cut.key] = {
                "n_samples": cut.samples(row["n_samples"]).stop - cut.samples(row["n_samples"]).start,
                "n_frames": cut.n_frames,
                "n_tokens": cut.n_tokens,
                "zero_duration_tokens": int((dur == 0).sum()),
                "text": cut.text,
            }
    return figures
