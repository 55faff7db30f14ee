"""The near-duplicate and quality stages on a landed shard of the committed espeak-ng readings: another
voice's reading of a sentence is kept (flagged), the same voice's second reading is a duplicate, a
product's policy may reject other speakers' readings, and quality.parquet holds each utterance's
speaker columns."""

import json
from pathlib import Path

import pyarrow as pa
import pytest
import soundfile as sf

from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from speechdata.landing.mark import mark_landed
from speechdata.quality.decisions import excluded_utterances
from speechdata.quality.near_dup_flags import flagged_utterances
from speechdata.quality.near_duplicates import run_near_duplicates
from speechdata.quality.paths import quality_signals
from speechdata.quality.policy import default_policies
from speechdata.quality.speakers import EMBEDDING_SIZE, shipped_speaker_encoder
from speechdata.quality.stage import run_quality_decisions, run_quality_signals
from speechdata.testing.shards import SAMPLE_METADATA_SCHEMA, _encode, build_sample_shard
from speechdata.vad.silero import load_silero_model

READINGS = Path(__file__).resolve().parents[1] / "fixtures" / "readings"


@pytest.fixture(scope="module")
def readings():
    found = {}
    for row in json.loads((READINGS / "readings.json").read_text()):
        samples, rate = sf.read(READINGS / row["file"], dtype="float32")
        found[(row["sentence"], row["reading"])] = (samples, rate, row["text"])
    return found


@pytest.fixture(scope="module")
def readings_root(tmp_path_factory, readings):
    """A landed shard: two clean sample utterances, then each sentence read by the male voice, the
    female voice and the male voice again (slower)."""
    root = DataRoot(str(tmp_path_factory.mktemp("readings") / "data"))
    sample = build_sample_shard(root, "r1", 2, seed=3, long_recordings=0, formats=("flac",), complete=False)
    rows = sample.to_pylist()
    for sentence in ("s1", "s2"):
        for order, reading in enumerate(("male", "female", "male_slow")):
            samples, rate, text = readings[(sentence, reading)]
            utt_id = f"read_{sentence}_{order}_{reading}"
            audio_path = f"readings/{utt_id}.flac"
            root.write_bytes(f"{layout.landing_audio_dir('r1')}/{audio_path}", _encode(samples, rate, "flac"))
            rows.append({**rows[0], "utt_id": utt_id, "audio_path": audio_path, "language": "en", "text": text})
    root.write_parquet(layout.landing_metadata("r1"), pa.Table.from_pylist(rows, schema=SAMPLE_METADATA_SCHEMA))
    mark_landed(root, "r1")
    assert not run_raw_shards(root, "r1").rejects
    assert not run_normalized_audio(root, "r1").rejects
    summary = run_near_duplicates(root, "r1")
    run_quality_signals(root, "r1", vad_model=load_silero_model(), speakers=shipped_speaker_encoder())
    return root, summary


def test_another_voice_reading_is_kept_and_the_same_voice_again_is_a_duplicate(readings_root):
    root, summary = readings_root
    duplicates = {d.utt_id: (d.kind, d.representative_utt) for d in summary.duplicates}
    assert duplicates == {f"read_{s}_2_male_slow": ("near_transcript", f"read_{s}_0_male") for s in ("s1", "s2")}, (
        duplicates
    )
    flags = flagged_utterances(root, "r1")
    assert {u: (f["kind"], f["representative_utt"]) for u, f in flags.items()} == {
        f"read_{s}_1_female": ("other_speaker_reading", f"read_{s}_0_male") for s in ("s1", "s2")
    }


def test_a_product_may_reject_other_speakers_readings(readings_root):
    root, _ = readings_root
    policies = default_policies("tiny")
    policies["translation"] = policies["translation"].with_overrides({"reject_other_speaker_readings": 1})
    run_quality_decisions(root, "r1", policies)
    for product in ("asr", "bridge"):
        excluded = excluded_utterances(root, "r1", product)
        assert not {u for u in excluded if "female" in u}, excluded
        assert {u for u, (reason, _) in excluded.items() if reason == "near_duplicate"} >= {
            "read_s1_2_male_slow",
            "read_s2_2_male_slow",
        }
    excluded = excluded_utterances(root, "r1", "translation")
    assert excluded["read_s1_1_female"][0] == "near_duplicate"
    assert "other_speaker_reading of r1/read_s1_0_male" in excluded["read_s1_1_female"][1]


def test_the_quality_file_holds_each_utterances_speaker_columns(readings_root):
    root, _ = readings_root
    table = root.read_parquet(quality_signals("r1")).to_pylist()
    by_utt = {row["utt_id"]: row for row in table}
    for row in table:
        assert len(row["speaker_embedding"]) == EMBEDDING_SIZE and row["speaker_count"] >= 1
        assert row["speaker_cluster"] is not None
    for sentence in ("s1", "s2"):
        male, again, female = (
            by_utt[f"read_{sentence}_{n}"]["speaker_cluster"] for n in ("0_male", "2_male_slow", "1_female")
        )
        assert male == again != female
    assert by_utt["read_s1_0_male"]["speaker_cluster"] == by_utt["read_s2_0_male"]["speaker_cluster"]
