"""alignments and frame_grids materialized in process with the tiny NeMo model and tokenizer."""

import dagster as dg
import numpy as np
import pytest

from assets.alignment import alignments, frame_grids
from assets.ingest import normalized_audio, raw_shards
from assets.partitions import shard_partitions
from speechdata.alignment.formats import read_ctm
from speechdata.bridge.frame_grid import n_frames_for
from speechdata.bridge.text_tokens import tiny_tokenizer, tokenize_with_offsets
from speechdata.io import layout
from speechdata.testing.shards import build_sample_shard
from tests.conftest import assert_second_shard_read_ahead, land_shard

ASSETS = [raw_shards, normalized_audio, alignments, frame_grids]


@pytest.fixture
def instance():
    with dg.instance_for_test() as instance:
        yield instance


def run(instance, resources, shard_id, run_config=None):
    instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
    return dg.materialize(ASSETS, partition_key=shard_id, instance=instance, resources=resources, run_config=run_config)


def test_sample_shard_is_aligned_and_gridded_and_every_utterance_accounted(instance, data_root, tiny_resources):
    landed = build_sample_shard(data_root, "s1", 8, seed=1, long_recordings=1)
    result = run(instance, tiny_resources, "s1")
    assert result.success
    checks = {
        e.check_name: e.passed for e in result.get_asset_check_evaluations() if e.asset_key.path == ["frame_grids"]
    }
    assert checks == dict.fromkeys(
        ["frames_accounted", "grid_monotone", "frame_count_matches_audio", "token_count_matches_tokenizer"], True
    )

    spanish = {u for u, lang in zip(landed["utt_id"].to_pylist(), landed["language"].to_pylist()) if lang == "es"}
    rejects = data_root.read_parquet(layout.rejects("s1", "alignments")).to_pylist()
    assert {r["utt_id"] for r in rejects} == spanish and spanish
    assert {r["reason"] for r in rejects} == {"no_aligner_for_language"}

    grids = data_root.read_parquet(layout.frame_grids("s1")).to_pylist()
    texts = dict(zip(landed["utt_id"].to_pylist(), landed["text"].to_pylist()))
    assert {g["utt_id"] for g in grids} | spanish == set(texts)
    audio = data_root.read_parquet(layout.normalized_audio("s1"), columns=["utt_id", "n_samples"]).to_pylist()
    n_samples = {a["utt_id"]: a["n_samples"] for a in audio}
    for row in grids:
        assert row["n_frames"] == n_frames_for(n_samples[row["utt_id"]]) == len(row["grid"])
        assert row["tokens"] == tokenize_with_offsets(tiny_tokenizer(), texts[row["utt_id"]]).ids
        assert sum(row["dur"]) + row["grid"].count(-1) == row["n_frames"]

    table = data_root.read_parquet(layout.alignments("s1"))
    some_utt = grids[0]["utt_id"]
    with data_root.fs.open(data_root.path(layout.ctm("s1", "words", some_utt))) as handle:
        ctm_words = read_ctm(handle.read().decode(), "ctm", "word")[some_utt]
    table_words = [r for r in table.to_pylist() if r["utt_id"] == some_utt and r["level"] == "word"]
    assert [w.text for w in ctm_words] == [r["text"] for r in table_words if r["end_ms"] > r["start_ms"] or r["text"]]
    scores = data_root.read_parquet(layout.alignment_scores("s1")).to_pylist()
    assert all(s["score"] < 0 and s["aligner"] == "tiny" for s in scores)

    [grid_event] = result.asset_materializations_for_node("frame_grids")
    assert 0 <= grid_event.metadata["zero_duration_token_share"].value <= 1
    assert "```" in grid_event.metadata["preview"].value


