"""Utterances landed without text, from one run of the stages on one shard (index, audio, alignment
with a model whose greedy path is known, frame grids, publishing): the alignments stage labels, aligns
or rejects them with the ledger balanced, and the label leaves the platform with its confidence and
``text_source = asr`` in the Hugging Face dataset (read back with ``datasets``), the ASR manifest and
the bridge sample's JSON and shard manifest. The feature matrices the bridge packs beside the text
are zeros of the right shapes: what they hold is not the question here."""

import json
from pathlib import Path

import datasets
import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from speechdata.alignment.log_probs import CTC_FRAME_S, MODEL_SAMPLE_RATE
from speechdata.alignment.stage import CtcAligner, run_alignments
from speechdata.alignment.transcript_units import CharVocabulary
from speechdata.asr.flac import ASR_FLAC_INDEX_SCHEMA
from speechdata.asr.manifest import build_asr_manifest
from speechdata.asr.stage import read_asr_inputs
from speechdata.bridge.grid_stage import run_frame_grids
from speechdata.bridge.shard_manifest import build_shard_manifest
from speechdata.bridge.tars import iter_bridge_samples, pack_samples
from speechdata.bridge.text_tokens import tiny_tokenizer
from speechdata.features.array_store import write_arrays
from speechdata.hf.assignment import refresh_split_assignments
from speechdata.hf.card import write_dataset_card
from speechdata.hf.dataset import DatasetOptions, build_country_dataset
from speechdata.hf.segments import SegmentLimits, country_input_fingerprints
from speechdata.hf.state import state_connection
from speechdata.importers.aligned_json import LANDING_SCHEMA
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_normalized_audio, run_raw_shards
from tests.conftest import encode, land_shard, tone

SHARD = "de-pseudo"
DATASET = "speech-segments"
HEARD, READ, SILENT = "de_vid0_00500_04500", "de_vid0_05000_09000", "de_vid0_09200_10000"
LIMITS = SegmentLimits(min_asr_confidence=0.7)  # the quality policy's threshold; the known label's is 0.9
VOCABULARY = CharVocabulary(list(" ab"))  # separator 0, a 1, b 2, blank 3
FRAME_SAMPLES = int(CTC_FRAME_S * MODEL_SAMPLE_RATE)
SPOKEN_PATH = [3, 1, 1, 2, 3, 0, 2, 1, 1, 3]  # "ab ba"


def path_log_probs(labels: list[int], num_frames: int, posterior: float) -> np.ndarray:
    labels = (labels + [3] * num_frames)[:num_frames]
    probs = np.full((num_frames, 4), (1 - posterior) / 3)
    probs[np.arange(num_frames), labels] = posterior
    return np.log(probs).astype(np.float32)


