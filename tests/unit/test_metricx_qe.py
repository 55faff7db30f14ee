"""MetricX-24 regression model (tiny profile), MetricX JSONL and the QE threshold filter."""

import pyarrow as pa
import pytest
import torch

from speechdata.translation.metricx import (
    SCORE_MAX,
    SCORE_MIN,
    MetricXScorer,
    MT5ForRegression,
    encode_qe_inputs,
    load_metricx,
    qe_input,
    tiny_metricx_path,
)
from speechdata.translation.qe_stage import (
    filter_by_threshold,
    jsonl_bytes,
    kept_share_by_level,
    metricx_records,
    read_jsonl,
    scored_table,
)
from speechdata.translation.stage import SEGMENTS_SCHEMA

SOURCES = [
    "which sites have you been using",
    "good morning everyone",
    "how did the meeting go today",
    "",
    "we went home",
]
HYPOTHESES = ["你一直在用哪些网站", "大家早上好", "今天的会议怎么样", "", "我们回家了"]


@pytest.fixture(scope="session")
def tiny_metricx(model_cache_dir):
    path = str(tiny_metricx_path(model_cache_dir))
    return load_metricx(path, path, local_files_only=True)


def test_qe_input_is_metricx24_source_then_candidate():
    assert qe_input("Hello.", "你好。") == "source: Hello. candidate: 你好。"


def test_inputs_are_truncated_and_lose_their_final_eos(tiny_metricx):
    _, tokenizer = tiny_metricx
    [full] = tokenizer([qe_input("good morning", "早上好")])["input_ids"]
    assert full[-1] == tokenizer.eos_token_id
    [ids] = encode_qe_inputs(tokenizer, ["good morning"], ["早上好"], 1536)
    assert ids == full[:-1]
    [short] = encode_qe_inputs(tokenizer, ["good morning everyone " * 20], ["早上好"], 10)
    assert len(short) == 9  # truncated to 10 with EOS, then EOS removed


def test_tiny_model_is_the_metricx_class_with_shared_embeddings_and_its_own_score_token(tiny_metricx):
    model, tokenizer = tiny_metricx
    assert type(model) is MT5ForRegression
    assert model.encoder.embed_tokens.weight is model.shared.weight
    assert model.decoder.embed_tokens.weight is model.shared.weight
    assert model.lm_head.weight is not model.shared.weight
    assert model.score_token_id == tokenizer.convert_tokens_to_ids("<extra_id_10>") == len(tokenizer) - 11


def test_predictions_are_the_score_token_logit_clipped_to_0_25(tiny_metricx):
    model, tokenizer = tiny_metricx
    scorer = MetricXScorer(model, tokenizer, torch.device("cpu"))
    original = model.lm_head.weight.data[model.score_token_id].clone()
    try:
        model.lm_head.weight.data[model.score_token_id] = original * 1000
        high = scorer(SOURCES, HYPOTHESES)
        model.lm_head.weight.data[model.score_token_id] = -original * 1000
        low = scorer(SOURCES, HYPOTHESES)
    finally:
        model.lm_head.weight.data[model.score_token_id] = original
    assert all(SCORE_MIN <= s <= SCORE_MAX for s in high + low)
    assert {SCORE_MAX, SCORE_MIN} <= set(high) | set(low)
    # x1000 and its sign flip: the negative side of each pair clips to 0, and a pair that reaches 25
    # on one side is 0 on the other. (A raw logit in (-0.025, 0.025) stays inside the range at x1000;
    # one did in a fresh clone's tiny model, so no single pair is required to reach 25.)
    assert all(min(h, lo) == SCORE_MIN for h, lo in zip(high, low))
    assert all(lo == SCORE_MIN for h, lo in zip(high, low) if h == SCORE_MAX)
    assert all(h == SCORE_MIN for h, lo in zip(high, low) if lo == SCORE_MAX)


