"""Granary end to end: Granary parquet -> landing shard -> MFA corpus; TextGrids and NeMo alignments ->
streaming_segments -> qe_scores (tiny MetricX-24) -> streaming_pairs."""

import io
import json
import statistics

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from assets.alignment import alignments
from assets.ingest import normalized_audio, raw_shards
from assets.partitions import shard_partitions
from assets.translation import qe_scores, streaming_pairs, streaming_segments
from resources.qe import MetricXResource
from speechdata.alignment.mfa_corpus import export_mfa_corpus
from speechdata.importers.granary import import_granary_parquet
from speechdata.io import layout
from speechdata.translation.qe_stage import read_jsonl
from speechdata.translation.segmentation_input import LATENCY_LEVELS
from tests.conftest import assert_second_shard_read_ahead
from tests.materialize import materialize_shard
from tests.tiny_resources import tiny_resources_for

SHARD = "granary-0001"
IMPORT_CONFIG = {"ops": {"alignments": {"config": {"source": "import"}}}}


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


@pytest.fixture
def resources(data_root, model_cache_dir):
    return tiny_resources_for(
        data_root.url, model_cache_dir, qe=MetricXResource(profile="tiny", model_cache_dir=model_cache_dir)
    )


def run(instance, resources, shard_id, assets, run_config=None):
    result = materialize_shard(instance, None, shard_id, assets, resources=resources, run_config=run_config)
    assert result.success
    return result


def granary_parquet(tmp_path, clips) -> str:
    """A Granary-style file: HF Audio structs (FLAC bytes + original path), transcripts, one row without audio."""
    english = [c for c in clips if c.language == "en"]
    rows = []
    for clip in english:
        buffer = io.BytesIO()
        sf.write(buffer, clip.samples, clip.sample_rate, format="FLAC")
        rows.append(
            {
                "audio": {"bytes": buffer.getvalue(), "path": f"{clip.utt_id}.flac"},
                "text": clip.text,
                "duration": len(clip.samples) / clip.sample_rate,
            }
        )
    rows.append({"audio": {"bytes": None, "path": "lost.flac"}, "text": "no audio here", "duration": 1.0})
    path = tmp_path / "granary.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def textgrid(words: list[str], duration_s: float) -> str:
    """An MFA-style long TextGrid: lower-cased, punctuation-free words evenly over the audio, silence at the ends."""
    step = (duration_s - 0.2) / len(words)
    intervals = [(0.0, 0.1, "")] + [(0.1 + i * step, 0.1 + (i + 1) * step, w) for i, w in enumerate(words)]
    intervals.append((0.1 + len(words) * step, duration_s, ""))
    body = "".join(
        f'        intervals [{k}]:\n            xmin = {a:.4f}\n            xmax = {b:.4f}\n            text = "{t}"\n'
        for k, (a, b, t) in enumerate(intervals, start=1)
    )
    return (
        'File type = "ooTextFile"\nObject class = "TextGrid"\n\nxmin = 0\n'
        f"xmax = {duration_s:.4f}\ntiers? <exists>\nsize = 1\nitem []:\n    item [1]:\n"
        f'        class = "IntervalTier"\n        name = "words"\n        xmin = 0\n        xmax = {duration_s:.4f}\n'
        f"        intervals: size = {len(intervals)}\n{body}"
    )


def segmentation(words: list[str], extra_chunk: str | None = None) -> dict:
    """Low latency: one word per chunk; medium: pairs; high: the whole sentence. Chinese: one tag per word."""
    zh = [f"词{i}" for i in range(len(words))]
    low_en, low_zh = list(words), list(zh)
    if extra_chunk:
        low_en.insert(2, extra_chunk)
        low_zh.insert(2, "额外")
    return {
        "low_latency": {"English": low_en, "Chinese": low_zh},
        "medium_latency": {
            "English": [" ".join(words[i : i + 2]) for i in range(0, len(words), 2)],
            "Chinese": ["".join(zh[i : i + 2]) for i in range(0, len(words), 2)],
        },
        "high_latency": {"English": [" ".join(words)], "Chinese": ["".join(zh)]},
    }