def known_aligner() -> CtcAligner:
    """A 'model' that hears "ab ba" (each frame of its path at 0.9) in audio over a second, nothing in shorter."""

    def forward(batch: list[np.ndarray]) -> list[np.ndarray]:
        out = []
        for audio in batch:
            frames = -(-audio.shape[0] // FRAME_SAMPLES)
            out.append(path_log_probs(SPOKEN_PATH if audio.shape[0] > MODEL_SAMPLE_RATE else [], frames, 0.9))
        return out

    return CtcAligner("known-ctc", forward, VOCABULARY, CTC_FRAME_S)


def aligned_json_row(utt_id: str, start_s: float, end_s: float, human_text: str | None) -> dict:
    return {
        "utt_id": utt_id,
        "audio_path": "vid0.wav",
        "text": human_text,
        "language": "de",
        "country": "de",
        "start_s": start_s,
        "end_s": end_s,
        "source": "aligned-json:de/vid0_t0_aligned.json",
        "video_id": "vid0",
        "transcript_id": "t0",
        "human_text": human_text,
        "asr_text": human_text or "ab ab",  # the corpus's own ASR transcript, landed beside the human one
        "cer": 0.0,
        "transcript_start_idx": 0,
        "transcript_end_idx": 5,
    }


@pytest.fixture(scope="module")
def aligned(tmp_path_factory):
    """One aligned-JSON recording: a segment landed without text, one with text, and a blank one too
    short for the model to hear anything in; indexed and aligned. ``(data root, alignment summary)``."""
    data_root = DataRoot(str(tmp_path_factory.mktemp("root")))
    rows = [
        aligned_json_row(HEARD, 0.5, 4.5, None),
        aligned_json_row(READ, 5.0, 9.0, "Ab, ba!"),
        aligned_json_row(SILENT, 9.2, 10.0, "   "),
    ]
    land_shard(data_root, SHARD, rows, {"vid0.wav": encode(tone(10.0, 16_000), 16_000)}, schema=LANDING_SCHEMA)
    run_raw_shards(data_root, SHARD)
    run_normalized_audio(data_root, SHARD)
    # Publishing does not wait for alignment: a refresh before it finds no text for two rows.
    before = refresh_split_assignments(data_root, DATASET, "de", LIMITS), country_input_fingerprints(data_root)
    summary = run_alignments(data_root, SHARD, lambda language: known_aligner(), write_ctm_files=False)
    return data_root, summary, before


@pytest.fixture(scope="module")
def published(aligned) -> DataRoot:
    """The aligned shard published, its frame grids computed and its feature stores filled."""
    data_root, _, _ = aligned
    refresh_split_assignments(data_root, DATASET, "de", LIMITS)
    build_country_dataset(data_root, "de", DatasetOptions(dataset=DATASET, limits=LIMITS))
    write_dataset_card(data_root, DATASET)
    run_frame_grids(data_root, SHARD, tiny_tokenizer())
    grids = data_root.read_parquet(layout.frame_grids(SHARD)).to_pylist()
    write_arrays(
        data_root, layout.qwen_hidden_states(SHARD), [(g["utt_id"], np.zeros((g["n_tokens"], 8))) for g in grids]
    )
    write_arrays(data_root, layout.wavlm_features(SHARD), [(g["utt_id"], np.zeros((g["n_frames"], 8))) for g in grids])
    return data_root


def test_utterances_without_text_are_labelled_aligned_or_rejected_and_the_ledger_balances(aligned):
    data_root, summary, _ = aligned
    rejects = {
        r["utt_id"]: r["reason"] for r in data_root.read_parquet(layout.rejects(SHARD, "alignments")).to_pylist()
    }
    assert rejects == {SILENT: "no_words_recognized"}
    scores = {s["utt_id"]: s for s in data_root.read_parquet(layout.alignment_scores(SHARD)).to_pylist()}
    heard, read = scores[HEARD], scores[READ]
    assert (heard["text_source"], heard["asr_text"]) == ("asr", "ab ba")
    assert heard["asr_confidence"] == pytest.approx(0.9, abs=1e-5)
    assert heard["asr_word_confidences"] == pytest.approx([0.9, 0.9], abs=1e-5)
    assert (read["text_source"], read["asr_text"], read["asr_confidence"]) == ("landed", None, None)
    words = [r for r in data_root.read_parquet(layout.alignments(SHARD)).to_pylist() if r["level"] == "word"]
    assert [(w["utt_id"], w["text"], w["start_ms"], w["end_ms"]) for w in words] == [
        (HEARD, "ab", 80, 320),
        (HEARD, "ba", 480, 720),
        (READ, "Ab,", 80, 320),
        (READ, "ba!", 480, 720),
    ]
    # The quality stage's CER compares the landed text only: a label is not judged against itself.
    hypotheses = data_root.read_parquet(f"shards/{SHARD}/greedy_hypotheses.parquet")["utt_id"].to_pylist()
    assert hypotheses == [READ]
    assert summary.rows_in == 3 == summary.rows_out + len(summary.rejects)


def test_the_hf_dataset_publishes_the_pseudo_label_with_its_source_and_confidence(published):
    splits = datasets.load_dataset(published.path(layout.hf_dataset_dir(DATASET)), "de")
    rows = {row["key"]: row for split in splits.values() for row in split.remove_columns("audio")}
    heard, read = rows[HEARD], rows[READ]
    assert (heard["text"], heard["text_source"]) == ("ab ba", "asr")
    assert heard["asr_confidence"] == pytest.approx(0.9, abs=1e-5)
    assert heard["human_transcript"] is None and heard["wer"] is None
    assert heard["asr_transcript"] == "ab ab"  # the landed ASR transcript stays what it was
    assert (read["text"], read["text_source"], read["asr_confidence"]) == ("Ab, ba!", "landed", None)
    assert read["human_transcript"] == "Ab, ba!" and read["wer"] == 0.0
    assert SILENT not in rows  # blank and too short to hear: no label, no human text
    with state_connection(published, layout.hf_state_database(DATASET, "de")) as db:
        counted = db.execute("SELECT sum(rows), sum(pseudo_labels) FROM files WHERE split IS NOT NULL").fetchall()
    assert counted == [(2, 1)]
    card = Path(published.path(layout.hf_dataset_file(DATASET, "README.md"))).read_text()
    assert "| de | de | train_1 | 2 | 1 |" in card  # rows, then pseudo-labels


def test_a_label_recorded_after_a_refresh_wakes_the_sensor_and_is_published_by_the_next(aligned, published):
    data_root, _, (before, fingerprints_before) = aligned
    assert before.filtered_by_reason == {"missing_human_text": 2}  # HEARD and SILENT: no text yet
    # The alignment scores are part of the shard's stamp: the country's inputs changed.
    assert country_input_fingerprints(data_root)["de"] != fingerprints_before["de"]
    with state_connection(data_root, layout.hf_state_database(DATASET, "de")) as db:
        statuses = dict(db.execute("SELECT key, coalesce(reason, status) FROM segments").fetchall())
    assert statuses == {HEARD: "pending", READ: "pending", SILENT: "missing_human_text"}


def test_a_pseudo_label_under_the_threshold_is_filtered_low_asr_confidence(published, tmp_path):
    state = layout.hf_state_database("strict", "de")
    summary = refresh_split_assignments(published, "strict", "de", SegmentLimits(min_asr_confidence=0.95))
    assert summary.filtered_by_reason == {"low_asr_confidence": 1, "missing_human_text": 1}
    with state_connection(published, state) as db:
        assert db.execute("SELECT key FROM segments WHERE reason = 'low_asr_confidence'").fetchall() == [(HEARD,)]


def test_the_asr_manifest_marks_the_pseudo_label_asr(published):
    flac = [
        {"utt_id": key, "flac_path": f"asr/flac/{SHARD}/{key}.flac", "sample_rate": 16_000, "n_samples": 64_000}
        for key in (HEARD, READ)
    ]
    flac = [{**row, "duration_s": 4.0, "audio_sha1": f"sha-{row['utt_id']}"} for row in flac]
    published.write_parquet(layout.asr_flac_index(SHARD), pa.Table.from_pylist(flac, schema=ASR_FLAC_INDEX_SCHEMA))
    utterances, flac_rows = read_asr_inputs(published, [SHARD])
    build = build_asr_manifest(utterances, flac_rows, audio_root="/")
    rows = {r["utt_id"]: r for r in pl.concat([build.train, build.validation]).to_dicts()}
    assert (rows[HEARD]["text_source"], rows[READ]["text_source"]) == ("asr", "landed")
    assert rows[HEARD]["text"].endswith("ab ba")
    assert rows[HEARD]["asr_confidence"] == pytest.approx(0.9, abs=1e-5) and rows[READ]["asr_confidence"] is None


def test_the_bridge_json_and_shard_manifest_carry_the_pseudo_label(published):
    samples = list(iter_bridge_samples(published, SHARD))
    info = {s.key: json.loads(b"".join(dict(s.members())[f"{s.key}.json"])) for s in samples}
    assert (info[HEARD]["text"], info[HEARD]["text_source"]) == ("ab ba", "asr")
    assert info[HEARD]["asr_confidence"] == pytest.approx(0.9, abs=1e-5)
    assert [w["word"] for w in info[HEARD]["words"]] == ["ab", "ba"]  # aligned to the label
    assert (info[READ]["text_source"], "asr_confidence" in info[READ]) == ("landed", False)
    _, packed = pack_samples(published, SHARD, iter(samples))
    manifest = {r["key"]: r for r in build_shard_manifest(published, SHARD, packed).to_pylist()}
    assert (manifest[HEARD]["text"], manifest[HEARD]["text_source"]) == ("ab ba", "asr")
    assert manifest[HEARD]["asr_confidence"] == pytest.approx(0.9, abs=1e-5)
    assert (manifest[READ]["text_source"], manifest[READ]["asr_confidence"]) == ("landed", None)