def test_unexpressible_text_is_rejected_and_empty_text_gets_a_pseudo_label(instance, data_root, tiny_resources):
    from tests.conftest import encode, tone

    rows = [
        {"utt_id": "empty", "audio_path": "a.wav", "text": "", "language": "en"},
        {"utt_id": "missing", "audio_path": "a.wav", "text": None, "language": "en"},
        # Letters uroman leaves as they are, none of them in the vocabulary.
        {"utt_id": "nothing", "audio_path": "a.wav", "text": "\u0298\u0298", "language": "en"},
        {"utt_id": "fine", "audio_path": "a.wav", "text": "the fox", "language": "en"},
    ]
    land_shard(data_root, "s2", rows, {"a.wav": encode(tone(2.0, 16_000), 16_000)})
    assert run(instance, tiny_resources, "s2").success
    rejects = {r["utt_id"]: r["reason"] for r in data_root.read_parquet(layout.rejects("s2", "alignments")).to_pylist()}
    assert rejects == {"nothing": "text_not_in_vocabulary"}
    scores = {s["utt_id"]: s for s in data_root.read_parquet(layout.alignment_scores("s2")).to_pylist()}
    assert set(scores) == {"empty", "missing", "fine"}
    assert scores["fine"]["text_source"] == "landed" and scores["fine"]["asr_text"] is None
    words = {}
    for row in data_root.read_parquet(layout.alignments("s2")).to_pylist():
        if row["level"] == "word":
            words.setdefault(row["utt_id"], []).append(row["text"])
    for utt_id in ("empty", "missing"):
        label = scores[utt_id]
        # The tiny model's words are gibberish; what it heard is what was aligned, word for word.
        assert label["text_source"] == "asr" and label["asr_text"]
        assert words[utt_id] == label["asr_text"].split()
        assert len(label["asr_word_confidences"]) == len(words[utt_id])
        assert 0 < label["asr_confidence"] <= 1 and all(0 < c <= 1 for c in label["asr_word_confidences"])
    grids = data_root.read_parquet(layout.frame_grids("s2"))
    assert sorted(grids["utt_id"].to_pylist()) == ["empty", "fine", "missing"]


WRITTEN = {
    "numbers": ("In 1984 we paid $25, (50%) & more.", "en"),
    "german": ("Am 12.05.2024 zahlten wir 25€.", "de"),
    "cyrillic": ("Привет, Москва!", "ru"),
    "greek": ("Καλημέρα, Αθήνα.", "el"),
}


def test_every_written_word_gets_a_timing_in_the_table_and_the_ctm(instance, data_root, tiny_resources):
    from tests.conftest import encode, tone

    rows = [
        {"utt_id": utt_id, "audio_path": "a.wav", "text": text, "language": language}
        for utt_id, (text, language) in WRITTEN.items()
    ]
    land_shard(data_root, "s5", rows, {"a.wav": encode(tone(6.0, 16_000), 16_000)})
    # The tiny model stands in for a Russian and a Greek model: romanized text is in its alphabet.
    fields = tiny_resources["aligner"].model_dump()
    aligner = type(tiny_resources["aligner"])(**{**fields, "models": {**fields["models"], "ru": "tiny", "el": "tiny"}})
    assert run(instance, {**tiny_resources, "aligner": aligner}, "s5").success
    words: dict[str, list[dict]] = {}
    for row in data_root.read_parquet(layout.alignments("s5")).to_pylist():
        if row["level"] == "word":
            words.setdefault(row["utt_id"], []).append(row)
    assert set(words) == set(WRITTEN)
    for utt_id, (text, _) in WRITTEN.items():
        assert [w["text"] for w in words[utt_id]] == text.split()  # the original words, punctuation as written
        assert all(w["end_ms"] > w["start_ms"] for w in words[utt_id]), utt_id
        with data_root.fs.open(data_root.path(layout.ctm("s5", "words", utt_id))) as handle:
            ctm_words = read_ctm(handle.read().decode(), "ctm", "word")[utt_id]
        assert [w.text for w in ctm_words] == text.split()