def test_granary_import_mfa_export_and_textgrid_driven_segments_scores_and_pairs(
    instance, data_root, resources, clips, tmp_path
):
    landed = import_granary_parquet(data_root, SHARD, granary_parquet(tmp_path, clips), language="en")
    assert landed.rows == 6 and landed.rows_without_audio == 1
    assert landed.metadata["utt_id"].to_pylist() == [f"utt_{i:06d}" for i in range(6)]
    assert "duration" in landed.metadata.column_names  # extra columns are carried through
    run(instance, resources, SHARD, [raw_shards, normalized_audio])
    raw_rejects = data_root.read_parquet(layout.rejects(SHARD, "raw_shards")).to_pylist()
    assert [(r["utt_id"], r["reason"]) for r in raw_rejects] == [("utt_000005", "missing_audio_path")]

    corpus = export_mfa_corpus(data_root, SHARD)
    texts = dict(zip(landed.metadata["utt_id"].to_pylist(), landed.metadata["text"].to_pylist()))
    durations = {}
    for utt_id in [f"utt_{i:06d}" for i in range(5)]:
        with data_root.fs.open(data_root.path(f"{layout.mfa_corpus_dir(SHARD)}/{utt_id}.lab")) as handle:
            assert handle.read().decode() == texts[utt_id] + "\n"
        with data_root.fs.open(data_root.path(f"{layout.mfa_corpus_dir(SHARD)}/{utt_id}.wav")) as handle:
            info = sf.info(io.BytesIO(handle.read()))
        assert (info.samplerate, info.channels, info.subtype) == (16_000, 1, "PCM_16")
        durations[utt_id] = info.duration
    assert corpus.utterances == 5 and not corpus.skipped
    english = [c for c in clips if c.language == "en"]
    assert [round(durations[f"utt_{i:06d}"], 2) for i in range(5)] == [
        round(len(c.samples) / c.sample_rate, 2) for c in english
    ]

    # MFA's TextGrids come back beside the shard; the LLM segmentation lands beside it too.
    words = {u: [w.strip(".,").lower() for w in t.split()] for u, t in texts.items()}
    for utt_id, duration in durations.items():
        data_root.write_bytes(
            f"{layout.landing_alignments_dir(SHARD)}/{utt_id}.TextGrid", textgrid(words[utt_id], duration).encode()
        )
    seg_dir = layout.landing_segmentation_dir(SHARD)
    data_root.write_bytes(f"{seg_dir}/utt_000000.json", json.dumps(segmentation(words["utt_000000"])).encode())
    data_root.write_bytes(f"{seg_dir}/utt_000001.json", b'{"low_latency": {"English": ["a"')
    unequal = segmentation(words["utt_000002"])
    unequal["medium_latency"]["Chinese"].pop()
    data_root.write_bytes(f"{seg_dir}/utt_000002.json", json.dumps(unequal, ensure_ascii=False).encode())
    data_root.write_bytes(
        f"{seg_dir}/utt_000004.json",
        json.dumps(segmentation(words["utt_000004"], extra_chunk="um"), ensure_ascii=False).encode(),
    )

    result = run(
        instance, resources, SHARD, [alignments, streaming_segments, qe_scores, streaming_pairs], IMPORT_CONFIG
    )
    rejects = {
        r["utt_id"]: r["reason"]
        for r in data_root.read_parquet(layout.rejects(SHARD, "streaming_segments")).to_pylist()
    }
    assert rejects == {
        "utt_000001": "segmentation_malformed_json",
        "utt_000002": "segmentation_unequal_lengths",
        "utt_000003": "no_segmentation",
    }
    table = data_root.read_parquet(layout.streaming_segments(SHARD))
    assert set(table["utt_id"].to_pylist()) == {"utt_000000", "utt_000004"}

    with data_root.fs.open(data_root.path(layout.streaming_segments_json(SHARD, "utt_000000"))) as handle:
        document = json.loads(handle.read())
    assert document["original_text"] == texts["utt_000000"] == "The quick brown fox jumps over the lazy dog."
    aligned = [r for r in data_root.read_parquet(layout.alignments(SHARD)).to_pylist() if r["utt_id"] == "utt_000000"]
    chunks = document["chunks_low_latency"]
    # Both "the"s land on their own occurrence, with the TextGrid's times.
    assert [(c["start"], c["end"]) for c in chunks] == [(r["start_ms"] / 1000, r["end_ms"] / 1000) for r in aligned]
    assert all(c["match"] == "exact" for c in chunks)
    for level in LATENCY_LEVELS:
        assert " ".join(document[f"source_{level}"]) == " ".join(words["utt_000000"])
        assert "".join(document[f"target_{level}"]) == "".join(f"词{i}" for i in range(9))
        assert document[f"emit_s_{level}"] == sorted(document[f"emit_s_{level}"])
    assert document["emit_s_high_latency"] == [int(aligned[-1]["end_ms"] / 1000 - 1e-9)]
    with data_root.fs.open(data_root.path(layout.streaming_segments_json(SHARD, "utt_000004"))) as handle:
        unmatched = [c for c in json.loads(handle.read())["chunks_low_latency"] if c["match"] == "none"]
    assert [(c["chunk"], c["start"], c["end"]) for c in unmatched] == [("um", None, None)]

    [event] = result.asset_materializations_for_node("streaming_segments")
    assert event.metadata["rejects"].value == 3 and event.metadata["dagster/row_count"].value == 2
    assert event.metadata["unmatched_chunk_share_by_level"].value["medium_latency"] == 0.0

    with data_root.fs.open(data_root.path(layout.metricx_output(SHARD))) as handle:
        scored = read_jsonl(handle.read(), "metricx_output.jsonl")
    assert len(scored) == table.num_rows
    assert all(
        0.0 <= r["prediction"] <= 25.0 and {"source", "hypothesis", "utt_id", "latency"} <= set(r) for r in scored
    )
    with data_root.fs.open(data_root.path(layout.metricx_input(SHARD))) as handle:
        assert [{k: v for k, v in r.items() if k != "prediction"} for r in scored] == read_jsonl(handle.read(), "in")

    threshold = statistics.median(r["prediction"] for r in scored)
    pairs_config = {"ops": {"streaming_pairs": {"config": {"threshold": threshold}}}}
    result = run(instance, resources, SHARD, [streaming_pairs], pairs_config)
    pairs = data_root.read_parquet(layout.streaming_pairs(SHARD)).to_pylist()
    assert sorted(p["prediction"] for p in pairs) == sorted(
        r["prediction"] for r in scored if r["prediction"] <= threshold
    )
    with data_root.fs.open(data_root.path(layout.streaming_pairs_jsonl(SHARD))) as handle:
        assert read_jsonl(handle.read(), "pairs.jsonl") == pairs
    [event] = result.asset_materializations_for_node("streaming_pairs")
    assert 0 < event.metadata["kept_share"].value < 1 or len({r["prediction"] for r in scored}) == 1
    assert set(event.metadata["kept_share_by_level"].value) == set(LATENCY_LEVELS)

    # Re-run with an allowed-ids filter: the others become rejects and their JSONs are gone.
    config = {"ops": {"streaming_segments": {"config": {"allowed_ids": ["utt_000004"]}}}}
    run(instance, resources, SHARD, [streaming_segments], config)
    rejects = data_root.read_parquet(layout.rejects(SHARD, "streaming_segments")).to_pylist()
    assert sorted(r["utt_id"] for r in rejects if r["reason"] == "not_in_allowed_ids") == [
        "utt_000000",
        "utt_000001",
        "utt_000002",
        "utt_000003",
    ]
    assert not data_root.exists(layout.streaming_segments_json(SHARD, "utt_000000"))
    assert data_root.exists(layout.streaming_segments_json(SHARD, "utt_000004"))


