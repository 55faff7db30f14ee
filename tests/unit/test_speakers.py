"""Speaker embeddings, speaker count and per-shard clusters on the committed espeak-ng readings, and
what the near-duplicate stage and the quality stages make of them on a landed shard."""

import json
from pathlib import Path

import numpy as np
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
from speechdata.quality.speakers import (
    EMBEDDING_SIZE,
    SAME_SPEAKER_MIN_COSINE,
    cluster_embeddings,
    shard_speaker_clusters,
    shipped_speaker_encoder,
    speaker_cosine,
)
from speechdata.quality.stage import run_quality_decisions, run_quality_signals
from speechdata.testing.shards import SAMPLE_METADATA_SCHEMA, _encode, build_sample_shard
from speechdata.vad.silero import load_silero_model

READINGS = Path(__file__).resolve().parents[1] / "fixtures" / "readings"


@pytest.fixture(scope="module")
def readings():
    """``{(sentence, reading): (samples, rate, text)}`` of the committed fixtures."""
    found = {}
    for row in json.loads((READINGS / "readings.json").read_text()):
        samples, rate = sf.read(READINGS / row["file"], dtype="float32")
        found[(row["sentence"], row["reading"])] = (samples, rate, row["text"])
    return found


@pytest.fixture(scope="module")
def evidence(readings):
    encoder = shipped_speaker_encoder()
    return {key: encoder.signals(samples, rate) for key, (samples, rate, _) in readings.items()}


def test_embeddings_are_unit_vectors_that_tell_voices_apart(evidence):
    for signals in evidence.values():
        assert signals.embedding.shape == (EMBEDDING_SIZE,) and signals.embedding.dtype == np.float32
        assert abs(float(np.linalg.norm(signals.embedding)) - 1.0) < 1e-4
        assert signals.speakers == 1 and not signals.overlap
    for sentence in ("s1", "s2", "s3"):
        again = speaker_cosine(evidence[(sentence, "male")].embedding, evidence[(sentence, "male_slow")].embedding)
        assert again >= SAME_SPEAKER_MIN_COSINE
        for other in ("female", "female2"):
            assert speaker_cosine(evidence[(sentence, "male")].embedding, evidence[(sentence, other)].embedding) < (
                SAME_SPEAKER_MIN_COSINE
            )
        assert (
            speaker_cosine(evidence[(sentence, "female")].embedding, evidence[(sentence, "female2")].embedding)
            < SAME_SPEAKER_MIN_COSINE
        )


def test_a_speaker_change_inside_an_utterance_is_counted_and_flagged(readings):
    male, rate, _ = readings[("s1", "male")]
    female, _, _ = readings[("s2", "female")]
    signals = shipped_speaker_encoder().signals(np.concatenate([male, female]), rate)
    assert signals.speakers == 2 and signals.overlap


def test_silence_and_very_short_audio_have_no_embedding():
    encoder = shipped_speaker_encoder()
    assert encoder.signals(np.zeros(32_000, np.float32), 16_000).embedding is None
    assert encoder.signals(np.full(4_000, 0.1, np.float32), 16_000).speakers == 0


def test_shard_clusters_group_each_voice_and_number_them_in_order(evidence):
    keys = sorted(evidence)  # (sentence, reading): s1 female, s1 female2, s1 male, s1 male_slow, s2 ...
    clusters = shard_speaker_clusters([evidence[key].embedding for key in keys] + [None])
    assert clusters[-1] is None
    voice = {"female": "f", "female2": "f2", "male": "m", "male_slow": "m"}
    by_voice: dict[str, set[int]] = {}
    for key, cluster in zip(keys, clusters, strict=False):
        by_voice.setdefault(voice[key[1]], set()).add(cluster)
    assert all(len(found) == 1 for found in by_voice.values()), by_voice
    assert len({next(iter(found)) for found in by_voice.values()}) == 3
    assert clusters[:3] == [0, 1, 2]
    assert cluster_embeddings(np.zeros((0, EMBEDDING_SIZE))).tolist() == []


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
