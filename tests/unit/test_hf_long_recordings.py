"""A long recording reaches the Hugging Face dataset as its aligned segments: one row per segment (its
audio cut by seeking in the landed file, under a whole-decode budget lowered below the recording),
every segment in the recording's split, read back with `datasets.load_dataset`; the ledger balances,
a recording none of whose segments passes is accounted for, and a refresh with nothing new writes
nothing."""

import functools
import hashlib
import io

import datasets
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import soundfile as sf

from speechdata.accounting.ledgers import shard_ledgers
from speechdata.audio import budget
from speechdata.bridge.segments import segment_key, segment_spans, utterance_of_key
from speechdata.hf import segment_writer
from speechdata.hf.country_build import refresh_country
from speechdata.hf.dataset import DatasetOptions
from speechdata.hf.filters import SegmentLimits, filter_reasons
from speechdata.hf.segments import published_shard_index, shard_country_segments
from speechdata.hf.splits import SplitTargets
from speechdata.io import layout
from speechdata.io.storage import DataRoot
from speechdata.landing.ingest import run_raw_shards
from speechdata.testing.long_recordings import land_long_recording_shard

SHARD = "de-talks"
DATASET = "long"
RATE = 16_000
OPTIONS = DatasetOptions(
    dataset=DATASET,
    limits=SegmentLimits(min_duration_s=1.0, max_duration_s=30.0, min_asr_confidence=None),
    sample_rate=RATE,
)


def dataset_files(data_root: DataRoot) -> dict[str, str]:
    paths = data_root.fs.find(data_root.path(layout.hf_dataset_dir(DATASET)))
    return {p: hashlib.sha256(data_root.fs.cat_file(p)).hexdigest() for p in paths}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    data_root = DataRoot(str(tmp_path_factory.mktemp("hf-long")))
    words = land_long_recording_shard(
        data_root, SHARD, country="de", language="de", aligned_json=True, short_utterances=3
    )
    run_raw_shards(data_root, SHARD)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(budget, "MAX_UTTERANCE_SECONDS", 60.0)  # the 150 s talk may not be decoded whole
        build = refresh_country(data_root, "de", OPTIONS, SplitTargets(test=0.2, validation=0.2))
        first = dataset_files(data_root)
        refresh_country(data_root, "de", OPTIONS, SplitTargets(test=0.2, validation=0.2))
        assert dataset_files(data_root) == first
    return data_root, words, build