def test_segments_read_nemo_alignments_from_the_alignments_table(instance, data_root, resources, clips):
    from tests.conftest import encode, land_shard

    english = [c for c in clips if c.language == "en"][:2]
    rows = [{"utt_id": c.utt_id, "audio_path": f"{c.utt_id}.wav", "text": c.text, "language": "en"} for c in english]
    land_shard(data_root, "nemo-1", rows, {f"{c.utt_id}.wav": encode(c.samples, c.sample_rate) for c in english})
    for clip in english:
        words = clip.text.split()
        data_root.write_bytes(
            f"{layout.landing_segmentation_dir('nemo-1')}/{clip.utt_id}.json",
            json.dumps(segmentation(words), ensure_ascii=False).encode(),
        )
    run(instance, resources, "nemo-1", [raw_shards, normalized_audio, alignments, streaming_segments])
    table = data_root.read_parquet(layout.alignments("nemo-1")).to_pylist()
    for clip in english:
        with data_root.fs.open(data_root.path(layout.streaming_segments_json("nemo-1", clip.utt_id))) as handle:
            document = json.loads(handle.read())
        word_rows = [r for r in table if r["utt_id"] == clip.utt_id and r["level"] == "word"]
        spans = [(r["start_ms"] / 1000, r["end_ms"] / 1000) for r in word_rows]
        assert [(c["start"], c["end"]) for c in document["chunks_low_latency"]] == spans
        assert document["chunks_high_latency"][0]["end"] == spans[-1][1]
    assert data_root.read_parquet(layout.rejects("nemo-1", "streaming_segments")).num_rows == 0


def test_a_qe_step_over_two_shards_scores_the_second_from_segments_read_ahead_and_says_so(
    instance, resources, data_root
):
    from speechdata.translation.stage import SEGMENTS_SCHEMA

    for shard_id in ("q1", "q2"):
        row = {
            "utt_id": f"{shard_id}-u0",
            "latency": "low_latency",
            "segment_index": 0,
            "emit_ms": 1000,
            "source": "good morning everyone",
            "target": "大家早上好",
            "first_chunk": 0,
            "last_chunk": 0,
            "n_unmatched_chunks": 0,
        }
        data_root.write_parquet(
            layout.streaming_segments(shard_id), pa.Table.from_pylist([row], schema=SEGMENTS_SCHEMA)
        )
        instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
    result = dg.materialize(
        [qe_scores],
        instance=instance,
        resources=resources,
        tags={"dagster/asset_partition_range_start": "q1", "dagster/asset_partition_range_end": "q2"},
    )
    assert_second_shard_read_ahead(result, "qe_scores", ("q1", "q2"))
