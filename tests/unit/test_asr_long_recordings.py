"""A recording longer than one training sample reaches the ASR product as its aligned segments: one FLAC
and one manifest row per segment, cut by seeking in the landed file (the whole-decode budget is lowered
below the recording, so decoding it whole would fail), read back by the training dataset and NeMo's own
manifest rule; an unaligned one past the budget is a recorded reject; the ledger balances; a re-run
writes the same bytes."""

import hashlib
import json
import posixpath

import numpy as np
import polars as pl
import pytest
import soundfile as sf

from speechdata.accounting.ledgers import shard_ledgers
from speechdata.accounting.rejects import Reject
from speechdata.asr.dataset import AsrManifestDataset
from speechdata.asr.flac import ASR_SAMPLE_RATE, _recordings_without_segments, pcm16, run_asr_flac
from speechdata.asr.manifest import AsrManifestConfig, apply_language_corrections
from speechdata.asr.stage import build_and_write_asr_manifests, read_published_build
from speechdata.audio import budget
from speechdata.audio.codec import read_segment_from, resample
from speechdata.audio.dc_offset import remove_dc_offset
from speechdata.bridge.segments import segment_key, segment_spans
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.long_recordings import land_long_recording_shard

SHARD = "talks"
CONFIG = AsrManifestConfig(min_duration_s=0.5, max_duration_s=30.0, validation_share=0.0)


def build(data_root: DataRoot) -> None:
    run_asr_flac(data_root, SHARD)
    build_and_write_asr_manifests(data_root, CONFIG, combined=True)


def outputs(data_root: DataRoot) -> dict[str, str]:
    paths = data_root.fs.find(data_root.path(layout.ASR)) + [
        data_root.path(layout.asr_flac_index(SHARD)),
        data_root.path(layout.rejects(SHARD, "asr_flac")),
    ]
    return {p[len(data_root.root) + 1 :]: hashlib.sha256(data_root.fs.cat_file(p)).hexdigest() for p in paths}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    data_root = DataRoot(str(tmp_path_factory.mktemp("asr-long")))
    words = land_long_recording_shard(data_root, SHARD)
    run_raw_shards(data_root, SHARD)
    with pytest.MonkeyPatch.context() as patch:
        # 150 s talk, 90 s lecture: neither may be decoded whole; a 30 s segment may.
        patch.setattr(budget, "MAX_UTTERANCE_SECONDS", 60.0)
        build(data_root)
        first = outputs(data_root)
        build(data_root)
        assert outputs(data_root) == first  # a re-run writes the same bytes
    return data_root, words


def test_each_aligned_segment_is_one_flac_cut_from_the_landed_file(published):
    data_root, words = published
    spans = segment_spans(data_root, SHARD)["talk"]
    assert len(spans) >= 5  # 150 s cut into segments of at most 30 s
    index = {r["utt_id"]: r for r in data_root.read_parquet(layout.asr_flac_index(SHARD)).to_pylist()}
    assert "talk" not in index and "lecture" not in index
    assert {"clip00", "clip01"} <= set(index) and index["clip00"]["text"] is None
    with sf.SoundFile(data_root.path(f"{layout.landing_audio_dir(SHARD)}/talk.flac")) as sound:
        for position, text, start_ms, end_ms in spans:
            row = index[segment_key("talk", position)]
            assert row["text"] == text
            with data_root.fs.open(data_root.path(row["flac_path"]), "rb") as handle:
                pcm, rate = sf.read(handle, dtype="int16")
            assert rate == ASR_SAMPLE_RATE and row["n_samples"] == pcm.shape[0]
            assert row["duration_s"] == pytest.approx((end_ms - start_ms) / 1000, abs=2e-3)
            # The same samples cut straight from the landed file: the offset is the segment's.
            source = remove_dc_offset(read_segment_from(sound, start_ms / 1000, end_ms / 1000)[:, 0], sound.samplerate)
            expected = resample(source, sound.samplerate, ASR_SAMPLE_RATE, "soxr")
            np.testing.assert_array_equal(pcm, pcm16(expected))
    assert " ".join(index[segment_key("talk", p)]["text"] for p, *_ in spans) == " ".join(w.text for w in words["talk"])