def test_each_segment_is_a_row_with_its_words_audio_and_timings_in_the_recordings_split(published):
    data_root, words, build = published
    assert not build.build.errors
    rows = {key: (split, row) for (split, key), row in published_rows(data_root, DATASET).items()}
    spans = segment_spans(data_root, SHARD)["talk"]
    keys = [segment_key("talk", position) for position, *_ in spans]
    assert set(rows) == {*keys, "clip00", "clip01", "clip02"}  # the 90 s lecture is filtered too_long
    assert len({rows[key][0] for key in keys}) == 1  # one recording, one split
    for key, (_, text, start_ms, end_ms) in zip(keys, spans, strict=True):
        _, row = rows[key]
        assert (row["text"], row["human_transcript"], row["text_source"]) == (text, text, "landed")
        assert row["asr_transcript"] is None and row["cer"] is None and row["wer"] is None
        assert row["start_seconds"] == pytest.approx(start_ms / 1000, abs=1e-3)
        assert row["end_seconds"] == pytest.approx(end_ms / 1000, abs=1e-3)
        samples, rate = sf.read(io.BytesIO(row["audio"]["bytes"]), dtype="float32")
        assert rate == RATE
        assert len(samples) == pytest.approx((end_ms - start_ms) / 1000 * RATE, abs=2)
        # A tone burst lies under each word of the segment: the audio is cut at the segment's offset.
        for word in (w for w in words["talk"] if start_ms <= w.start_ms and w.end_ms <= end_ms):
            first = (word.start_ms - start_ms + 100) * RATE // 1000
            burst = samples[first : first + RATE // 10]
            assert np.sqrt(np.mean(burst**2)) > 0.02, (key, word.text)
    assert " ".join(rows[key][1]["text"] for key in keys) == " ".join(w.text for w in words["talk"])


def test_the_hf_ledger_counts_the_recording_once_and_balances(published):
    data_root, _, _ = published
    ledger = shard_ledgers(data_root, SHARD)["hf"]
    assert ledger.balanced and (ledger.landed, ledger.produced, ledger.rejected) == (5, 4, 1)
    rejects = data_root.read_parquet(layout.rejects(SHARD, "hf_dataset")).to_pylist()
    assert [(r["utt_id"], r["reason"]) for r in rejects] == [("lecture", "too_long")]


def test_a_recording_whose_every_segment_is_filtered_is_rejected_under_its_own_id(published, tmp_path):
    data_root, _, _ = published
    strict = DatasetOptions(dataset="strict", limits=SegmentLimits(min_duration_s=1.0, max_duration_s=2.0))
    refresh_country(data_root, "de", strict)
    rejects = data_root.read_parquet(layout.rejects(SHARD, "hf_dataset")).to_pylist()
    talk = [r for r in rejects if utterance_of_key(r["utt_id"]) == "talk"]
    assert {r["reason"] for r in talk} == {"too_long"}
    assert [r["utt_id"] for r in talk if "+" not in r["utt_id"]] == ["talk"]
    assert len(talk) == len(segment_spans(data_root, SHARD)["talk"]) + 1


def test_every_segment_of_a_recording_the_near_duplicate_stage_rejected_is_filtered(published):
    data_root, _, _ = published
    segments = shard_country_segments(data_root, SHARD, "de")
    reasons = dict(zip(segments["key"].to_pylist(), filter_reasons(segments, OPTIONS.limits, {(SHARD, "talk")})))
    talk = {key: reason for key, reason in reasons.items() if utterance_of_key(key) == "talk"}
    assert len(talk) >= 5 and set(talk.values()) == {"near_duplicate"}
    assert reasons["clip00"] is None


def test_a_recording_past_the_row_group_budget_is_written_in_bounded_row_groups_with_the_same_rows(
    published, monkeypatch
):
    data_root, _, build = published
    talk_payload = build.build.max_recording_buffer_bytes  # the talk's rows, held whole within the budget
    budget_bytes = talk_payload // 3
    monkeypatch.setattr(budget, "MAX_UTTERANCE_SECONDS", 60.0)
    monkeypatch.setattr(segment_writer, "ROWS_PER_BATCH", 2)
    monkeypatch.setattr(segment_writer, "ROW_GROUP_BYTES", budget_bytes)
    # The same shard into a second dataset of the same root (each dataset has its own files and state).
    bounded_options = DatasetOptions(dataset="bounded", limits=OPTIONS.limits, sample_rate=RATE)
    batched = refresh_country(data_root, "de", bounded_options, SplitTargets(test=0.2, validation=0.2)).build
    assert not batched.errors
    sizes = talk_audio_sizes(data_root, DATASET)
    largest_batch = max(sum(sizes[i : i + 2]) for i in range(0, len(sizes), 2)) * 1.1  # text too
    # Memory held at most the budget (plus the batch that passed it), not the talk's rows.
    assert batched.max_recording_buffer_bytes <= budget_bytes + largest_batch < talk_payload
    whole, bounded = parquet_files(data_root, DATASET), parquet_files(data_root, "bounded")
    (whole_talk,) = (path for path in whole.values() if holds_talk(path))
    (bounded_talk,) = (path for path in bounded.values() if holds_talk(path))
    assert pq.ParquetFile(whole_talk).metadata.num_row_groups == 1  # within the budget: one row group, as ever
    # The files without the talk are the same bytes (their names end in their content's digest).
    assert set(whole) - set(bounded) == {whole_talk.rsplit("/", 1)[-1]}
    metadata = pq.ParquetFile(bounded_talk).metadata
    assert metadata.num_row_groups >= 3
    table = pq.read_table(bounded_talk)
    offset = 0
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        audio = sum(len(a["bytes"]) for a in table["audio"].slice(offset, rows).to_pylist())
        assert audio <= budget_bytes or rows <= 2  # within the budget, or one batch that alone passes it
        offset += rows
    # The `datasets` reader reads the same rows, audio bytes included, in the same splits.
    assert published_rows(data_root, "bounded") == published_rows(data_root, DATASET)


def test_the_segment_rows_of_a_long_recording_do_not_each_carry_its_landed_json(published):
    data_root, _, _ = published
    landed = data_root.read_parquet(layout.utterance_index(SHARD))
    talk_json = len(landed.filter(pc.equal(landed["utt_id"], "talk"))["extra"][0].as_py())
    index = published_shard_index(data_root, SHARD)
    talk_rows = sum(1 for key in index["utt_id"].to_pylist() if utterance_of_key(key) == "talk")
    assert talk_rows >= 5
    # The JSON (a 2-hour recording's holds its whole transcript twice) is unpacked, then dropped: kept,
    # each segment row copied it (401 segments of a 2-hour recording: ~80 MB).
    assert "extra" not in index.column_names
    assert index.nbytes < landed.nbytes + talk_rows * talk_json / 2


def parquet_files(data_root: DataRoot, dataset: str) -> dict[str, str]:
    """``{file name: path}`` of the dataset's parquet files."""
    paths = data_root.fs.find(data_root.path(layout.hf_dataset_dir(dataset)))
    return {p.rsplit("/", 1)[-1]: p for p in paths if p.endswith(".parquet")}


def holds_talk(path: str) -> bool:
    keys = pq.read_table(path, columns=["key"])["key"]
    return pc.any(pc.starts_with(keys, "talk+")).as_py()


def talk_audio_sizes(data_root: DataRoot, dataset: str) -> list[int]:
    """The talk's segments' FLAC sizes, in the order they are cut."""
    table = next(pq.read_table(p) for p in parquet_files(data_root, dataset).values() if holds_talk(p))
    return [len(a["bytes"]) for a in table["audio"].to_pylist()]


@functools.cache
def published_rows(data_root: DataRoot, dataset: str) -> dict:
    """``{(split, key): row}`` of the dataset as `datasets.load_dataset` reads it (read once per dataset)."""
    splits = datasets.load_dataset(data_root.path(layout.hf_dataset_dir(dataset)), "de")
    return {
        (split, row["key"]): row
        for split, table in splits.items()
        # The FLAC bytes as stored (decoding through `datasets` costs seconds a row).
        for row in table.cast_column("audio", datasets.Audio(decode=False))
    }
