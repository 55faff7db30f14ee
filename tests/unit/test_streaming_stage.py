"""The streaming_segments stage on a hand-made shard: filters, rejects and accounting."""

import json

import pyarrow as pa

from speechdata.alignment.table import UTTERANCE_SCORES_SCHEMA, TimedUnit, alignment_rows, alignments_table
from speechdata.audio.container import AUDIO_CONTAINER_SCHEMA
from speechdata.io import layout
from speechdata.translation.segmentation_input import LATENCY_LEVELS
from speechdata.translation.stage import SegmentSettings, run_streaming_segments

SHARD = "s1"
UTTERANCES = {
    # utt_id: (transcript, alignment score)
    "good": ("hello there world", -1.0),
    "poor": ("hello there world", -9.0),
    "imported": ("hello there world", None),
    "mismatch": ("hello there world", -1.0),
    "empty": ("hello there world", -1.0),
}


def land(data_root):
    rows, scores, container = [], [], []
    for utt_id, (text, score) in UTTERANCES.items():
        words = [TimedUnit(w, 400 * i, 400 * i + 300) for i, w in enumerate(text.split())]
        rows += alignment_rows(utt_id, "word", words)
        scores.append({"utt_id": utt_id, "aligner": "x", "score": score, "n_words": len(words), "n_frames": 15})
        container.append(
            {
                "utt_id": utt_id,
                "sample_rate": 24_000,
                "n_samples": 24_000,
                "duration_s": 1.0,
                "codec": "flac16",
                "audio": b"",
            }
        )
    data_root.write_parquet(layout.alignments(SHARD), alignments_table(rows))
    data_root.write_parquet(
        layout.alignment_scores(SHARD), pa.Table.from_pylist(scores, schema=UTTERANCE_SCORES_SCHEMA)
    )
    data_root.write_parquet(
        layout.normalized_audio(SHARD), pa.Table.from_pylist(container, schema=AUDIO_CONTAINER_SCHEMA)
    )
    data_root.write_parquet(
        layout.utterance_index(SHARD),
        pa.table({"utt_id": list(UTTERANCES), "text": [t for t, _ in UTTERANCES.values()]}),
    )
    good = {lvl: {"English": ["hello there", "world"], "Chinese": ["你好", "世界"]} for lvl in LATENCY_LEVELS}
    other = {lvl: {"English": ["goodbye"], "Chinese": ["再见"]} for lvl in LATENCY_LEVELS}
    empty = {lvl: {"English": [], "Chinese": []} for lvl in LATENCY_LEVELS}
    directory = layout.landing_segmentation_dir(SHARD)
    for utt_id, document in (("good", good), ("poor", good), ("imported", good), ("mismatch", other), ("empty", empty)):
        data_root.write_bytes(f"{directory}/{utt_id}.json", json.dumps(document, ensure_ascii=False).encode())


def reasons(summary):
    return {r.utt_id: r.reason for r in summary.rejects}


def test_every_aligned_utterance_is_written_or_rejected(data_root):
    land(data_root)
    summary = run_streaming_segments(data_root, SHARD)
    totals = summary.level_totals
    assert reasons(summary) == {"mismatch": "no_chunk_matched"}
    assert summary.rows_in == summary.rows_out + len(summary.rejects) == 5
    table = data_root.read_parquet(layout.streaming_segments(SHARD))
    assert set(table["utt_id"].to_pylist()) == {"good", "poor", "imported"}
    with data_root.fs.open(data_root.path(layout.streaming_segments_json(SHARD, "empty"))) as handle:
        assert json.loads(handle.read())["source_low_latency"] == []
    assert totals.chunks["low_latency"] == 6 and totals.unmatched_share()["low_latency"] == 0.0
    ledger = data_root.read_parquet(layout.rejects(SHARD, "streaming_segments")).to_pylist()
    assert [(r["utt_id"], r["stage"]) for r in ledger] == [("mismatch", "streaming_segments")]
    assert set(table["text_source"].to_pylist()) == {"landed"}


def test_a_segment_of_a_pseudo_labelled_utterance_says_its_text_came_from_the_aligner(data_root):
    land(data_root)
    index = data_root.read_parquet(layout.utterance_index(SHARD)).to_pylist()
    index[0]["text"] = None  # "good" landed without text; the aligner heard its words
    data_root.write_parquet(layout.utterance_index(SHARD), pa.Table.from_pylist(index))
    scores = data_root.read_parquet(layout.alignment_scores(SHARD)).to_pylist()
    scores[0].update(text_source="asr", asr_text="hello there world", asr_confidence=0.8)
    data_root.write_parquet(
        layout.alignment_scores(SHARD), pa.Table.from_pylist(scores, schema=UTTERANCE_SCORES_SCHEMA)
    )
    run_streaming_segments(data_root, SHARD)
    table = data_root.read_parquet(layout.streaming_segments(SHARD)).to_pylist()
    assert {r["utt_id"]: r["text_source"] for r in table} == {"good": "asr", "poor": "landed", "imported": "landed"}
    with data_root.fs.open(data_root.path(layout.streaming_segments_json(SHARD, "good"))) as handle:
        document = json.loads(handle.read())
    assert (document["original_text"], document["text_source"]) == ("hello there world", "asr")


def test_allowed_ids_and_alignment_score_threshold_filter_with_reasons(data_root):
    land(data_root)
    summary = run_streaming_segments(
        data_root, SHARD, SegmentSettings(allowed_ids=frozenset({"good", "poor", "imported"}), min_alignment_score=-5.0)
    )
    assert reasons(summary) == {
        "poor": "alignment_score_below_threshold",
        "imported": "alignment_score_below_threshold",
        "mismatch": "not_in_allowed_ids",
        "empty": "not_in_allowed_ids",
    }
    assert data_root.read_parquet(layout.streaming_segments(SHARD))["utt_id"].unique().to_pylist() == ["good"]


def test_a_missing_segmentation_file_is_a_reject_naming_the_file(data_root):
    land(data_root)
    data_root.fs.rm(data_root.path(f"{layout.landing_segmentation_dir(SHARD)}/good.json"))
    summary = run_streaming_segments(data_root, SHARD)
    [reject] = [r for r in summary.rejects if r.utt_id == "good"]
    assert reject.reason == "no_segmentation" and "segmentation/good.json" in reject.detail


def test_an_utterance_the_translation_quality_policy_excludes_is_a_reject_with_its_reason(data_root):
    land(data_root)
    excluded = {"good": ("narrowband", "quality: bandwidth_hz 4000 Hz < 5000 Hz")}
    summary = run_streaming_segments(data_root, SHARD, SegmentSettings(), excluded=excluded)
    assert reasons(summary)["good"] == "narrowband"
    assert not data_root.exists(layout.streaming_segments_json(SHARD, "good"))
    produced = set(data_root.read_parquet(layout.streaming_segments(SHARD))["utt_id"].to_pylist())
    assert "good" not in produced and "imported" in produced