def test_batched_scores_equal_one_at_a_time_scores(tiny_metricx):
    model, tokenizer = tiny_metricx
    batched = MetricXScorer(model, tokenizer, torch.device("cpu"), max_batch_tokens=10_000)(SOURCES, HYPOTHESES)
    single = [MetricXScorer(model, tokenizer, torch.device("cpu"))([s], [h])[0] for s, h in zip(SOURCES, HYPOTHESES)]
    assert batched == pytest.approx(single, abs=1e-5)
    assert len(set(round(s, 4) for s in batched)) > 1  # the inputs reach the score
    assert MetricXScorer(model, tokenizer, torch.device("cpu"))([], []) == []


def test_loading_refuses_a_tokenizer_whose_score_token_differs(tiny_metricx, model_cache_dir, tmp_path):
    model, tokenizer = tiny_metricx
    model.config.metricx_score_token_id = 3
    model.save_pretrained(tmp_path / "m")
    model.config.metricx_score_token_id = tokenizer.convert_tokens_to_ids("<extra_id_10>")
    with pytest.raises(ValueError, match="extra_id_10"):
        load_metricx(str(tmp_path / "m"), str(tiny_metricx_path(model_cache_dir)), local_files_only=True)


def segments_table(rows):
    return pa.Table.from_pylist(rows, schema=SEGMENTS_SCHEMA)


def segment(utt, level, k, source, target):
    return {
        "utt_id": utt,
        "latency": level,
        "segment_index": k,
        "emit_ms": 1000 * k,
        "source": source,
        "target": target,
        "first_chunk": k,
        "last_chunk": k,
        "n_unmatched_chunks": 0,
    }


def test_metricx_jsonl_round_trips_with_readable_chinese():
    table = segments_table(
        [
            segment("u1", "low_latency", 0, "which sites", "哪些网站"),
            segment("u1", "high_latency", 0, 'say "hi"\n', "说“嗨”"),
        ]
    )
    records = metricx_records(table)
    assert records[0] == {
        "source": "which sites",
        "hypothesis": "哪些网站",
        "utt_id": "u1",
        "latency": "low_latency",
        "segment_index": 0,
        "emit_ms": 0,
    }
    data = jsonl_bytes(records)
    assert "哪些网站".encode() in data and len(data.decode().splitlines()) == 2
    assert read_jsonl(data, "in.jsonl") == records
    scored = [{**r, "prediction": p} for r, p in zip(records, (1.25, 7.5))]
    assert read_jsonl(jsonl_bytes(scored), "out.jsonl") == scored
    assert scored_table(scored).to_pylist() == [
        {k: r[k] for k in ("utt_id", "latency", "segment_index", "emit_ms", "source", "hypothesis", "prediction")}
        for r in scored
    ]


def test_malformed_jsonl_names_file_and_line():
    with pytest.raises(ValueError, match=r"out\.jsonl:2"):
        read_jsonl(b'{"a": 1}\n{broken\n', "out.jsonl")


def test_threshold_keeps_exactly_the_rows_at_or_below_it():
    predictions = [0.0, 4.999, 5.0, 5.001, 25.0, 3.2, 5.0000001]
    levels = [
        "low_latency",
        "low_latency",
        "medium_latency",
        "medium_latency",
        "high_latency",
        "high_latency",
        "low_latency",
    ]
    records = [
        {
            "utt_id": f"u{i}",
            "latency": lvl,
            "segment_index": 0,
            "emit_ms": 0,
            "source": "s",
            "hypothesis": "h",
            "prediction": p,
        }
        for i, (p, lvl) in enumerate(zip(predictions, levels))
    ]
    scored = scored_table(records)
    kept = filter_by_threshold(scored, 5.0)
    assert (
        kept["utt_id"].to_pylist()
        == [f"u{i}" for i, p in enumerate(predictions) if p <= 5.0]
        == ["u0", "u1", "u2", "u5"]
    )
    assert kept_share_by_level(scored, kept) == {
        "low_latency": pytest.approx(2 / 3),
        "medium_latency": 0.5,
        "high_latency": 0.5,
    }
    assert filter_by_threshold(scored, 0.0)["utt_id"].to_pylist() == ["u0"]