def test_the_manifest_has_one_row_per_segment_with_its_words_and_reads_back(published):
    data_root, _ = published
    built = read_published_build(data_root)
    rows = {r["utt_id"]: r for split in ("train", "validation") for r in getattr(built, split).to_dicts()}
    spans = segment_spans(data_root, SHARD)["talk"]
    segments = [segment_key("talk", p) for p, *_ in spans]
    assert set(rows) == {*segments, "clip00", "clip01"}
    for key, (_, text, start_ms, end_ms) in zip(segments, spans, strict=True):
        assert rows[key]["text"] == f"<|en|> {text}"
        assert rows[key]["recording_id"] == "rec-talk"
        assert 0.5 <= rows[key]["duration"] <= 30.0
    # The recording is replaced by its segments: it is no input row of its own, nor a removed one.
    removed = built.removed.to_dicts()
    assert [(r["utt_id"], r["reason"]) for r in removed] == [("lecture", "no_flac")]  # the asr_flac reject
    assert built.train.height + built.validation.height + built.removed.height == len(segments) + 3
    dataset = AsrManifestDataset(data_root.path(layout.asr_manifest("train")), tokenizer=lambda text: [1, 2])
    for position in range(len(dataset)):
        item = dataset[position]
        assert item["signal"].shape[0] == pytest.approx(item["duration"] * ASR_SAMPLE_RATE, abs=1)


def test_every_jsonl_line_names_a_segment_file_from_its_own_directory(published):
    data_root, _ = published
    lines = 0
    for split in ("train", "validation"):
        path = data_root.path(layout.asr_manifest(split, "jsonl"))
        for line in data_root.fs.cat_file(path).decode().splitlines():
            item = json.loads(line)
            # NeMo's rule: a relative audio_filepath is taken from the manifest's own directory.
            assert data_root.fs.exists(posixpath.join(posixpath.dirname(path), item["audio_filepath"]))
            assert item["duration"] <= 30.0
            lines += 1
    built = read_published_build(data_root)
    assert lines == built.train.height + built.validation.height


def test_an_unaligned_recording_past_the_budget_is_rejected_and_the_ledger_balances(published):
    data_root, _ = published
    rejects = data_root.read_parquet(layout.rejects(SHARD, "asr_flac")).to_pylist()
    assert [(r["utt_id"], r["reason"]) for r in rejects] == [("lecture", budget.OVER_BUDGET_REASON)]
    detail = rejects[0]["detail"]
    assert detail.startswith("lecture.flac: the segment: 90.0 s of audio, over the") and "of 60 s" in detail
    assert detail.endswith("not aligned: no segments to publish it as")
    ledger = shard_ledgers(data_root, SHARD)["asr"]
    assert ledger.balanced and (ledger.landed, ledger.produced, ledger.rejected) == (4, 3, 1)


def test_a_recording_the_quality_policy_finds_only_too_long_is_segmented_any_other_reason_rejects_it(tmp_path):
    data_root = DataRoot(str(tmp_path))
    land_long_recording_shard(data_root, SHARD, seconds=70.0, short_utterances=0)
    run_raw_shards(data_root, SHARD)
    length_only = {"talk": ("too_long", "70.0 s > 30.0 s"), "lecture": ("too_long", "90.0 s > 30.0 s")}
    summary = run_asr_flac(data_root, SHARD, excluded=length_only)
    assert summary.rows_out == 1 and summary.segments >= 3
    assert [(r.utt_id, r.reason) for r in summary.rejects] == [("lecture", "too_long")]  # no segments to publish
    noisy = {"talk": ("too_long", "70.0 s > 30.0 s (also low_snr: 3.0 dB < 10.0 dB)")}
    summary = run_asr_flac(data_root, SHARD, excluded=noisy)
    assert summary.rows_out == 1 and summary.segments == 0  # the lecture, whole: within the budget
    assert [(r.utt_id, r.reason) for r in summary.rejects] == [("talk", "too_long")]


def test_a_language_correction_of_the_recording_relabels_its_segments():
    rows = pl.DataFrame(
        {
            "shard_id": ["s", "s", "s"],
            "utt_id": ["talk+0000", "talk+0001", "talk_2"],
            "language": ["en", "en", "en"],
            "recording_id": [None, None, None],
        },
        schema_overrides={"recording_id": pl.String},
    )
    corrections = pl.DataFrame({"utt_id": ["talk"], "language": ["de"]})
    corrected = apply_language_corrections(rows, corrections)
    assert corrected.columns == [*rows.columns, "original_language"]
    assert corrected.select("utt_id", "language").rows() == [("talk+0000", "de"), ("talk+0001", "de"), ("talk_2", "en")]


def test_a_recording_none_of_whose_segments_was_cut_is_rejected_under_its_own_id():
    failed = [
        Reject("talk+0000", "asr_flac", "audio_decode_failed", "talk.flac: bad frame"),
        Reject("talk+0001", "asr_flac", "audio_decode_failed", "talk.flac: bad frame"),
        Reject("lecture+0003", "asr_flac", "audio_empty", "lecture.flac: no samples decoded"),
    ]
    rejects = _recordings_without_segments(list(failed), written={"lecture+0000", "clip00"})
    assert rejects[:3] == failed  # each segment stays a reject of its own key
    [talk] = rejects[3:]
    assert (talk.utt_id, talk.reason) == ("talk", "audio_decode_failed") and "no segment of 2 cut" in talk.detail