def test_a_two_minute_utterance_is_aligned_in_windows(instance, data_root, tiny_resources, clips):
    english = [c for c in clips if c.language == "en"]
    rate = english[0].sample_rate
    pieces, words = [], []
    while sum(p.shape[0] for p in pieces) < 125 * rate:
        for clip in english:
            pieces += [clip.samples, np.zeros(rate // 2, np.float32)]
            words.append(clip.text)
    from tests.conftest import encode

    rows = [{"utt_id": "long", "audio_path": "long.flac", "text": " ".join(words), "language": "en"}]
    land_shard(data_root, "s3", rows, {"long.flac": encode(np.concatenate(pieces), rate, "FLAC")})
    resources = {**tiny_resources, "aligner": tiny_resources["aligner"].model_copy(update={"max_window_s": 20.0})}
    assert run(instance, resources, "s3").success
    scores = data_root.read_parquet(layout.alignment_scores("s3")).to_pylist()
    assert [s["utt_id"] for s in scores] == ["long"] and scores[0]["n_frames"] > 125 / 0.08 - 2
    table = data_root.read_parquet(layout.alignments("s3")).to_pylist()
    word_rows = [r for r in table if r["level"] == "word"]
    assert len(word_rows) == len(" ".join(words).split())
    assert word_rows[-1]["end_ms"] > 120_000
    assert all(a["end_ms"] <= b["start_ms"] for a, b in zip(word_rows, word_rows[1:]))


def test_import_mode_reads_landed_ctm_and_textgrid_files(instance, data_root, tiny_resources):
    from tests.conftest import encode, tone

    rows = [
        {"utt_id": "by_ctm", "audio_path": "a.wav", "text": "Hello, world!", "language": "en"},
        {"utt_id": "by_grid", "audio_path": "a.wav", "text": "good morning", "language": "en"},
        {"utt_id": "missing", "audio_path": "a.wav", "text": "no file", "language": "en"},
        {"utt_id": "broken", "audio_path": "a.wav", "text": "bad file", "language": "en"},
    ]
    land_shard(data_root, "s4", rows, {"a.wav": encode(tone(2.0, 16_000), 16_000)})
    directory = layout.landing_alignments_dir("s4")
    data_root.write_bytes(
        f"{directory}/by_ctm.ctm", b"by_ctm 1 0.12 0.40 hello NA lex NA\nby_ctm 1 0.60 0.55 world NA lex NA\n"
    )
    data_root.write_bytes(f"{directory}/by_grid.TextGrid", TEXTGRID.encode())
    data_root.write_bytes(f"{directory}/broken.ctm", b"broken 1 0.1\n")
    config = {"ops": {"alignments": {"config": {"source": "import"}}}}
    assert run(instance, tiny_resources, "s4", run_config=config).success
    table = data_root.read_parquet(layout.alignments("s4")).to_pylist()
    words = {(r["utt_id"], r["text"]): (r["start_ms"], r["end_ms"]) for r in table if r["level"] == "word"}
    assert words == {
        ("by_ctm", "Hello,"): (120, 520),
        ("by_ctm", "world!"): (600, 1150),
        ("by_grid", "good"): (100, 450),
        ("by_grid", "morning"): (450, 1000),
    }
    rejects = {r["utt_id"]: r for r in data_root.read_parquet(layout.rejects("s4", "alignments")).to_pylist()}
    assert rejects["missing"]["reason"] == "no_imported_alignment"
    assert rejects["broken"]["reason"] == "malformed_alignment_file" and "broken.ctm:1" in rejects["broken"]["detail"]
    assert set(data_root.read_parquet(layout.frame_grids("s4"))["utt_id"].to_pylist()) == {"by_ctm", "by_grid"}


TEXTGRID = """File type = "ooTextFile"
Object class = "TextGrid"

xmin = 0
xmax = 2.0
tiers? <exists>
size = 1
item []:
    item [1]:
        class = "IntervalTier"
        name = "words"
        xmin = 0
        xmax = 2.0
        intervals: size = 4
        intervals [1]:
            xmin = 0
            xmax = 0.1
            text = ""
        intervals [2]:
            xmin = 0.1
            xmax = 0.45
            text = "good"
        intervals [3]:
            xmin = 0.45
            xmax = 1.0
            text = "morning"
        intervals [4]:
            xmin = 1.0
            xmax = 2.0
            text = ""
"""


def test_a_step_over_two_shards_aligns_the_second_from_inputs_read_ahead_and_says_so(
    instance, data_root, tiny_resources
):
    for number, shard_id in enumerate(("r1", "r2"), start=1):
        build_sample_shard(data_root, shard_id, 4, seed=number, long_recordings=0, formats=("wav",))
        instance.add_dynamic_partitions(shard_partitions.name, [shard_id])
    result = dg.materialize(
        [raw_shards, normalized_audio, alignments],
        instance=instance,
        resources=tiny_resources,
        tags={"dagster/asset_partition_range_start": "r1", "dagster/asset_partition_range_end": "r2"},
    )
    assert_second_shard_read_ahead(result, "alignments", ("r1", "r2"))
